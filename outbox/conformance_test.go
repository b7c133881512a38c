package outbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/childtest"
	"github.com/outboxgen/outboxgen/internal/faultproxy"
)

// The promises of README "What it promises" that concern claims, each run
// three ways, one per claim.Claimer that claim.New chooses: with the
// public defaults, whose claimer (mixed) mixes claims by lock (for a
// backlog of minLockedClaimDefault rows or more) with claims by lease; by
// lease only (byLease: LockWindow < 0, a public setting); and by lock
// only (byLock: an unexported switch, for this suite only). The run with
// the public defaults is the proof of each promise; the other two show
// that each implementation keeps it alone. The claim package's tests
// check that these settings choose those claimers.

// claimPath is one way a subscriber claims rows.
type claimPath string

const (
	pathDefaults claimPath = "defaults"
	pathLease    claimPath = "lease"
	pathLock     claimPath = "lock"
)

var claimPaths = []claimPath{pathDefaults, pathLease, pathLock}

// onPath sets cfg to claim the way p says, and returns it.
func onPath[T any](p claimPath, cfg *SubscriberConfig[T]) *SubscriberConfig[T] {
	switch p {
	case pathLease:
		cfg.LockWindow = -1
	case pathLock:
		cfg.minLockedClaim = -1
	}
	return cfg
}

// forEachClaimPath runs test as a parallel subtest for every claim path.
func forEachClaimPath(t *testing.T, test func(t *testing.T, p claimPath)) {
	t.Helper()
	for _, p := range claimPaths {
		t.Run(string(p), func(t *testing.T) {
			t.Parallel()
			test(t, p)
		})
	}
}

// span is when a handler of a row could still write its outcome: from its
// start until it returned or its context ended, whichever came first.
type span struct {
	who        string
	start, end time.Time
}

// spans records the spans of handlers, per row.
type spans struct {
	mu   sync.Mutex
	rows map[int64][]span
	// work counts the handlers' work still running, which may outlive the
	// handler's context.
	work sync.WaitGroup
}

// handle runs work as a handler of row id named who, recording its span
// as soon as it ends: when work returned or ctx ended, whichever was
// first. The handler returns what work returns.
func (s *spans) handle(ctx context.Context, who string, id int64, work func() error) error {
	start := time.Now()
	done := make(chan error, 1)
	s.work.Go(func() { done <- work() })
	var err error
	select {
	case err = <-done:
		s.add(id, span{who: who, start: start, end: time.Now()})
	case <-ctx.Done():
		s.add(id, span{who: who, start: start, end: time.Now()})
		err = <-done
	}
	return err
}

func (s *spans) add(id int64, sp span) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rows == nil {
		s.rows = make(map[int64][]span)
	}
	s.rows[id] = append(s.rows[id], sp)
}

// overlaps returns every pair of spans of one row that overlap in time.
func (s *spans) overlaps() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for id, ss := range s.rows {
		for i := range ss {
			for j := i + 1; j < len(ss); j++ {
				a, b := ss[i], ss[j]
				if a.start.Before(b.end) && b.start.Before(a.end) {
					out = append(out, fmt.Sprintf("row %d: %s [%v] and %s [%v] overlap (started %v apart)", id,
						a.who, a.end.Sub(a.start), b.who, b.end.Sub(b.start), b.start.Sub(a.start)))
				}
			}
		}
	}
	return out
}

// halfOpenOutbox returns an outbox of e's schema whose connections go
// through a proxy that can leave them half-open.
func halfOpenOutbox(t *testing.T, e *env) (*Outbox, *faultproxy.Proxy) {
	t.Helper()
	return proxiedOutbox(t, e)
}

