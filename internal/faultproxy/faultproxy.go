// Package faultproxy is a TCP proxy that breaks connections on purpose, for
// tests and the chaos harness: it can cut every connection (a reset),
// stall them (accept every byte and deliver none, the way a blackholed
// network path behaves), leave them half-open (the server's side ended,
// the client's silent but open) and restore traffic.
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
	// blackholed passes no close on either (Blackhole).
	blackholed atomic.Bool
	mu         sync.Mutex
	closed     bool
	pairs      map[*pair]struct{}
}

// pair is one proxied connection: the client's side and the target's.
type pair struct {
	client, server net.Conn
	// stalled stalls this connection only.
	stalled atomic.Bool
	// halfOpen: the server's side is closed and the client's is kept
	// open, swallowing what the client sends and sending it nothing.
	halfOpen atomic.Bool
	// done is closed once both sides are closed.
	done     chan struct{}
	doneOnce sync.Once
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
		pr := &pair{client: c, server: s, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			pr.close()
			return
		}
		p.pairs[pr] = struct{}{}
		p.mu.Unlock()
		go p.pipe(pr, c, s, true)
		go p.pipe(pr, s, c, false)
	}
}

// pipe copies from src to dst while the connection is not stalled or
// half-open, and reads and drops everything while it is. When either side
// ends, both do, except that a half-open connection's client side stays
// open after its server side ended, until the client closes it.
func (p *Proxy) pipe(pr *pair, dst, src net.Conn, toClient bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.stalled.Load() && !pr.stalled.Load() && !pr.halfOpen.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil && !pr.halfOpen.Load() {
				p.end(pr)
				return
			}
		}
		if err != nil {
			if (toClient && pr.halfOpen.Load()) || p.blackholed.Load() {
				// The server's side was closed on purpose, or nothing
				// passes: the other side must not learn of the close.
				return
			}
			p.end(pr)
			return
		}
	}
}

// end closes both sides of pr and forgets it.
func (p *Proxy) end(pr *pair) {
	pr.close()
	p.mu.Lock()
	delete(p.pairs, pr)
	p.mu.Unlock()
}

func (pr *pair) close() {
	_ = pr.client.Close()
	_ = pr.server.Close()
	pr.doneOnce.Do(func() { close(pr.done) })
}

// Stall makes every connection, present and future, swallow its bytes
// until Restore.
func (p *Proxy) Stall() { p.stalled.Store(true) }

// Blackhole stalls every connection, present and future, as Stall does,
// and passes no close on either: a side that closes leaves the other
// open, as behind a network path that drops every packet, its FIN and
// reset included. The server then learns that its client is gone only
// from its own timeouts (idle_in_transaction_session_timeout, TCP
// keepalive). Restore ends it for the connections whose sides are both
// still open; Cut and Close end every connection.
func (p *Proxy) Blackhole() {
	p.blackholed.Store(true)
	p.stalled.Store(true)
}

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

// HalfOpen leaves every open connection half-open: it closes the server's
// side, so the server ends the session (its transaction aborts, its locks
// go), and keeps the client's side open, reading and dropping whatever the
// client sends and sending it nothing, not even a close: the client sees a
// live socket that never answers, as behind a peer that vanished or a
// middlebox that lost the flow. Connections made later pass. It returns how
// many connections it left half-open and a channel closed once the client
// has closed every one of them (or the proxy closed).
func (p *Proxy) HalfOpen() (int, <-chan struct{}) {
	p.mu.Lock()
	var dones []chan struct{}
	for pr := range p.pairs {
		if pr.halfOpen.Swap(true) {
			continue
		}
		_ = pr.server.Close()
		dones = append(dones, pr.done)
	}
	p.mu.Unlock()
	all := make(chan struct{})
	go func() {
		for _, d := range dones {
			<-d
		}
		close(all)
	}()
	return len(dones), all
}

// Restore ends a Stall or a Blackhole: bytes flow again on connections that are not
// stalled for good. Bytes swallowed meanwhile are lost, so a connection
// that carried traffic during the stall is usually broken for its peers.
func (p *Proxy) Restore() {
	p.blackholed.Store(false)
	p.stalled.Store(false)
}

// Cut closes every open connection, half-open ones included, as a reset
// would; new connections pass (unless stalled).
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
