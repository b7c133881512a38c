package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// listeners returns the pids of this test's sessions LISTENing on ch.
func (e *env) listeners(ch string) []int32 {
	e.t.Helper()
	rows, err := e.db.Pool.Query(e.ctx, `SELECT pid FROM pg_stat_activity
		WHERE application_name = $1 AND query = $2 AND pid <> pg_backend_pid()`,
		e.db.Schema, "-- name: ListenProbe :exec\nLISTEN "+pgx.Identifier{ch + ":probe"}.Sanitize()+"\n")
	if err != nil {
		e.t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		e.t.Fatal(err)
	}
	return pids
}

// idleSubscriber runs a subscriber that polls only every 30 s, so only a
// NOTIFY (or a scheduled wake-up) delivers quickly; handled receives the
// time each message arrived.
func idleSubscriber(t *testing.T, e *env, cfg *SubscriberConfig[string]) chan time.Time {
	t.Helper()
	if cfg == nil {
		cfg = fastConfig[string](nil)
	}
	cfg.MinFetchInterval, cfg.MaxFetchInterval = 30*time.Second, 30*time.Second
	handled := make(chan time.Time, 16)
	startSub(t, e.ob, []string{"q"}, func(context.Context, *Message[string]) error {
		handled <- time.Now()
		return nil
	}, cfg)
	return handled
}

func within(t *testing.T, handled chan time.Time, d time.Duration, what string) time.Time {
	t.Helper()
	select {
	case at := <-handled:
		return at
	case <-time.After(d):
		t.Fatalf("%s: not handled within %v", what, d)
		return time.Time{}
	}
}

func TestNotifyWakesAnIdleSubscriber(t *testing.T) {
	t.Parallel()
	e := setup(t)
	handled := idleSubscriber(t, e, nil)
	eventually(t, "the LISTEN connection", func() bool { return len(e.listeners(e.ob.Channel())) == 1 })
	e.waitAsleep()
	pub := newPublisher[string](t, e, "q", nil)
	sent := time.Now()
	if _, err := pub.Publish(e.ctx, e.pubPool, "x", nil); err != nil {
		t.Fatal(err)
	}
	// The subscriber polls every 30 s; the bound leaves a loaded machine
	// room. BenchmarkScheduledRowLateness measures a wake-up's lateness.
	if lat := within(t, handled, 20*time.Second, "after NOTIFY").Sub(sent); lat > scheduledLatenessBound {
		t.Errorf("handled %v after publish, want within %v; a NOTIFY should wake the subscriber in milliseconds, not at its 30 s poll", lat, scheduledLatenessBound)
	}
}

func TestPollingDeliversWhenListenIsImpossible(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rec := &events{}
	cfg := fastConfig[string](rec)
	cfg.ListenDSN = "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"
	handled := make(chan time.Time, 1)
	startSub(t, e.ob, []string{"q"}, func(context.Context, *Message[string]) error {
		handled <- time.Now()
		return nil
	}, cfg)
	if _, err := newPublisher[string](t, e, "q", nil).Publish(e.ctx, e.pubPool, "x", nil); err != nil {
		t.Fatal(err)
	}
	within(t, handled, 10*time.Second, "by polling")
}

func TestKilledListenerIsReplaced(t *testing.T) {
	t.Parallel()
	e := setup(t)
	handled := idleSubscriber(t, e, nil)
	var first []int32
	eventually(t, "the LISTEN connection", func() bool { first = e.listeners(e.ob.Channel()); return len(first) == 1 })
	e.exec("SELECT pg_terminate_backend($1)", first[0])
	eventually(t, "a new LISTEN connection", func() bool {
		now := e.listeners(e.ob.Channel())
		return len(now) == 1 && now[0] != first[0]
	})
	e.waitAsleep()
	if _, err := newPublisher[string](t, e, "q", nil).Publish(e.ctx, e.pubPool, "x", nil); err != nil {
		t.Fatal(err)
	}
	within(t, handled, 5*time.Second, "after the listener was replaced")
}