// One live claim per row, and no stale write, through a half-open
// connection: subscriber A's handler runs while every connection of A
// goes half-open (the server ended its session and transaction, A cannot
// tell). Subscriber B, with the same settings, must not start the row
// while A's handler could still write its outcome; A's handler, which
// goes on after its context ends and then reports success, must not
// delete the row B rescheduled.
func TestClaimPromiseOneLiveClaimThroughAHalfOpenConnection(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		halfOpenHandOver(t, p, p)
	})
}

// The mixture the defaults make, taken apart: a row held by a dead claim
// by lock is not handed out by a subscriber that claims by lease before
// its hold ends.
func TestRowHeldByADeadClaimByLockIsNotLeasedBeforeItsHoldEnds(t *testing.T) {
	t.Parallel()
	halfOpenHandOver(t, pathLock, pathLease)
}

func halfOpenHandOver(t *testing.T, pathA, pathB claimPath) {
	e := setup(t)
	id := e.publish("q")
	obA, proxy := halfOpenOutbox(t, e)
	var sp spans
	started := make(chan struct{})
	// retried closes when B's retry of the row (or A's acknowledgement)
	// is seen. A's handler, which goes on after its context ends, reports
	// success then, or after 5 s: B's retry may wait for it.
	retried := make(chan struct{})
	var once sync.Once
	cfgA := onPath(pathA, fastConfig[string](nil))
	// A's graceful timeout outlasts its query timeout: stopping A waits
	// until its late write of the success has landed or failed.
	cfgA.LeaseTTL, cfgA.QueryTimeout, cfgA.GracefulTimeout = 3*time.Second, 2*time.Second, 3*time.Second
	a := startSub(t, obA, []string{"q"}, func(ctx context.Context, m *Message[string]) error {
		return sp.handle(ctx, "A", m.ID, func() error {
			once.Do(func() { close(started) })
			select {
			case <-retried:
			case <-time.After(5 * time.Second):
			}
			return nil
		})
	}, cfgA)
	waitFor(t, started, "A's handler running")
	if n, _ := proxy.HalfOpen(); n == 0 {
		t.Fatal("no connection of A to leave half-open")
	}
	cfgB := onPath(pathB, fastConfig[string](nil))
	b := startSub(t, e.ob, []string{"q"}, func(ctx context.Context, m *Message[string]) error {
		return sp.handle(ctx, "B", m.ID, func() error { return RetryAfter(errors.New("later"), time.Hour) })
	}, cfgB)
	eventually(t, "B's retry of the row, or A's acknowledgement", func() bool {
		r, ok := e.row(id)
		return !ok || r.AttemptsCount > 0
	})
	close(retried)
	// A's handler returns and A writes its success, or gives up on it
	// within its graceful timeout, before its Run returns.
	sp.work.Wait()
	if err := a.stop(); err != nil && !errors.Is(err, ErrGracefulTimeout) {
		t.Errorf("A's Run: %v", err)
	}
	if err := b.stop(); err != nil {
		t.Errorf("B's Run: %v", err)
	}
	if o := sp.overlaps(); len(o) > 0 {
		t.Errorf("two live deliveries of one row:\n%v", o)
	}
	sp.mu.Lock()
	handlers := sp.rows[id]
	sp.mu.Unlock()
	r, ok := e.row(id)
	for _, h := range handlers {
		t.Logf("%s handled the row from %v for %v", h.who, h.start.Format("15:04:05.000"), h.end.Sub(h.start))
	}
	last := handlers[0]
	for _, h := range handlers {
		if h.start.After(last.start) {
			last = h
		}
	}
	switch last := last.who; {
	case last == "B" && (!ok || r.AttemptsCount != 1):
		t.Errorf("B rescheduled the row last; the row: %v, attempts %d (a stale write landed)", ok, r.AttemptsCount)
	case last == "A" && ok:
		t.Errorf("A handled the row last and kept its claim, yet the row is still there (attempts %d)", r.AttemptsCount)
	}
}

