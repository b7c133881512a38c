// Package faultproxy is a TCP proxy that breaks connections on purpose, for
// tests and the chaos harness: it can cut every connection (a reset),
// stall them (accept every byte and deliver none, the way a blackholed
// network path behaves) and restore traffic.
package faultproxy

import (
	"net"
	"sync"
	"sync/atomic"
)

// Proxy forwards the TCP connections it accepts to a target address.
type Proxy struct {
	ln     net.Listener
	target string

	// stalled stalls every connection, new ones included.
	stalled atomic.Bool
	mu      sync.Mutex
	closed  bool
	pairs   map[*pair]struct{}
}

// pair is one proxied connection: the client's side and the target's.
type pair struct {
	client, server net.Conn
	// stalled stalls this connection only.
	stalled atomic.Bool
}

// Listen starts a proxy on a free port of 127.0.0.1 that forwards to
// target (host:port).
func Listen(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, pairs: map[*pair]struct{}{}}
	go p.accept()
	return p, nil
}

// Addr is the proxy's address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		pr := &pair{client: c, server: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			pr.close()
			return
		}
		p.pairs[pr] = struct{}{}
		p.mu.Unlock()
		go p.pipe(pr, s, c)
		go p.pipe(pr, c, s)
	}
}

// pipe copies from src to dst while the connection is not stalled, and
// reads and drops everything while it is. When either side ends, both do.
func (p *Proxy) pipe(pr *pair, dst, src net.Conn) {
	defer p.forget(pr)
	defer pr.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.stalled.Load() && !pr.stalled.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) forget(pr *pair) {
	p.mu.Lock()
	delete(p.pairs, pr)
	p.mu.Unlock()
}

func (pr *pair) close() {
	_ = pr.client.Close()
	_ = pr.server.Close()
}

// Stall makes every connection, present and future, swallow its bytes
// until Restore.
func (p *Proxy) Stall() { p.stalled.Store(true) }

// StallExisting stalls the connections open now for good; connections
// made later pass, as when a middlebox loses the state of its flows.
func (p *Proxy) StallExisting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pr := range p.pairs {
		pr.stalled.Store(true)
	}
	return len(p.pairs)
}

// Restore ends a Stall: bytes flow again on connections that are not
// stalled for good. Bytes swallowed meanwhile are lost, so a connection
// that carried traffic during the stall is usually broken for its peers.
func (p *Proxy) Restore() { p.stalled.Store(false) }

// Cut closes every open connection, as a reset would; new connections
// pass (unless stalled).
func (p *Proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pr := range p.pairs {
		pr.close()
	}
	return len(p.pairs)
}

// Close stops accepting and closes every connection.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.Cut()
}
