package outbox

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/db"
)

// A due row that another transaction holds locked cannot be claimed; an
// idle subscriber must back off as usual instead of claiming in a loop.
func TestLockedDueRowDoesNotMakeTheFetcherSpin(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id := e.publish("q")
	tx, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(e.ctx, "SELECT 1 FROM outbox WHERE id = $1 FOR UPDATE", id); err != nil {
		t.Fatal(err)
	}
	rec := &events{}
	cfg := fastConfig[string](rec)
	cfg.MinFetchInterval, cfg.MaxFetchInterval = 50*time.Millisecond, time.Second
	s := startSub(t, e.ob, []string{"q"}, func(context.Context, *Message[string]) error { return nil }, cfg)
	// BenchmarkIdleFetcherWithRowsDueAtInfinity measures the claims a
	// second of an idle fetcher.
	idleSettles(t, rec, cfg.MaxFetchInterval, "a locked due row")
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
}

// A RetryAfter of 2 s is delivered 2 s later, not at the fetcher's next
// poll, 22.5 s or more away. (A shorter one may be claimed as the fetcher
// watches the transactions in flight when it recorded its sleep, which
// on a busy machine hides a missed wake-up.) The bound leaves a loaded
// machine room; BenchmarkScheduledRowLateness measures how late a row
// due at a time of its own is handled.
func TestRetryAfterIsDeliveredOnTime(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.publish("q")
	var (
		mu    sync.Mutex
		calls []time.Time
	)
	cfg := fastConfig[string](nil)
	cfg.MinFetchInterval, cfg.MaxFetchInterval = 30*time.Second, 30*time.Second
	const retryAfter = 2 * time.Second
	failing(t, e, "q", cfg, func(*Message[string]) error {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, time.Now())
		if len(calls) == 1 {
			return RetryAfter(errors.New("busy"), retryAfter)
		}
		return nil
	})
	eventually(t, "the retry", func() bool { mu.Lock(); defer mu.Unlock(); return len(calls) == 2 })
	mu.Lock()
	defer mu.Unlock()
	if gap := calls[1].Sub(calls[0]); gap < retryAfter || gap > retryAfter+scheduledLatenessBound {
		t.Errorf("retry delivered %v after the first call; want %v and at most %v more (the poll interval is 30 s)", gap, retryAfter, scheduledLatenessBound)
	}
}

// A row whose lease is cleared by another client (a retry, a release)
// wakes an idle subscriber through NOTIFY, due now or later. The
// subscriber polls every 30 s; the bounds leave a loaded machine room.
func TestReleasedAndRetriedRowsWakeOtherSubscribers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	now := e.publish("q")
	later := e.publish("q")
	released := e.publish("q")
	rows := e.claim(3, "q")
	byID := map[int64]claimed{rows[0].ID: rows[0], rows[1].ID: rows[1], rows[2].ID: rows[2]}
	handled := idleSubscriber(t, e, nil)
	eventually(t, "the LISTEN connection", func() bool { return len(e.listeners(e.ob.Channel())) == 1 })

	start := time.Now()
	if _, err := e.q.MarkPendingBatchWithLease(e.ctx, db.MarkPendingBatchWithLeaseParams{
		Ids: []int64{now, later}, Tokens: tokens(byID[now], byID[later]),
		DelaySeconds: []float64{0, 0.5}, LastErrors: []string{"", ""},
	}); err != nil {
		t.Fatal(err)
	}
	first := within(t, handled, 20*time.Second, "the row due now")
	second := within(t, handled, 20*time.Second, "the row due in 500ms")
	if d := first.Sub(start); d > scheduledLatenessBound {
		t.Errorf("row due now handled after %v, want within %v", d, scheduledLatenessBound)
	}
	if d := second.Sub(start); d < 450*time.Millisecond || d > 500*time.Millisecond+scheduledLatenessBound {
		t.Errorf("row due in 500ms handled after %v, want within %v of its due time", d, scheduledLatenessBound)
	}

	// A release at another subscriber's shutdown wakes it the same way.
	start = time.Now()
	if _, err := e.q.ReleaseBatchWithLease(e.ctx, db.ReleaseBatchWithLeaseParams{
		Ids: []int64{released}, Tokens: tokens(byID[released]),
	}); err != nil {
		t.Fatal(err)
	}
	if d := within(t, handled, 20*time.Second, "the released row").Sub(start); d > scheduledLatenessBound {
		t.Errorf("released row handled after %v, want within %v", d, scheduledLatenessBound)
	}
}

// One subscriber of a backlogged queue and an urgent one: a claim shares
// its batch, so the urgent row is in the first claim.
func TestClaimSharesItsBatchAcrossQueues(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.exec(`INSERT INTO outbox (queue, payload, next_attempt_at)
		SELECT 'bulk', '\x00', now() - interval '1 hour' FROM generate_series(1, 500)`)
	urgent := e.publish("urgent")
	got := ids(e.claim(10, "bulk", "urgent"))
	found := false
	for _, id := range got {
		found = found || id == urgent
	}
	if len(got) != 10 || !found {
		t.Errorf("claim of 10 = %v; want the urgent row %d among them", got, urgent)
	}
	// With nothing else due, the claim still fills its batch from bulk.
	if got := e.claim(10, "bulk", "urgent"); len(got) != 10 {
		t.Errorf("second claim took %d rows, want 10", len(got))
	}
	if diff := cmp.Diff(1, e.countWhere("queue = 'urgent'")); diff != "" {
		t.Errorf("urgent rows (-want +got):\n%s", diff)
	}
}

func (e *env) countWhere(cond string) int {
	e.t.Helper()
	var n int
	if err := e.db.Pool.QueryRow(e.ctx, "SELECT count(*) FROM outbox WHERE "+cond).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}