// crashChild* configure a subscriber process of
// TestClaimPromiseMaxDeliveriesCountsCrashes.
const (
	crashChildDSN    = "OUTBOX_CRASH_CHILD_DSN"
	crashChildSchema = "OUTBOX_CRASH_CHILD_SCHEMA"
	crashChildPath   = "OUTBOX_CRASH_CHILD_PATH"
)

// runCrashChild runs a subscriber of the queue "crash" whose handler
// records the delivery count it was given and then SIGKILLs its own
// process.
func runCrashChild() error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(crashChildDSN))
	if err != nil {
		return err
	}
	ob, err := New(pool, &Config{Schema: os.Getenv(crashChildSchema)})
	if err != nil {
		return err
	}
	cfg := onPath(claimPath(os.Getenv(crashChildPath)), &SubscriberConfig[string]{
		LeaseTTL: time.Second, MaxDeliveries: 3, MinFetchInterval: 10 * time.Millisecond, MaxFetchInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	sub, err := NewSubscriber(ob, []string{"crash"}, func(ctx context.Context, m *Message[string]) error {
		if _, err := pool.Exec(ctx, `INSERT INTO crashes (deliveries) VALUES ($1)`, m.Deliveries); err != nil {
			return err
		}
		return syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}, cfg)
	if err != nil {
		return err
	}
	return sub.Run(ctx)
}

// MaxDeliveries counts every delivery, those that crashed their process
// too: a handler that kills its process every time runs MaxDeliveries (3)
// times, sees Message.Deliveries 1, 2, 3, and its row is dead-lettered.
func TestClaimPromiseMaxDeliveriesCountsCrashes(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		e := setup(t)
		e.exec(`CREATE TABLE crashes (n serial PRIMARY KEY, deliveries integer NOT NULL)`)
		id := e.publish("crash")
		for child := 0; ; child++ {
			if _, ok := e.dlqRow(id); ok {
				break
			}
			if child == 5 {
				t.Fatalf("the row is not dead-lettered after %d crashed processes", child)
			}
			before := e.count("crashes")
			c := childtest.Start(t, crashChildDSN+"="+e.db.URL, crashChildSchema+"="+e.db.Schema, crashChildPath+"="+string(p))
			var dead bool
			eventually(t, "the child's handler or the dead letter", func() bool {
				_, dead = e.dlqRow(id)
				return dead || e.count("crashes") > before
			})
			if dead {
				c.Kill(t) // it dead-lettered the row and runs on
			} else {
				_ = c.Wait() // its handler killed it
			}
		}
		var got []int
		rows, err := e.db.Pool.Query(e.ctx, `SELECT deliveries FROM crashes ORDER BY n`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var d int
			if err := rows.Scan(&d); err != nil {
				t.Fatal(err)
			}
			got = append(got, d)
		}
		if diff := cmp.Diff([]int{1, 2, 3}, got); diff != "" {
			t.Errorf("Message.Deliveries of the handler's runs (-want +got):\n%s", diff)
		}
		dl, _ := e.dlqRow(id)
		if dl.FailureReason != ReasonMaxDeliveries || dl.DeliveriesCount != 4 {
			t.Errorf("dead letter: reason %q, deliveries %d; want %q, 4", dl.FailureReason, dl.DeliveriesCount, ReasonMaxDeliveries)
		}
	})
}

