package outbox

import (
	"context"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/faultproxy"
)

// newProxy starts a fault proxy to target, closed when the test ends.
func newProxy(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Listen(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// proxiedOutbox returns an outbox like e's whose pool connects through a
// fault proxy.
func proxiedOutbox(t *testing.T, e *env) (*Outbox, *faultproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newProxy(t, u.Host)
	u.Host = proxy.Addr()
	pool, err := pgxpool.New(e.ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	// Cut the proxy first: closing a pool whose sockets are stalled waits
	// for each connection's goodbye.
	t.Cleanup(func() {
		proxy.Close()
		pool.Close()
	})
	ob, err := New(pool, &Config{Schema: e.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	return ob, proxy
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
	ob, proxy := proxiedOutbox(t, e)

	stalled := make(chan struct{})
	var handled atomic.Int32
	cfg := fastConfig[string](nil)
	cfg.GracefulTimeout = 500 * time.Millisecond
	s := startSub(t, ob, []string{"q"}, func(ctx context.Context, _ *Message[string]) error {
		if handled.Add(1) == 3 {
			proxy.Stall()
			close(stalled)
		}
		<-stalled
		return nil
	}, cfg)
	<-stalled
	time.Sleep(50 * time.Millisecond) // the acknowledger is blocked on the stalled socket
	e.stopIsBounded(s, cfg.GracefulTimeout, 3)
}

// A connection whose socket stalls in the middle of the subscriber's work
// costs at most QueryTimeout: the statement on it is abandoned, the
// connection closed, and the subscriber goes on with fresh connections.
func TestStalledConnectionsCostAtMostTheQueryTimeout(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ob, proxy := proxiedOutbox(t, e)
	handled := make(chan string, 10)
	cfg := fastConfig[string](nil)
	cfg.QueryTimeout = 300 * time.Millisecond
	cfg.ListenProbeInterval, cfg.ListenProbeTimeout = 300*time.Millisecond, 200*time.Millisecond
	startSub(t, ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
		handled <- m.Payload
		return nil
	}, cfg)
	pub := newPublisher[string](t, e, "q", nil)
	if _, err := pub.Publish(e.ctx, e.pubPool, "before", nil); err != nil {
		t.Fatal(err)
	}
	if p := waitFor(t, handled, "before the stall"); p != "before" {
		t.Errorf("handled %q, want before", p)
	}
	if n := proxy.StallExisting(); n == 0 {
		t.Fatal("no connection to stall")
	}
	if _, err := pub.Publish(e.ctx, e.pubPool, "after", nil); err != nil {
		t.Fatal(err)
	}
	if p := waitFor(t, handled, "after the stall (a subscriber stuck on its stalled connections delivers nothing)"); p != "after" {
		t.Errorf("handled %q, want after", p)
	}
	eventually(t, "the acknowledgement", func() bool { return e.count("outbox") == 0 })
}

// waitFor returns the next value of ch, failing the test after 10 s.
func waitFor[V any](t *testing.T, ch chan V, what string) V {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: nothing within 10 s", what)
		var zero V
		return zero
	}
}