func TestScheduledRowIsDeliveredOnTime(t *testing.T) {
	t.Parallel()
	e := setup(t)
	handled := idleSubscriber(t, e, nil)
	eventually(t, "the LISTEN connection", func() bool { return len(e.listeners(e.ob.Channel())) == 1 })
	e.waitAsleep()
	id, err := newPublisher[string](t, e, "q", nil).Publish(e.ctx, e.pubPool, "x", &PublishOpts{Delay: 700 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	row, _ := e.row(id)
	at := within(t, handled, 20*time.Second, "the scheduled row")
	// The subscriber polls every 30 s: a wake-up that is not armed for the
	// row's due time shows as lateness of up to 30 s. The bound leaves a
	// loaded machine room; BenchmarkScheduledRowLateness measures how late
	// the row actually is.
	if late := at.Sub(row.NextAttemptAt); late < 0 || late > scheduledLatenessBound {
		t.Errorf("handled %v after its due time; want within %v (the poll interval is 30 s)", late, scheduledLatenessBound)
	}
}

// scheduledLatenessBound is how late a row scheduled on an idle
// subscriber, which polls every 30 s, may be handled.
const scheduledLatenessBound = 5 * time.Second

func TestSubscriberSurvivesKilledBackends(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 3000
	msgs := make([]int, n)
	for i := range msgs {
		msgs[i] = i
	}
	if _, err := newPublisher[int](t, e, "q", nil).PublishBatch(e.ctx, e.pubPool, msgs, nil); err != nil {
		t.Fatal(err)
	}
	// The subscriber gets a pool of its own, so its backends (pool and
	// listener) can be told apart from the test's.
	app := e.db.Schema + "_sub"
	pool, err := pgxpool.New(e.ctx, strings.Replace(e.db.URL, "application_name="+e.db.Schema, "application_name="+app, 1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ob, err := New(pool, &Config{Schema: e.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	seen := make([]atomic.Int32, n)
	var total atomic.Int32
	cfg := fastConfig[int](nil)
	cfg.FetchBatchSize = 20
	startSub(t, ob, []string{"q"}, func(_ context.Context, m *Message[int]) error {
		seen[m.Payload].Add(1)
		total.Add(1)
		time.Sleep(100 * time.Microsecond)
		return nil
	}, cfg)
	eventually(t, "some progress", func() bool { return total.Load() > n/4 })
	var killed int
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1`, app).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	if killed < 2 {
		t.Fatalf("killed %d backends; want the pool's and the listener's", killed)
	}
	eventually(t, "every row delivered", func() bool { return e.count("outbox") == 0 })
	for i := range seen {
		if seen[i].Load() == 0 {
			t.Fatalf("message %d never handled", i)
		}
	}
}

// logLines is a slog destination that tests can read while it is written.
type logLines struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A subscriber whose LISTEN connection never hears (as through a pooler
// in transaction mode) says so once, with the fix, records no sleep (so
// writers do not notify for nothing), and finds rows by polling. One whose
// connection hears says nothing and records its sleep.
//
// The deaf one's verdict comes after its ListenProbeTimeout; the one that
// hears is given a timeout no loaded machine's NOTIFY takes, and the test
// waits out that timeout before it checks that nothing was said. Each
// check follows idle polls made after the verdict, counted as claims.
func TestSubscriberWhoseListenerCannotHearPollsAndSaysSo(t *testing.T) {
	t.Parallel()
	for _, deaf := range []bool{true, false} {
		t.Run(fmt.Sprintf("deaf=%v", deaf), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			logs := &logLines{}
			rec := &events{}
			cfg := fastConfig[string](rec)
			cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
			cfg.ListenProbeTimeout = 2 * time.Second
			if deaf {
				// Another database's notifications never reach this one's.
				cfg.ListenDSN = otherDatabase(t, e.db.URL)
				cfg.ListenProbeTimeout = 300 * time.Millisecond
			}
			handled := make(chan time.Time, 1)
			startSub(t, e.ob, []string{"q"}, func(context.Context, *Message[string]) error {
				handled <- time.Now()
				return nil
			}, cfg)
			const warning = "did not reach the LISTEN connection"
			if deaf {
				eventually(t, "the warning", func() bool { return strings.Contains(logs.String(), warning) })
			} else {
				// The probe is sent once the LISTEN connection listens,
				// and the subscriber records its sleep once it listens;
				// the probe's verdict is in a ListenProbeTimeout later.
				e.waitAsleep()
				time.Sleep(cfg.ListenProbeTimeout)
			}
			idlePolls(t, rec, 3)
			if holding, _ := e.sleeping(); (holding == 1) == deaf {
				t.Errorf("deaf %v: %d sleep records hold", deaf, holding)
			}
			if n := strings.Count(logs.String(), warning); n != map[bool]int{true: 1, false: 0}[deaf] {
				t.Errorf("deaf %v: the warning logged %d times:\n%s", deaf, n, logs.String())
			}
			e.publish("q")
			within(t, handled, 10*time.Second, "the row")
		})
	}
}

// Subscribers of one Outbox share one LISTEN connection: each is woken by
// its queue's NOTIFY (they poll only every 30 s); stopping some keeps the
// connection for the rest, and stopping the last closes it.
func TestSubscribersOfAnOutboxShareOneListenConnection(t *testing.T) {
	t.Parallel()
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("subscribers=%d", n), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			subs := make([]*started, n)
			handled := make([]chan time.Time, n)
			for i := range n {
				cfg := fastConfig[string](nil)
				cfg.MinFetchInterval, cfg.MaxFetchInterval = 30*time.Second, 30*time.Second
				h := make(chan time.Time, 4)
				handled[i] = h
				subs[i] = startSub(t, e.ob, []string{fmt.Sprintf("q%d", i)}, func(context.Context, *Message[string]) error {
					h <- time.Now()
					return nil
				}, cfg)
			}
			var first []int32
			eventually(t, "the LISTEN connection", func() bool { first = e.listeners(e.ob.Channel()); return len(first) >= 1 })
			asleep := func(k int) {
				t.Helper()
				eventually(t, fmt.Sprintf("%d subscribers asleep", k), func() bool { h, _ := e.sleeping(); return h == k })
			}
			asleep(n)
			if got := e.listeners(e.ob.Channel()); len(got) != 1 {
				t.Fatalf("%d subscribers hold %d LISTEN connections (pids %v); want 1", n, len(got), got)
			}
			for i := range n {
				e.publish(fmt.Sprintf("q%d", i))
			}
			for i := range n {
				within(t, handled[i], 5*time.Second, fmt.Sprintf("q%d after NOTIFY", i))
			}
			for stopped := range n - 1 {
				if err := subs[stopped].stop(); err != nil {
					t.Fatal(err)
				}
				asleep(n - stopped - 1)
				if got := e.listeners(e.ob.Channel()); len(got) != 1 || got[0] != first[0] {
					t.Fatalf("after %d of %d subscribers stopped, LISTEN connections %v; want still %v", stopped+1, n, got, first)
				}
				for i := stopped + 1; i < n; i++ {
					e.publish(fmt.Sprintf("q%d", i))
					within(t, handled[i], 5*time.Second, fmt.Sprintf("q%d after %d subscribers stopped", i, stopped+1))
				}
			}
			if err := subs[n-1].stop(); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the LISTEN connection closed", func() bool { return len(e.listeners(e.ob.Channel())) == 0 })
		})
	}
}
