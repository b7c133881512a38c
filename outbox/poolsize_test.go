package outbox

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
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
		ob.poolMu.Lock()
		defer ob.poolMu.Unlock()
		return ob.poolUse.txWorkers == 4
	})
	err = second.Run(t.Context())
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "SubscriberConfig.Workers" {
		t.Fatalf("a second 4-worker transactional subscriber on a pool of 10: %v; want a *ConfigError on Workers", err)
	}
	for _, want := range []string{"already running on this pool (4 workers)", "needs 11", "MaxConns 10", "pool_max_conns=11"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	if err := stopFirst(); err != nil {
		t.Fatal(err)
	}
	stopSecond := running(t, second)
	eventually(t, "the second counted", func() bool {
		ob.poolMu.Lock()
		defer ob.poolMu.Unlock()
		return ob.poolUse.txWorkers == 4
	})
	for _, stop := range []func() error{stopSecond, stopPlain} {
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
	if ob.poolUse != (poolUse{}) {
		t.Errorf("after every Run returned: %+v counted; want none", ob.poolUse)
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
				ob.poolMu.Lock()
				defer ob.poolMu.Unlock()
				return ob.poolUse.subscribers == 1
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
