package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// lockRows makes a locked claim of up to n rows for r, as its fetcher
// does, and returns the ids of the rows it locked. The claim's transaction
// stays open until end is called or the test ends (the test's pool has
// few connections).
func (e *env) lockRows(c *byLock, n int32) (locked []int64, end func()) {
	e.t.Helper()
	tx, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	end = func() { _ = tx.Rollback(context.Background()) }
	e.t.Cleanup(end)
	got, err := c.lockRows(e.ctx, e.queries(tx), n, 30000)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, g := range got {
		locked = append(locked, g.ID)
	}
	return locked, end
}

// A locked claim made while the subscriber's last one is open, and took
// all it asked for, looks past that claim's last row; rows before it that
// no claim holds (here a row dated an hour early) wait for a claim that
// looks from the start: one made when no other claim is open, one that
// found nothing past the position (it looks again from the start), and
// the first one LockWindow after
// the last look from the start.
func TestLockedClaimLooksPastTheOpenClaimAndFromTheStartEveryWindow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := e.subscriber("q")
	r := newRun(e.ctx, cfg)
	c := r.claims.(*byLock)
	var rows []int64
	for range 6 {
		rows = append(rows, e.publish("q"))
	}
	want := func(what string, want []int64) func() {
		t.Helper()
		got, end := e.lockRows(c, 2)
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("%s: locked rows (-want +got):\n%s", what, d)
		}
		return end
	}
	r.locks <- struct{}{} // the claim being made
	end1 := want("first claim, none open", rows[0:2])
	r.locks <- struct{}{} // the last claim stays open
	var early int64
	if err := e.db.Pool.QueryRow(e.ctx, `INSERT INTO outbox (queue, payload, next_attempt_at)
		VALUES ('q', '"early"', now() - interval '1 hour') RETURNING id`).Scan(&early); err != nil {
		t.Fatal(err)
	}
	end2 := want("claim while the last is open", rows[2:4])
	c.frontLocked = time.Now().Add(-cfg.LockWindow)
	end3 := want("claim a window after the last look from the start", []int64{early, rows[4]})
	end1()
	end2()
	end4 := want("claim past that one", rows[5:6])
	end5 := want("claim after one that found fewer than it asked for", rows[0:2])
	for _, end := range []func(){end3, end4, end5} {
		end()
	}
	c.lockedUpTo = map[string]lockCursor{"q": {at: time.Now().Add(time.Hour)}}
	c.frontLocked = time.Now()
	want("claim that found nothing past the position", []int64{early, rows[0]})()
	<-r.locks
	c.lockedUpTo = map[string]lockCursor{"q": {at: time.Now().Add(time.Hour)}}
	want("claim while no other is open", []int64{early, rows[0]})()
}

// A locked claim of several queues locks only the rows it hands out, an
// equal share of each queue first and then, past what it has, more of the
// queues that had more, in Claim's ranking within each statement; while
// it stays open, the next claim starts each queue past what it took.
func TestLockedClaimOfSeveralQueuesLocksOnlyWhatItHandsOut(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := newRun(e.ctx, e.subscriber("a", "b")).claims.(*byLock)
	var a, b []int64
	for range 10 {
		a = append(a, e.publish("a"))
	}
	for range 2 {
		b = append(b, e.publish("b"))
	}
	lock := func(n int32) []int64 {
		t.Helper()
		locked, _ := e.lockRows(c, n)
		return locked
	}
	// free counts the rows of both queues no transaction has locked.
	free := func() int {
		t.Helper()
		tx, err := e.db.Pool.Begin(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		var n int
		if err := tx.QueryRow(e.ctx, `SELECT count(*) FROM (SELECT id FROM outbox WHERE queue IN ('a', 'b') FOR UPDATE SKIP LOCKED) AS f`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	c.r.locks <- struct{}{} // the claim being made
	want := []int64{a[0], b[0], a[1], b[1], a[2], a[3]}
	if d := cmp.Diff(want, lock(6)); d != "" {
		t.Errorf("first claim (-want +got):\n%s", d)
	}
	if n := free(); n != 6 {
		t.Errorf("%d rows free after a claim that handed out 6 of 12; want 6", n)
	}
	c.r.locks <- struct{}{} // the first claim stays open
	if d := cmp.Diff([]int64{a[4], a[5]}, lock(2)); d != "" {
		t.Errorf("claim while the first is open (-want +got):\n%s", d)
	}
}

// newClaimer is the one place that chooses how a run claims: the
// default mixes claims by lock and by lease, a negative LockWindow (and
// so a transactional subscriber) or a pool too small to lock claims by
// lease, and MinLockedClaim 0 by lock only.
func TestNewClaimerChoosesInOnePlace(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, tc := range []struct {
		name string
		set  func(s *Subscriber)
		want string
	}{
		{"defaults", func(s *Subscriber) { s.MinLockedClaim = 32 }, "*engine.mixed"},
		{"negative LockWindow", func(s *Subscriber) { s.MinLockedClaim, s.LockWindow = 32, -1 }, "*engine.byLease"},
		{"transactional", func(s *Subscriber) { s.MinLockedClaim, s.LockWindow, s.Tx = 32, -1, true }, "*engine.byLease"},
		{"small pool", func(s *Subscriber) { s.MinLockedClaim, s.Pool = 32, e.pool(MinLockingPoolConns-1) }, "*engine.byLease"},
		{"by lock only", func(s *Subscriber) { s.MinLockedClaim = 0 }, "*engine.byLock"},
	} {
		s := e.subscriber("q")
		tc.set(s)
		if got := fmt.Sprintf("%T", newRun(e.ctx, s).claims); got != tc.want {
			t.Errorf("%s: claims with %s; want %s", tc.name, got, tc.want)
		}
	}
}
