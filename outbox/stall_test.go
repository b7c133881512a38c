package outbox

import (
	"context"
	"log/slog"
	"net/url"
	"slices"
	"sync"
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
// fault proxy; params are added to the pool's URL.
func proxiedOutbox(t *testing.T, e *env, params ...string) (*Outbox, *faultproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newProxy(t, u.Host)
	u.Host = proxy.Addr()
	q := u.Query()
	for i := 0; i+1 < len(params); i += 2 {
		q.Set(params[i], params[i+1])
	}
	u.RawQuery = q.Encode()
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
	// An acknowledgement caught on a stalled connection does not land,
	// and its row is delivered again when its lease ends: a short lease
	// ends the wait for the empty outbox soon (it was 5 s of the test's 6).
	cfg.LeaseTTL = time.Second
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
	// "before" may come again first: its acknowledgement can be the
	// statement the stall caught, and its lease then ends.
	for again := 0; ; again++ {
		p := waitFor(t, handled, "after the stall (a subscriber stuck on its stalled connections delivers nothing)")
		if p == "after" {
			break
		}
		if p != "before" || again == 3 {
			t.Fatalf("handled %q (%d times again), want after", p, again)
		}
	}
	eventually(t, "the acknowledgement", func() bool { return e.count("outbox") == 0 })
}

// waitFor returns the next value of ch, failing the test after 10 s.
func waitFor[V any](t *testing.T, ch chan V, what string) V {
	t.Helper()
	return waitForWithin(t, ch, what, 10*time.Second)
}

// waitForWithin is waitFor, failing the test after d.
func waitForWithin[V any](t *testing.T, ch chan V, what string, d time.Duration) V {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: nothing within %v", what, d)
		var zero V
		return zero
	}
}

// A database that is out of reach for a while (a failover's outage: the
// old primary gone, the new one not yet promoted): the subscriber tries
// its claims and its LISTEN connection again at least every
// MaxFetchInterval, however long the outage, so it delivers again within
// about that long of the database's return, not after a backoff grown
// through the outage.
func TestUnreachableDatabaseIsRetriedAtLeastEveryMaxFetchInterval(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// A connection attempt into the outage must end: without a connect
	// timeout, pgxpool waits on it for good, holding a place in the pool.
	ob, proxy := proxiedOutbox(t, e, "connect_timeout", "1")
	handled := make(chan string, 10)
	logs := &backoffLog{}
	cfg := fastConfig[string](nil)
	cfg.QueryTimeout = 200 * time.Millisecond
	cfg.ListenProbeInterval, cfg.ListenProbeTimeout = 300*time.Millisecond, 200*time.Millisecond
	cfg.Logger = slog.New(logs)
	startSub(t, ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
		handled <- m.Payload
		return nil
	}, cfg)
	pub := newPublisher[string](t, e, "q", nil)
	if _, err := pub.Publish(e.ctx, e.db.Pool, "before", nil); err != nil {
		t.Fatal(err)
	}
	// The first delivery takes in the subscriber's start and first claim,
	// whose statements time out after 200 ms on a loaded machine and are
	// tried again: it waits up to a minute (the outage's retries, the
	// promise here, are timed below).
	if p := waitForWithin(t, handled, "before the outage", time.Minute); p != "before" {
		t.Errorf("handled %q, want before", p)
	}
	// Its acknowledgement written, so that the outage leaves nothing to
	// deliver again.
	eventually(t, "the acknowledgement", func() bool { return e.count("outbox") == 0 })
	proxy.Stall()
	proxy.StallExisting()
	stalled := time.Now()
	// Eleven failed claims in a row: a backoff doubling from 100 ms (with
	// jitter of half of it either way) without the cap waits 51 s or
	// more after the eleventh.
	const failures = 11
	eventually(t, "failed claims", func() bool { return logs.count("outbox: claim failed; retrying") >= failures })
	if _, err := pub.Publish(e.ctx, e.db.Pool, "after", nil); err != nil {
		t.Fatal(err)
	}
	proxy.Restore()
	back := time.Now()
	t.Logf("%d failed claims in %v", failures, back.Sub(stalled))
	select {
	case p := <-handled:
		if p != "after" {
			t.Errorf("handled %q, want after", p)
		}
	case <-time.After(time.Minute):
		t.Fatal("nothing delivered within a minute of the database's return")
	}
	// A claim in flight when the database returns, then one more wait
	// of MaxFetchInterval at most, and fresh connections: the bound
	// leaves a loaded machine room (its pool reconnecting) and stays
	// well below the grown backoff. BenchmarkDeliveryAfterAnOutage
	// measures the delay.
	took := time.Since(back)
	t.Logf("delivered %v after the database returned", took)
	if bound := 20 * time.Second; took > bound {
		t.Errorf("delivered %v after the database returned, want within %v (a backoff grown through the outage waits 51 s or more)", took, bound)
	}
	// Connections that carried bytes during the outage are broken for
	// good and only cost the subscriber its timeouts: reset them, so that
	// its last writes and its stop go through fresh ones.
	proxy.Cut()
	eventually(t, "the acknowledgement after the outage", func() bool { return e.count("outbox") == 0 })
	for _, b := range logs.backoffs() {
		if b.wait > cfg.MaxFetchInterval {
			t.Errorf("%q waited %v, more than MaxFetchInterval (%v)", b.msg, b.wait, cfg.MaxFetchInterval)
		}
	}
}

// backoffLog records the backoff of every log record that has one.
type backoffLog struct {
	mu   sync.Mutex
	recs []loggedBackoff
}

type loggedBackoff struct {
	msg  string
	wait time.Duration
}

func (l *backoffLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *backoffLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *backoffLog) WithGroup(string) slog.Handler            { return l }

func (l *backoffLog) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "backoff" {
			l.mu.Lock()
			l.recs = append(l.recs, loggedBackoff{msg: r.Message, wait: a.Value.Duration()})
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

func (l *backoffLog) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.recs {
		if r.msg == msg {
			n++
		}
	}
	return n
}

func (l *backoffLog) backoffs() []loggedBackoff {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.recs)
}
