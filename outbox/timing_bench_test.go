package outbox

import (
	"context"
	"log/slog"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/faultproxy"
	"github.com/outboxgen/outboxgen/internal/pgtest"
)

// The figures behind the tests whose promises are about time: the tests
// assert bounds a loaded machine keeps, these measure how the subscriber
// actually does. Run them on an idle machine:
//
//	go test -run '^$' -bench 'ScheduledRowLateness|IdleFetcher|HeartbeatGap|DeliveryAfterAnOutage' ./outbox

// benchOutbox migrates an outbox into a fresh schema for b.
func benchOutbox(b testing.TB) (*pgtest.DB, *Outbox) {
	b.Helper()
	d := pgtest.New(b)
	ob, err := New(d.Pool, &Config{Schema: d.Schema})
	if err != nil {
		b.Fatal(err)
	}
	if err := ob.Migrate(b.Context()); err != nil {
		b.Fatal(err)
	}
	return d, ob
}

// runBench runs a subscriber until b ends.
func runBench[T any](b *testing.B, ob *Outbox, queues []string, h Handler[T], cfg *SubscriberConfig[T]) {
	b.Helper()
	sub, err := NewSubscriber(ob, queues, h, cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("Run: %v", err)
		}
	})
}

// benchReceive returns the time handled gives, failing b when it gives
// none within a minute.
func benchReceive(b *testing.B, handled <-chan time.Time, what string) time.Time {
	b.Helper()
	select {
	case at := <-handled:
		return at
	case <-time.After(time.Minute):
		b.Fatalf("%s within a minute", what)
		return time.Time{}
	}
}

