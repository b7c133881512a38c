package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/pgtest"
)

// poolWarning starts the warning of a pool smaller than a subscriber's
// workers need.
const poolWarning = "outbox: the pool is small for the subscribers running on it"

// running runs sub until the test ends; Run's error, if it returned
// early, is in the channel.
func running[T any](t *testing.T, sub *Subscriber[T]) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	stopped := false
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// Transactional subscribers running on one pool share the connections
// left beside their handlers' transactions: a Run whose workers, with
// those of the transactional subscribers already running, would leave
// fewer than three is refused with the MaxConns it needs, and succeeds
// once the others stop. Plain subscribers hold no connection for their
// handlers and are not counted.
func TestRunRefusesTransactionalWorkersThePoolCannotHold(t *testing.T) {
	t.Parallel()
	// An unreachable pool: each Run waits, counted, at its schema check.
	ob, err := New(unreachablePoolOf(t, 10), nil)
	if err != nil {
		t.Fatal(err)
	}
	h := func(context.Context, pgx.Tx, *Message[string]) error { return nil }
	quiet := slog.New(slog.NewTextHandler(&logLines{}, nil))
	newTx := func(workers int) *Subscriber[string] {
		t.Helper()
		s, err := NewTxSubscriber(ob, []string{"q"}, h, &SubscriberConfig[string]{Workers: workers, Logger: quiet})
		if err != nil {
			t.Fatalf("NewTxSubscriber with %d workers on a pool of 10: %v", workers, err)
		}
		return s
	}
	plain, err := NewSubscriber(ob, []string{"p"}, func(context.Context, *Message[string]) error { return nil },
		&SubscriberConfig[string]{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	stopPlain := running(t, plain)
	first, second := newTx(4), newTx(4)
	stopFirst := running(t, first)
	eventually(t, "the first counted", func() bool {
		return pools.usage(ob.pool).txWorkers == 4
	})
	err = second.Run(t.Context())
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "SubscriberConfig.Workers" {
		t.Fatalf("a second 4-worker transactional subscriber on a pool of 10: %v; want a *ConfigError on Workers", err)
	}
	for _, want := range []string{`already running on this pool (4 workers: queues "q" of "public"."outbox", 4 workers)`, "needs 11", "MaxConns 10", "pool_max_conns=11"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	if err := stopFirst(); err != nil {
		t.Fatal(err)
	}
	stopSecond := running(t, second)
	eventually(t, "the second counted", func() bool {
		return pools.usage(ob.pool).txWorkers == 4
	})
	for _, stop := range []func() error{stopSecond, stopPlain} {
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
	if u := pools.usage(ob.pool); u != (poolUse{}) {
		t.Errorf("after every Run returned: %+v counted; want none", u)
	}
}

// A plain subscriber whose pool, beside the connections its claims,
// outcomes and heartbeats take, has fewer than its workers says so once,
// with the numbers and the fix; on a pool with room it says nothing.
func TestRunWarnsOnceOfAPoolSmallerThanItsWorkers(t *testing.T) {
	t.Parallel()
	const warning = poolWarning
	for _, tc := range []struct {
		maxConns int32
		warns    []string // nil: no warning
	}{
		// Two claims by lock, the acknowledger and the heartbeat.
		{4, []string{"pool_max_conns=4", "engine_conns=4", "spare_conns=0", "workers=16", "want_max_conns=20", "set pool_max_conns=20 in the pool's URL, or pgxpool.Config.MaxConns"}},
		{20, nil},
	} {
		ob, err := New(unreachablePoolOf(t, tc.maxConns), nil)
		if err != nil {
			t.Fatal(err)
		}
		var logs logLines
		s, err := NewSubscriber(ob, []string{"q"}, func(context.Context, *Message[string]) error { return nil },
			&SubscriberConfig[string]{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		for range 2 { // a second Run does not warn again
			stop := running(t, s)
			eventually(t, "the subscriber counted", func() bool {
				return pools.usage(ob.pool).subscribers == 1
			})
			if err := stop(); err != nil {
				t.Fatal(err)
			}
		}
		got := logs.String()
		if n := strings.Count(got, warning); n != min(len(tc.warns), 1) {
			t.Errorf("a pool of %d: warned %d times:\n%s", tc.maxConns, n, got)
		}
		for _, want := range tc.warns {
			if !strings.Contains(got, want) {
				t.Errorf("a pool of %d: the warning does not say %q:\n%s", tc.maxConns, want, got)
			}
		}
	}
}

// onePoolOfSix is two migrated outboxes, each in a schema of its own, on
// one pool of six connections, with a transactional subscriber of queue
// "orders" made with the defaults on each: three workers, the pool's six
// less the three left to claims, heartbeats and outcomes. handled
// receives what their handlers were given, by outbox.
func onePoolOfSix(t *testing.T) (obs [2]*Outbox, subs [2]*Subscriber[string], handled [2]chan string) {
	t.Helper()
	first := pgtest.New(t)
	cfg, err := pgxpool.ParseConfig(first.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 6
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	quiet := slog.New(slog.NewTextHandler(&logLines{}, nil))
	for i, d := range []*pgtest.DB{first, pgtest.New(t)} {
		ob, err := New(pool, &Config{Schema: d.Schema})
		if err != nil {
			t.Fatal(err)
		}
		if err := ob.Migrate(t.Context()); err != nil {
			t.Fatalf("Migrate %s: %v", d.Schema, err)
		}
		got := make(chan string, 10)
		sub, err := NewTxSubscriber(ob, []string{"orders"}, func(_ context.Context, _ pgx.Tx, m *Message[string]) error {
			got <- m.Payload
			return nil
		}, &SubscriberConfig[string]{Logger: quiet})
		if err != nil {
			t.Fatalf("NewTxSubscriber on a pool of 6: %v", err)
		}
		if w := sub.Config().Workers; w != 3 {
			t.Fatalf("NewTxSubscriber on a pool of 6 defaulted Workers to %d; want 3", w)
		}
		obs[i], subs[i], handled[i] = ob, sub, got
	}
	return obs, subs, handled
}

// publishOn publishes payload to queue "orders" of ob, committed.
func publishOn(t *testing.T, ob *Outbox, payload string) {
	t.Helper()
	pub, err := NewPublisher[string](ob, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(t.Context(), ob.pool, payload, nil); err != nil {
		t.Fatalf("Publish: %v", err)
	}
}

// handledIs waits for the handler to be given want.
func handledIs(t *testing.T, handled <-chan string, want string) {
	t.Helper()
	if diff := cmp.Diff(want, receive(t, handled)); diff != "" {
		t.Fatalf("handled (-want +got):\n%s", diff)
	}
}

// runRefused runs the second outbox's subscriber, with "b0" published to
// it, and returns Run's error; if the subscriber handles "b0" instead,
// its Run was accepted and the test fails.
func runRefused(t *testing.T, obs [2]*Outbox, subs [2]*Subscriber[string], handled [2]chan string) error {
	t.Helper()
	publishOn(t, obs[1], "b0")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- subs[1].Run(ctx) }()
	select {
	case err := <-done:
		cancel()
		return err
	case got := <-handled[1]:
		cancel()
		t.Fatalf("the second outbox's subscriber ran beside the first on their pool of 6 and handled %q; want its Run refused (it returned %v)", got, <-done)
		return nil
	}
}

// The connections of a pool are counted across every Outbox made on it:
// with one outbox's transactional subscriber running, the Run of another
// outbox's on the same pool, whose workers would leave its heartbeats no
// connection, is refused with the pool's MaxConns, what the running one
// holds, and the fix.
func TestRunCountsTransactionalWorkersOfEveryOutboxOnThePool(t *testing.T) {
	t.Parallel()
	obs, subs, handled := onePoolOfSix(t)
	stopFirst := running(t, subs[0])
	publishOn(t, obs[0], "a1")
	handledIs(t, handled[0], "a1") // the first is running, so counted

	err := runRefused(t, obs, subs, handled)
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "SubscriberConfig.Workers" {
		t.Fatalf("Run of a second outbox's 3-worker transactional subscriber on the first's pool of 6: %v; want a *ConfigError on Workers", err)
	}
	first := fmt.Sprintf("queues %q of %s", "orders", pgx.Identifier{obs[0].Schema(), obs[0].Table()}.Sanitize())
	for _, want := range []string{"already running on this pool (3 workers: " + first + ", 3 workers)",
		"needs 9 pool connections", "MaxConns 6", "set pool_max_conns=9 in the pool's URL, or pgxpool.Config.MaxConns, or lower Workers"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	// The refusal harms nothing of the first's.
	publishOn(t, obs[0], "a2")
	handledIs(t, handled[0], "a2")
	if err := stopFirst(); err != nil {
		t.Fatal(err)
	}
}

// A Run refused for another outbox's subscriber on its pool is accepted
// once that subscriber's Run returns, and delivers what was published
// meanwhile.
func TestRunAcceptsAnotherOutboxsSubscriberOnceThePoolsFirstReturns(t *testing.T) {
	t.Parallel()
	obs, subs, handled := onePoolOfSix(t)
	stopFirst := running(t, subs[0])
	publishOn(t, obs[0], "a1")
	handledIs(t, handled[0], "a1")
	var ce *ConfigError
	if err := runRefused(t, obs, subs, handled); !errors.As(err, &ce) {
		t.Fatalf("Run of the second while the first runs on their pool of 6: %v; want a *ConfigError", err)
	}
	if err := stopFirst(); err != nil {
		t.Fatal(err)
	}
	stopSecond := running(t, subs[1])
	handledIs(t, handled[1], "b0")
	if err := stopSecond(); err != nil {
		t.Fatal(err)
	}
	if u := pools.usage(obs[0].pool); u != (poolUse{}) {
		t.Errorf("after every Run returned: %+v counted; want none", u)
	}
}