// Per-key order and one live delivery per key: two subscribers drain 40
// keys of 25 rows each; each key's rows are handled one at a time, in
// publishing order.
func TestClaimPromisePerKeyOrder(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		e := setup(t)
		const keys, per = 40, 25
		pub := newPublisher[int](t, e, "keyed", nil)
		for i := range per {
			tx, err := e.db.Pool.Begin(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			for k := range keys {
				if _, err := pub.Publish(e.ctx, tx, i, &PublishOpts{OrderingKey: strconv.Itoa(k)}); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(e.ctx); err != nil {
				t.Fatal(err)
			}
		}
		var (
			mu      sync.Mutex
			running = map[string]int{}
			seen    = map[string][]int{}
			bad     []string
		)
		var subs []*started
		for range 2 {
			cfg := onPath(p, fastConfig[int](nil))
			cfg.FetchBatchSize = 64
			subs = append(subs, startSub(t, e.ob, []string{"keyed"}, func(_ context.Context, m *Message[int]) error {
				k := m.OrderingKey
				mu.Lock()
				running[k]++
				if running[k] > 1 {
					bad = append(bad, fmt.Sprintf("key %s: two handlers at once", k))
				}
				seen[k] = append(seen[k], m.Payload)
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
				running[k]--
				mu.Unlock()
				return nil
			}, cfg))
		}
		eventually(t, "an empty outbox", func() bool { return e.count("outbox") == 0 })
		for _, s := range subs {
			if err := s.stop(); err != nil {
				t.Errorf("Run: %v", err)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if len(bad) > 0 {
			t.Errorf("%v", bad)
		}
		want := make([]int, per)
		for i := range want {
			want[i] = i
		}
		for k := range keys {
			if diff := cmp.Diff(want, seen[strconv.Itoa(k)]); diff != "" {
				t.Errorf("key %d handled out of order (-want +got):\n%s", k, diff)
			}
		}
	})
}

// A bounded stop that leaves no row leased by nobody: a claim statement in
// flight when Run's context ends is waited for, and what it took is given
// back before Run returns. Here the claim waits, on the server, for a
// table lock held by a transaction that publishes a row and commits just
// after Run's context ended; once Run has returned and no claim of the
// subscriber runs on the server, the row is not leased.
func TestClaimPromiseStopLeavesNoRowLeasedByNobody(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		e := setup(t)
		app := "stop-" + string(p) + "-" + e.db.Schema
		ob := e.outboxOn(func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = app })
		cfg := onPath(p, fastConfig[string](nil))
		cfg.MinFetchInterval, cfg.MaxFetchInterval = time.Millisecond, 5*time.Millisecond
		handled := make(chan int64, 1)
		s := startSub(t, ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
			handled <- m.ID
			return nil
		}, cfg)
		// Claims of the subscriber waiting for the table lock (with the
		// ring beside the table, a claim by lease first moves the ring's
		// keyed rows into the table).
		waiting := func() int {
			var n int
			if err := e.db.Pool.QueryRow(e.ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE application_name = $1 AND wait_event_type = 'Lock' AND query ~ '-- name: (Claim|ClaimQueue|Lock|LockQueue|ClaimExpired|Ring\w+) '`,
				app).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		tx, err := e.db.Pool.Begin(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		if _, err := tx.Exec(e.ctx, `LOCK TABLE outbox IN EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
		var id int64
		if err := tx.QueryRow(e.ctx, `INSERT INTO outbox (queue, payload) VALUES ('q', '{}') RETURNING id`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		eventually(t, "a claim waiting for the table lock", func() bool { return waiting() > 0 })
		stopped := make(chan error, 1)
		go func() { stopped <- s.stop() }()
		time.Sleep(200 * time.Millisecond) // Run's context has ended
		if err := tx.Commit(e.ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-stopped; err != nil {
			t.Errorf("Run: %v", err)
		}
		eventually(t, "no claim of the subscriber running on the server", func() bool {
			var n int
			if err := e.db.Pool.QueryRow(e.ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE application_name = $1 AND state = 'active'`, app).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == 0
		})
		select {
		case got := <-handled:
			t.Logf("row %d was handled before the stop", got)
		default:
			r, ok := e.row(id)
			if !ok {
				t.Fatal("the row is gone, yet no handler ran")
			}
			if r.AcquiredToken.Valid {
				t.Errorf("the row is leased (until %v) by a subscriber that has stopped", r.LeaseExpiresAt)
			}
			if n := e.count("outbox_locks"); n != 0 {
				t.Errorf("%d lock records left by a subscriber that has stopped", n)
			}
		}
	})
}