// benchWait polls cond every millisecond until it holds, failing b after
// 30 s.
func benchWait(b *testing.B, what string, cond func() bool) {
	b.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// reportSpread reports the mean and the largest of ds in milliseconds.
func reportSpread(b *testing.B, ds []time.Duration, unit string) {
	if len(ds) == 0 {
		return
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	b.ReportMetric(float64(sum.Microseconds())/float64(len(ds))/1000, unit)
	b.ReportMetric(float64(slices.Max(ds).Microseconds())/1000, "max-"+unit)
}

// How late a scheduled row is handled by an idle subscriber, which polls
// every 30 s: TestScheduledRowIsDeliveredOnTime holds the bound.
func BenchmarkScheduledRowLateness(b *testing.B) {
	d, ob := benchOutbox(b)
	cfg := fastConfig[string](nil)
	cfg.MinFetchInterval, cfg.MaxFetchInterval = 30*time.Second, 30*time.Second
	handled := make(chan time.Time, 1)
	runBench(b, ob, []string{"q"}, func(context.Context, *Message[string]) error {
		handled <- time.Now()
		return nil
	}, cfg)
	pub, err := NewPublisher[string](ob, "q", nil)
	if err != nil {
		b.Fatal(err)
	}
	var late []time.Duration
	b.ResetTimer()
	for range b.N {
		id, err := pub.Publish(b.Context(), d.Pool, "x", &PublishOpts{Delay: 200 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		var due time.Time
		if err := d.Pool.QueryRow(b.Context(), "SELECT next_attempt_at FROM outbox WHERE id = $1", id).Scan(&due); err != nil {
			b.Fatal(err)
		}
		late = append(late, benchReceive(b, handled, "the scheduled row was not handled").Sub(due))
	}
	reportSpread(b, late, "ms-late")
}

// How often an idle fetcher claims while rows due at infinity and past
// the range of a Duration wait: TestRowsDueAtInfinityDoNotMakeTheFetcherSpin
// holds the bound. Each operation is one empty claim.
func BenchmarkIdleFetcherWithRowsDueAtInfinity(b *testing.B) {
	d, ob := benchOutbox(b)
	if _, err := d.Pool.Exec(b.Context(), `INSERT INTO outbox (queue, payload, next_attempt_at)
		VALUES ('q', '{}', 'infinity'), ('q', '{}', '100000-01-01'), ('q', '{}', '294276-12-31 23:59:59.999999+00')`); err != nil {
		b.Fatal(err)
	}
	rec := &events{}
	cfg := fastConfig[[]byte](rec)
	cfg.MinFetchInterval, cfg.MaxFetchInterval = 50*time.Millisecond, time.Second
	runBench(b, ob, []string{"q"}, func(context.Context, *Message[[]byte]) error { return nil }, cfg)
	// Past the backoff's growth: the first 8 empty claims.
	benchWait(b, "the backoff grown", func() bool { return rec.emptyClaims() >= 8 })
	from, start := rec.emptyClaims(), time.Now()
	b.ResetTimer()
	for i := range b.N {
		benchWait(b, "an empty claim", func() bool { return rec.emptyClaims() > from+i })
	}
	b.ReportMetric(float64(rec.emptyClaims()-from)/time.Since(start).Seconds(), "claims/s")
}

// The gaps between the extensions of a slow handler's lease, with 100 ms
// heartbeats, as the database sees them: TestHeartbeatKeepsASlowHandlersLease
// holds the bound. Each operation is one extension.
func BenchmarkHeartbeatGap(b *testing.B) {
	d, ob := benchOutbox(b)
	cfg := fastConfig[string](nil)
	cfg.LeaseTTL, cfg.HeartbeatInterval = time.Second, 100*time.Millisecond
	running, release := make(chan int64, 1), make(chan struct{})
	runBench(b, ob, []string{"slow"}, func(ctx context.Context, m *Message[string]) error {
		running <- m.ID
		select {
		case <-ctx.Done():
		case <-release:
		}
		return nil
	}, cfg)
	b.Cleanup(func() { close(release) }) // before the subscriber stops
	pub, err := NewPublisher[string](ob, "slow", nil)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := pub.Publish(b.Context(), d.Pool, "x", nil); err != nil {
		b.Fatal(err)
	}
	id := <-running
	expiry := func() time.Time {
		var at time.Time
		if err := d.Pool.QueryRow(b.Context(), "SELECT coalesce(lease_expires_at, 'epoch') FROM outbox WHERE id = $1", id).Scan(&at); err != nil {
			b.Fatal(err)
		}
		return at
	}
	last, seen := expiry(), time.Now()
	var gaps []time.Duration
	b.ResetTimer()
	for range b.N {
		benchWait(b, "a heartbeat", func() bool { return expiry().After(last) })
		last = expiry()
		gaps = append(gaps, time.Since(seen))
		seen = time.Now()
	}
	reportSpread(b, gaps, "ms-gap")
}

// How long after a database out of reach returns a subscriber delivers
// a row published during the outage: TestUnreachableDatabaseIsRetriedAt-
// LeastEveryMaxFetchInterval holds the bound. Each operation is an
// outage of three failed claims.
func BenchmarkDeliveryAfterAnOutage(b *testing.B) {
	d, _ := benchOutbox(b)
	u, err := url.Parse(d.URL)
	if err != nil {
		b.Fatal(err)
	}
	proxy, err := faultproxy.Listen(u.Host)
	if err != nil {
		b.Fatal(err)
	}
	u.Host = proxy.Addr()
	q := u.Query()
	q.Set("connect_timeout", "1")
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(b.Context(), u.String())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		proxy.Close()
		pool.Close()
	})
	ob, err := New(pool, &Config{Schema: d.Schema})
	if err != nil {
		b.Fatal(err)
	}
	handled := make(chan time.Time, 1)
	logs := &backoffLog{}
	cfg := fastConfig[string](nil)
	cfg.QueryTimeout = 200 * time.Millisecond
	cfg.ListenProbeInterval, cfg.ListenProbeTimeout = 300*time.Millisecond, 200*time.Millisecond
	cfg.Logger = slog.New(logs)
	runBench(b, ob, []string{"q"}, func(context.Context, *Message[string]) error {
		handled <- time.Now()
		return nil
	}, cfg)
	pub, err := NewPublisher[string](ob, "q", nil)
	if err != nil {
		b.Fatal(err)
	}
	// The subscriber at work before the first outage.
	if _, err := pub.Publish(b.Context(), d.Pool, "x", nil); err != nil {
		b.Fatal(err)
	}
	<-handled
	var delays []time.Duration
	b.ResetTimer()
	for range b.N {
		benchWait(b, "the acknowledgement before the outage", func() bool {
			var n int
			return d.Pool.QueryRow(b.Context(), "SELECT count(*) FROM outbox").Scan(&n) == nil && n == 0
		})
		failed := logs.count("outbox: claim failed; retrying")
		proxy.Stall()
		proxy.StallExisting()
		benchWait(b, "failed claims", func() bool { return logs.count("outbox: claim failed; retrying") >= failed+3 })
		if _, err := pub.Publish(b.Context(), d.Pool, "x", nil); err != nil {
			b.Fatal(err)
		}
		proxy.Restore()
		back := time.Now()
		delays = append(delays, benchReceive(b, handled, "not delivered after the database's return").Sub(back))
	}
	reportSpread(b, delays, "ms-delay")
}
