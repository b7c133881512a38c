package outbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/claim"
)

// lockingConfig is fastConfig with a lease and a lock window long enough
// that a test decides when a locked claim ends.
func lockingConfig(rec MetricsRecorder) *SubscriberConfig[string] {
	cfg := fastConfig[string](rec)
	cfg.LeaseTTL = 30 * time.Second
	cfg.LockWindow = 10 * time.Second
	cfg.minLockedClaim = -1 // every claim by lock, however few rows the last found
	return cfg
}

// terminateLockedClaims ends, as a crash would, the backends of every
// locked claim recorded in e's outbox, and returns how many it ended.
func (e *env) terminateLockedClaims() int {
	e.t.Helper()
	var n int
	err := e.db.Pool.QueryRow(e.ctx, `SELECT count(*) FROM (
		SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity AS a
		JOIN outbox_locks AS l ON l.xid % 4294967296 = a.backend_xid::text::bigint) AS t`).Scan(&n)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// abortedXid returns the id of a transaction that took one and rolled
// back, as a claim whose connection died does.
func (e *env) abortedXid() int64 {
	e.t.Helper()
	tx, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	var xid int64
	if err := tx.QueryRow(e.ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&xid); err != nil {
		e.t.Fatal(err)
	}
	if err := tx.Rollback(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	return xid
}

// While its handlers run, a locked claim has written nothing to its rows:
// they hold no lease and count no delivery, yet no other claim can take
// them, and the claim is recorded. Its end deletes the rows and the
// record. A subscriber of one queue and one of several claim through
// different statements (LockQueue, Lock); both are checked.
func TestLockedClaimWritesNothingWhileItsHandlersRun(t *testing.T) {
	t.Parallel()
	for _, queues := range [][]string{{"q"}, {"q", "r"}} {
		t.Run(strings.Join(queues, ","), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			var published []int64
			for i := range 3 {
				published = append(published, e.publish(queues[i%len(queues)]))
			}
			release := make(chan struct{})
			var started atomic.Int32
			rec := &events{}
			s := startSub(t, e.ob, queues, func(context.Context, *Message[string]) error {
				started.Add(1)
				<-release
				return nil
			}, lockingConfig(rec))
			eventually(t, "three handlers running", func() bool { return started.Load() == 3 })
			for _, id := range published {
				r, ok := e.row(id)
				if !ok || r.AcquiredToken.Valid || r.DeliveriesCount != 0 {
					t.Errorf("row %d while its handler runs: present %v, leased %v, deliveries %d; want present, no lease, 0",
						id, ok, r.AcquiredToken.Valid, r.DeliveriesCount)
				}
			}
			if got := e.claim(10, queues...); len(got) != 0 {
				t.Errorf("another claim took rows %v held by a locked claim", ids(got))
			}
			if n := e.count("outbox_locks"); n != 1 {
				t.Errorf("%d lock records, want 1", n)
			}
			close(release)
			eventually(t, "the rows deleted", func() bool { return e.count("outbox") == 0 })
			eventually(t, "the record deleted", func() bool { return e.count("outbox_locks") == 0 })
			if err := s.stop(); err != nil {
				t.Errorf("Run: %v", err)
			}
			if n := len(rec.named(EventAcked)); n != 3 {
				t.Errorf("%d acked events, want 3", n)
			}
		})
	}
}

// A handler still running when its claim's lock window ends has its row
// leased (token, expiry, one delivery counted) by the claim's end, and
// finishes under that lease: the row is delivered once and acknowledged.
func TestHandlerOutlivingTheLockWindowFinishesUnderALease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id := e.publish("q")
	release := make(chan struct{})
	var calls atomic.Int32
	rec := &events{}
	cfg := lockingConfig(rec)
	cfg.LeaseTTL = 4 * time.Second
	// A window long enough that a lease counted from the claim's start
	// (LockWindow shorter) is told from one counted from its end however
	// late the check reads it.
	cfg.LockWindow = time.Second
	s := startSub(t, e.ob, []string{"q"}, func(ctx context.Context, _ *Message[string]) error {
		calls.Add(1)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}, cfg)
	eventually(t, "the row leased", func() bool { r, ok := e.row(id); return ok && r.AcquiredToken.Valid })
	r, _ := e.row(id)
	// The lease runs LeaseTTL from the claim's end, not from its start.
	if left := r.LeaseExpiresAt.Sub(e.serverNow()); r.DeliveriesCount != 1 || left < cfg.LeaseTTL-cfg.LockWindow/2 {
		t.Errorf("leased row: deliveries %d, lease left %v; want 1 and about LeaseTTL (%v)", r.DeliveriesCount, left, cfg.LeaseTTL)
	}
	if n := e.count("outbox_locks"); n != 0 {
		t.Errorf("%d lock records after the claim ended, want 0", n)
	}
	if got := e.claim(10, "q"); len(got) != 0 {
		t.Errorf("another claim took the leased row: %v", ids(got))
	}
	close(release)
	eventually(t, "the row deleted", func() bool { return e.count("outbox") == 0 })
	if err := s.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("handler called %d times, want 1", n)
	}
	if n := len(rec.named(EventAcked)); n != 1 {
		t.Errorf("%d acked events, want 1", n)
	}
}

