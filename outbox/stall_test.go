package outbox

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// stallProxy forwards TCP connections to target until stall is called;
// from then on it accepts every byte and delivers none, the way a
// blackholed network path behaves.
type stallProxy struct {
	ln      net.Listener
	target  string
	stalled atomic.Bool
	mu      sync.Mutex
	conns   []net.Conn
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target}
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *stallProxy) accept() {
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
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go p.pipe(s, c)
		go p.pipe(c, s)
	}
}

// pipe copies from src to dst while the proxy is not stalled, and reads
// and drops everything once it is.
func (p *stallProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.stalled.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_ = dst.Close()
			}
			return
		}
	}
}

func (p *stallProxy) stall() { p.stalled.Store(true) }

func (p *stallProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
}

// A database that stops answering (a stalled socket, not a refused one)
// while outcomes wait to be written: Run still returns within
// GracefulTimeout plus StopSlack, and leaves the rows to lease expiry.
func TestRunReturnsWithinGracefulTimeoutWhenTheDatabaseStalls(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for range 3 {
		e.publish("q")
	}
	u, err := url.Parse(e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newStallProxy(t, u.Host)
	u.Host = proxy.ln.Addr().String()
	pool, err := pgxpool.New(e.ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	// Cut the proxy first: closing a pool whose sockets are stalled waits
	// for each connection's goodbye.
	t.Cleanup(func() { proxy.close(); pool.Close() })
	ob, err := New(pool, &Config{Schema: e.db.Schema})
	if err != nil {
		t.Fatal(err)
	}

	stalled := make(chan struct{})
	var handled atomic.Int32
	cfg := fastConfig[string](nil)
	cfg.GracefulTimeout = 500 * time.Millisecond
	s := startSub(t, ob, []string{"q"}, func(ctx context.Context, _ *Message[string]) error {
		if handled.Add(1) == 3 {
			proxy.stall()
			close(stalled)
		}
		<-stalled
		return nil
	}, cfg)
	<-stalled
	time.Sleep(50 * time.Millisecond) // the acknowledger is blocked on the stalled socket
	began := time.Now()
	err = s.stop()
	took := time.Since(began)
	if took > cfg.GracefulTimeout+StopSlack {
		t.Errorf("Run took %v after its context ended; want at most %v", took, cfg.GracefulTimeout+StopSlack)
	}
	if !errors.Is(err, ErrGracefulTimeout) || !strings.Contains(err.Error(), "0 handler(s) abandoned, 3 outcome(s) not written") {
		t.Errorf("Run: %v; want ErrGracefulTimeout counting 3 unwritten outcomes", err)
	}
	if n := e.count("outbox"); n != 3 {
		t.Errorf("%d rows left, want all 3 (left to lease expiry)", n)
	}
}