// A handler that finishes while its claim's end is being written (the
// lock window has passed, and the end's transaction, which leased the
// row, has not committed yet) has its outcome written once that
// transaction committed, under the lease it wrote: the row is
// acknowledged, not taken for lost and left to its lease's expiry. The
// end's commit is held by a deferred trigger that sleeps, and the handler
// returns while it sleeps.
func TestHandlerFinishingWhileItsClaimEndsIsAcknowledged(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.exec(`CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(1); RETURN NULL; END $$`)
	e.exec(`CREATE CONSTRAINT TRIGGER slow_commit AFTER UPDATE ON outbox
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
		WHEN (NEW.acquired_token IS NOT NULL) EXECUTE FUNCTION slow_commit()`)
	id := e.publish("q")
	var calls atomic.Int32
	rec := &events{}
	cfg := lockingConfig(rec)
	cfg.LockWindow = 200 * time.Millisecond
	committing := func() bool {
		var sleeping bool
		if err := e.db.Pool.QueryRow(e.ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event = 'PgSleep')`, e.db.Schema).Scan(&sleeping); err != nil {
			t.Error(err)
			return true
		}
		return sleeping
	}
	s := startSub(t, e.ob, []string{"q"}, func(ctx context.Context, _ *Message[string]) error {
		calls.Add(1)
		for !committing() {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			time.Sleep(10 * time.Millisecond)
		}
		return nil
	}, cfg)
	eventually(t, "the outcome written", func() bool {
		return len(rec.named(EventAcked))+len(rec.named(EventLeaseLost)) > 0
	})
	if lost := rec.named(EventLeaseLost); len(lost) != 0 {
		t.Errorf("lease lost: %+v", lost)
	}
	if _, ok := e.row(id); ok {
		t.Errorf("row %d left after its outcome was written", id)
	}
	if err := s.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("handler called %d times, want 1", n)
	}
}

// A locked claim that aborts (its backend ends, as when the subscriber's
// process dies) writes nothing, yet counts as a delivery of its rows: a
// row whose every delivery ends that way reaches MaxDeliveries and is
// dead-lettered, with its deliveries counted.
func TestAbortedLockedClaimsCountTowardsMaxDeliveries(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id := e.publish("q")
	seen := make(chan int, 10)
	cfg := lockingConfig(nil)
	cfg.MaxDeliveries = 2
	// The subscriber finds its claim's backend gone when the window ends;
	// the test ends the backend within the window, which a slow machine
	// needs to be more than a moment (the claim would write leases first).
	cfg.LeaseTTL, cfg.LockWindow = 6*time.Second, 3*time.Second
	s := startSub(t, e.ob, []string{"q"}, func(ctx context.Context, m *Message[string]) error {
		seen <- m.Deliveries
		<-ctx.Done()
		return context.Cause(ctx)
	}, cfg)
	var got []int
	for range 2 {
		select {
		case d := <-seen:
			got = append(got, d)
		case <-time.After(20 * time.Second):
			t.Fatalf("deliveries so far %v; timed out waiting for the next", got)
		}
		eventually(t, "the claim's backend ended", func() bool { return e.terminateLockedClaims() == 1 })
	}
	eventually(t, "the dead letter", func() bool { _, ok := e.dlqRow(id); return ok })
	eventually(t, "the aborted claims' records swept", func() bool { return e.count("outbox_locks") == 0 })
	if err := s.stop(); err != nil && !errors.Is(err, ErrGracefulTimeout) {
		t.Errorf("Run: %v", err)
	}
	close(seen)
	for d := range seen {
		got = append(got, d)
	}
	if diff := cmp.Diff([]int{1, 2}, got); diff != "" {
		t.Errorf("deliveries handled (-want +got):\n%s", diff)
	}
	dl, _ := e.dlqRow(id)
	if dl.FailureReason != ReasonMaxDeliveries || dl.DeliveriesCount != 3 {
		t.Errorf("dead letter: reason %q, deliveries %d; want %q, 3", dl.FailureReason, dl.DeliveriesCount, ReasonMaxDeliveries)
	}
}

// A subscriber whose connection stalls while it holds a locked claim
// frees the claim's rows after LeaseTTL, when the server ends the idle
// transaction, and its handler's context is cancelled before another
// subscriber starts on the row. The stall is a blackhole: the stalled
// subscriber's close of its connection never reaches the server.
func TestStalledLockedClaimFreesItsRowsAfterTheLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id := e.publish("q")
	stalledClaimIsFreedAfterTheLease(t, e, id)
	if _, ok := e.row(id); ok {
		t.Error("the row is still in the outbox")
	}
}

// stalledClaimIsFreedAfterTheLease runs a subscriber of queue q, claiming
// by lock through a proxy that blackholes its connections as its handler
// of row id starts; then, once that handler's context is cancelled,
// another subscriber, which must handle row id, and only after that
// cancellation.
func stalledClaimIsFreedAfterTheLease(t *testing.T, e *env, id int64) {
	t.Helper()
	ob, proxy := proxiedOutbox(t, e)
	var stalledCancelled, otherStarted atomic.Int64
	cfg := lockingConfig(nil)
	cfg.LeaseTTL = time.Second
	cfg.LockWindow = 500 * time.Millisecond
	cfg.QueryTimeout = 2 * time.Second
	cfg.GracefulTimeout = 500 * time.Millisecond
	stalled := startSub(t, ob, []string{"q"}, func(ctx context.Context, m *Message[string]) error {
		if m.ID == id {
			proxy.Blackhole()
		}
		<-ctx.Done()
		stalledCancelled.Store(time.Now().UnixNano())
		return context.Cause(ctx)
	}, cfg)
	eventually(t, "the stalled subscriber's handler cancelled", func() bool { return stalledCancelled.Load() != 0 })
	handled := make(chan int64, 1)
	other := startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
		if otherStarted.CompareAndSwap(0, time.Now().UnixNano()) {
			handled <- m.ID
		}
		return nil
	}, lockingConfig(nil))
	if got := waitForWithin(t, handled, "the row handled by the other subscriber", time.Minute); got != id {
		t.Errorf("the other subscriber handled row %d, want %d", got, id)
	}
	eventually(t, "the row's delivery done", func() bool { return e.undelivered("q") == 0 })
	if err := other.stop(); err != nil {
		t.Errorf("other Run: %v", err)
	}
	if c, o := stalledCancelled.Load(), otherStarted.Load(); o < c {
		t.Errorf("the other subscriber started %v before the stalled handler was cancelled", time.Duration(c-o))
	}
	// The handler's outcome waits for the claim's end, which stalls: it
	// is still waiting when the graceful timeout passes (unwritten), or the
	// end failed on its QueryTimeout first and gave it up (the row is
	// delivered again, as it was).
	if err := stalled.stop(); err != nil && !errors.Is(err, ErrGracefulTimeout) {
		t.Errorf("stalled Run: %v, want nil or ErrGracefulTimeout", err)
	}
}

// A pool of fewer than claim.MinLockingPoolConns connections, or a negative
// LockWindow, makes every claim write its lease.
func TestClaimsWriteLeasesWithoutLocking(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		maxConns int32
		window   time.Duration
	}{
		{"small pool", claim.MinLockingPoolConns - 1, 0},
		{"negative LockWindow", 0, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			ob := e.ob
			if tc.maxConns > 0 {
				pc := e.db.Pool.Config()
				pc.MaxConns = tc.maxConns
				pool, err := pgxpool.NewWithConfig(e.ctx, pc)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(pool.Close)
				if ob, err = New(pool, &Config{Schema: e.db.Schema}); err != nil {
					t.Fatal(err)
				}
			}
			id := e.publish("q")
			release := make(chan struct{})
			cfg := lockingConfig(nil)
			cfg.LockWindow = tc.window
			s := startSub(t, ob, []string{"q"}, func(context.Context, *Message[string]) error {
				<-release
				return nil
			}, cfg)
			eventually(t, "the row leased", func() bool { r, ok := e.row(id); return ok && r.AcquiredToken.Valid })
			if n := e.count("outbox_locks"); n != 0 {
				t.Errorf("%d lock records, want 0", n)
			}
			close(release)
			eventually(t, "the row deleted", func() bool { return e.count("outbox") == 0 })
			if err := s.stop(); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
}

func TestLockWindowIsAtMostHalfTheLease(t *testing.T) {
	t.Parallel()
	_, err := (&SubscriberConfig[string]{LeaseTTL: 2 * time.Second, LockWindow: 1500 * time.Millisecond}).resolve([]string{"q"})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "SubscriberConfig.LockWindow" {
		t.Fatalf("resolve: %v; want a ConfigError for SubscriberConfig.LockWindow", err)
	}
	for _, tc := range []struct {
		ttl, window, want time.Duration
	}{
		{30 * time.Second, 0, LockWindowDefault},
		{time.Second, 0, 500 * time.Millisecond},
		{time.Second, -1, -1},
	} {
		c, err := (&SubscriberConfig[string]{LeaseTTL: tc.ttl, LockWindow: tc.window}).resolve([]string{"q"})
		if err != nil || c.LockWindow != tc.want {
			t.Errorf("LeaseTTL %v, LockWindow %v: resolved %v, %v; want %v", tc.ttl, tc.window, c.LockWindow, err, tc.want)
		}
	}
}

// When its lock window ends, or the subscriber stops, a locked claim
// leases the rows whose handlers run and gives up those no worker
// started: other subscribers can take them at once, and they count no
// delivery.
func TestLockedClaimGivesUpUnstartedRows(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		window time.Duration
		stop   bool
	}{
		{"at the end of the window", 200 * time.Millisecond, false},
		{"at stop", 10 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			for range 50 {
				e.publish("q")
			}
			entered := make(chan int64, 100)
			proceed := make(chan struct{})
			cfg := lockingConfig(nil)
			cfg.Workers, cfg.FetchBatchSize, cfg.LockWindow = 1, 20, tc.window
			s := startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
				entered <- m.ID
				<-proceed
				return nil
			}, cfg)
			running := <-entered
			if tc.stop {
				s.cancel()
			}
			free := func() int { return e.countWhere("acquired_token IS NULL AND deliveries_count = 0") }
			eventually(t, "the running row leased", func() bool { r, _ := e.row(running); return r.AcquiredToken.Valid })
			eventually(t, "every other row free", func() bool { return free() == 49 })
			if got := e.claim(100, "q"); len(got) != 49 {
				t.Errorf("another claim took %d rows, want 49", len(got))
			}
			close(proceed)
			if err := s.stop(); err != nil {
				t.Fatal(err)
			}
			if _, ok := e.row(running); ok {
				t.Errorf("the running row %d is left; want it acknowledged", running)
			}
		})
	}
}

// When a locked claim's connection dies while its handler runs (its
// backend is terminated), the handler is cancelled at once, and no claim
// hands the row to another handler before the dead claim's lease would
// have expired, nor before the first handler was cancelled.
func TestRowOfAClaimWhoseConnectionDiedWaitsForItsLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id := e.publish("q")
	cfg := lockingConfig(nil)
	cfg.LeaseTTL, cfg.LockWindow = 3*time.Second, time.Second
	var firstStarted, firstCancelled, secondStarted atomic.Int64
	var calls atomic.Int32
	s := startSub(t, e.ob, []string{"q"}, func(ctx context.Context, m *Message[string]) error {
		if calls.Add(1) > 1 {
			secondStarted.Store(time.Now().UnixNano())
			return nil
		}
		firstStarted.Store(time.Now().UnixNano())
		<-ctx.Done()
		firstCancelled.Store(time.Now().UnixNano())
		if !errors.Is(context.Cause(ctx), ErrLeaseLost) {
			t.Errorf("first handler's context ended with %v, want ErrLeaseLost", context.Cause(ctx))
		}
		return context.Cause(ctx)
	}, cfg)
	eventually(t, "the first handler running", func() bool { return firstStarted.Load() != 0 })
	terminated := time.Now()
	eventually(t, "the claim's backend ended", func() bool { return e.terminateLockedClaims() == 1 })
	eventually(t, "the row handled again", func() bool { _, ok := e.row(id); return !ok })
	if err := s.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	cancelled, second := time.Unix(0, firstCancelled.Load()), time.Unix(0, secondStarted.Load())
	if late := cancelled.Sub(terminated); late > cfg.LeaseTTL/2 {
		t.Errorf("the first handler was cancelled %v after its connection died; want at once, not at its lease's end", late)
	}
	if second.Before(cancelled) {
		t.Errorf("the second delivery started %v before the first handler was cancelled", cancelled.Sub(second))
	}
	if early := time.Unix(0, firstStarted.Load()).Add(cfg.LeaseTTL - 500*time.Millisecond); second.Before(early) {
		t.Errorf("the second delivery started %v after the first; want no sooner than the lease (%v)",
			second.Sub(time.Unix(0, firstStarted.Load())), cfg.LeaseTTL)
	}
}

// A claim whose transaction ended before its record was written (its
// connection died in between) is not recorded: RecordLock says so, and
// the claim hands none of its rows to a handler, since its locks are gone
// and another claim may hold the rows already.
func TestClaimWhoseTransactionEndedIsNotRecorded(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id := e.publish("q")
	xid := e.abortedXid()
	got, err := e.ob.queries(e.db.Pool).RecordLock(e.ctx, db.RecordLockParams{Xid: xid, Lower: []int64{id}, Upper: []int64{id},
		LeaseTtlSeconds: 30})
	if err != nil {
		t.Fatal(err)
	}
	if got.Recorded || e.count("outbox_locks") != 0 {
		t.Errorf("recorded %v, %d records; want an ended claim left unrecorded", got.Recorded, e.count("outbox_locks"))
	}
}

// After a claim that found few rows, the next claim leases: a trickle of
// rows costs one statement per claim, not a transaction and a record.
func TestClaimAfterASmallClaimLeases(t *testing.T) {
	t.Parallel()
	e := setup(t)
	first := e.publish("q")
	release := make(chan struct{})
	var started atomic.Int32
	cfg := fastConfig[string](nil)
	s := startSub(t, e.ob, []string{"q"}, func(context.Context, *Message[string]) error {
		started.Add(1)
		<-release
		return nil
	}, cfg)
	eventually(t, "the first handler running", func() bool { return started.Load() == 1 })
	if r, _ := e.row(first); r.AcquiredToken.Valid {
		t.Errorf("the first claim (by lock) leased its row")
	}
	second := e.publish("q")
	eventually(t, "the second handler running", func() bool { return started.Load() == 2 })
	if r, _ := e.row(second); !r.AcquiredToken.Valid {
		t.Errorf("the claim after a one-row claim did not lease its row")
	}
	close(release)
	eventually(t, "both rows handled", func() bool { return e.count("outbox") == 0 })
	if err := s.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// LockQueueAppend, the claim's scan into a slice sized once, reads every
// column LockQueue returns, as LockQueue reads it, into rows of Lock
// naming the queue, and appends after the
// rows it is given.
func TestLockQueueAppendReadsWhatLockQueueReads(t *testing.T) {
	t.Parallel()
	e := setup(t)
	key, timer := "k", "t"
	e.publishWith(db.PublishParams{Queue: "q", Payload: []byte(`"a"`), Headers: []byte(`{"x":"y"}`), OrderingKey: &key})
	e.publishWith(db.PublishParams{Queue: "q", Payload: []byte(`"b"`), TimerID: &timer})
	third := e.publish("q")
	e.exec(`UPDATE outbox SET attempts_count = 2, deliveries_count = 3, first_attempt_at = now() - interval '1 minute' WHERE id = $1`, third)
	tx, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	q := e.ob.queries(tx)
	p := db.LockQueueParams{Queue: "q", MaxRows: 10, IdleTimeoutMs: 30000}
	want, err := q.LockQueue(e.ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != 3 {
		t.Fatalf("LockQueue locked %d rows, want 3", len(want))
	}
	before := db.LockRow{ID: -1}
	got, err := q.LockQueueAppend(e.ctx, p, append(make([]db.LockRow, 0, 4), before))
	if err != nil {
		t.Fatal(err)
	}
	wantRows := []db.LockRow{before}
	for _, w := range want {
		wantRows = append(wantRows, db.LockRow{ID: w.ID, Queue: "q", Payload: w.Payload, Headers: w.Headers,
			OrderingKey: w.OrderingKey, TimerID: w.TimerID, CreatedAt: w.CreatedAt, AttemptsCount: w.AttemptsCount,
			DeliveriesCount: w.DeliveriesCount, SinceFirstAttemptSeconds: w.SinceFirstAttemptSeconds,
			NextAttemptAt: w.NextAttemptAt, Xid: w.Xid})
	}
	if d := cmp.Diff(wantRows, got); d != "" {
		t.Errorf("LockQueueAppend (-LockQueue +LockQueueAppend):\n%s", d)
	}
}

// A locked claim hands each row over with the deliveries of the aborted
// claims that held it counted, and gives back the rows an aborted claim
// still holds: among rows it took together, each row gets its own count.
func TestLockedClaimCountsEachRowsAbortedClaims(t *testing.T) {
	t.Parallel()
	e := setup(t)
	free, held, counted := e.publish("q"), e.publish("q"), e.publish("q")
	record := `INSERT INTO outbox_locks (xid, ids, until) VALUES ($1, int8multirange(int8range($2, $2, '[]')), now() + $3 * interval '1 second')`
	e.exec(record, e.abortedXid(), held, 2)
	e.exec(record, e.abortedXid(), counted, -1)
	e.exec(record, e.abortedXid(), counted, -1)
	var (
		mu   sync.Mutex
		seen = map[int64]int{}
	)
	s := startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := seen[m.ID]; !ok {
			seen[m.ID] = m.Deliveries
		}
		return nil
	}, lockingConfig(nil))
	eventually(t, "the free and the counted rows handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) >= 2
	})
	mu.Lock()
	if d := cmp.Diff(map[int64]int{free: 1, counted: 3}, seen); d != "" {
		t.Errorf("deliveries of the rows handled first (-want +got):\n%s", d)
	}
	mu.Unlock()
	eventually(t, "the held row handled once its aborted claim's lease ran out", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == 3
	})
	if err := s.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	if d := cmp.Diff(map[int64]int{free: 1, counted: 3, held: 2}, seen); d != "" {
		t.Errorf("deliveries (-want +got):\n%s", d)
	}
}
