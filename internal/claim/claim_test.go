package claim

import (
	"context"
	"fmt"
	"slices"
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
	tx, err := e.DB.Pool.Begin(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	end = func() { _ = tx.Rollback(context.Background()) }
	e.t.Cleanup(end)
	got, err := c.lockRows(e.ctx, e.Queries(tx), n, 30000)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, g := range got {
		locked = append(locked, g.ID)
	}
	return locked, end
}

// A locked claim made while the subscriber's last one is open, and took
// all it asked for, looks past that claim's last row; the others look from
// the queue's floor, FloorMargin before the newest row the last claim
// took. A row behind the floor (here one dated an hour early) waits for a
// claim that reads from the queue's start: the first one, one every
// MaxFetchInterval, and the next one after a hand-over was completed.
func TestLockedClaimLooksPastTheOpenClaimAndFromTheFloorSweepingEveryMaxFetchInterval(t *testing.T) {
	t.Parallel()
	e := setup(t)
	env := e.env("q")
	c := New(env).(*byLock)
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
	sweepDue := func() {
		c.lease.floors.mu.Lock()
		c.lease.floors.swept = time.Now().Add(-env.MaxFetchInterval)
		c.lease.floors.mu.Unlock()
	}
	c.locks <- struct{}{} // the claim being made
	end1 := want("first claim, from the start", rows[0:2])
	c.locks <- struct{}{} // the last claim stays open
	var early int64
	if err := e.DB.Pool.QueryRow(e.ctx, `INSERT INTO outbox (queue, payload, next_attempt_at)
		VALUES ('q', '"early"', now() - interval '1 hour') RETURNING id`).Scan(&early); err != nil {
		t.Fatal(err)
	}
	end2 := want("claim while the last is open", rows[2:4])
	c.frontLocked = time.Now().Add(-env.LockWindow)
	end3 := want("claim a window later, from the floor", rows[4:6])
	for _, end := range []func(){end1, end2, end3} {
		end()
	}
	sweepDue()
	want("claim MaxFetchInterval after the last from the start", []int64{early, rows[0]})()
	<-c.locks
	want("claim from the floor the last one left", rows[0:2])()
	c.Behind()
	want("claim after a hand-over was completed", []int64{early, rows[0]})()
}

// A locked claim of several queues locks only the rows it hands out, an
// equal share of each queue first and then, past what it has, more of the
// queues that had more, in Claim's ranking within each statement; while
// it stays open, the next claim starts each queue past what it took.
func TestLockedClaimOfSeveralQueuesLocksOnlyWhatItHandsOut(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := New(e.env("a", "b")).(*byLock)
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
	c.locks <- struct{}{} // the claim being made
	want := []int64{a[0], b[0], a[1], b[1], a[2], a[3]}
	if d := cmp.Diff(want, lock(6)); d != "" {
		t.Errorf("first claim (-want +got):\n%s", d)
	}
	if n := e.unlocked(); n != 6 {
		t.Errorf("%d rows free after a claim that handed out 6 of 12; want 6", n)
	}
	c.locks <- struct{}{} // the first claim stays open
	if d := cmp.Diff([]int64{a[4], a[5]}, lock(2)); d != "" {
		t.Errorf("claim while the first is open (-want +got):\n%s", d)
	}
}

// A locked claim of fewer rows than it has queues locks only the rows it
// hands out, one of each of as many queues as it asks rows of, the queues
// taking turns; a queue that has none leaves its row to another. Every
// row is taken by a claim after it, none passed by.
func TestLockedClaimOfFewerRowsThanQueuesLocksOnlyWhatItHandsOut(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := New(e.env("a", "b", "c")).(*byLock)
	var a, b []int64
	for range 2 {
		a = append(a, e.publish("a"))
		b = append(b, e.publish("b"))
	}
	// The second claim asks a row of b and of c, which has none, and
	// takes b's next row in its place; the third has a's turn.
	handed := 0
	for i, want := range [][]int64{{a[0]}, {b[0], b[1]}, {a[1]}} {
		if i == InFlight {
			<-c.locks // a place among the claims in flight
		}
		c.locks <- struct{}{} // the claims stay open
		locked, _ := e.lockRows(c, int32(len(want)))
		if d := cmp.Diff(want, locked); d != "" {
			t.Errorf("claim %d of %d rows (-want +got):\n%s", i+1, len(want), d)
		}
		handed += len(locked)
		if n := e.unlocked(); n != 4-handed {
			t.Errorf("%d rows free after claims that handed out %d of 4; want %d", n, handed, 4-handed)
		}
	}
}

// New is the one place that chooses how a run claims: the default
// mixes claims by lock and by lease, a negative LockWindow (a
// transactional subscriber's too) or a pool too small to lock claims by
// lease, and MinLockedClaim 0 by lock only.
func TestNewChoosesInOnePlace(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, tc := range []struct {
		name string
		set  func(env *Env)
		want string
	}{
		{"defaults", func(env *Env) { env.MinLockedClaim = 32 }, "*claim.mixed"},
		{"negative LockWindow", func(env *Env) { env.MinLockedClaim, env.LockWindow = 32, -1 }, "*claim.byLease"},
		{"small pool", func(env *Env) { env.MinLockedClaim, env.Pool = 32, e.pool(MinLockingPoolConns-1) }, "*claim.byLease"},
		{"by lock only", func(env *Env) { env.MinLockedClaim = 0 }, "*claim.byLock"},
	} {
		env := e.env("q")
		tc.set(env)
		if got := fmt.Sprintf("%T", New(env)); got != tc.want {
			t.Errorf("%s: claims with %s; want %s", tc.name, got, tc.want)
		}
	}
}

// A row goes to one live claim at a time: while one claim holds rows,
// another claimer's claim takes none of them, and takes the rest.
func TestClaimerHandsARowToOneClaimAtATime(t *testing.T) {
	t.Parallel()
	forEachKind(t, func(t *testing.T, e *env, set func(*Env)) {
		var rows []int64
		for range 40 {
			rows = append(rows, e.publish("q"))
		}
		a, b := e.harness(set, "q"), e.harness(set, "q")
		if n, err := a.Claim(e.ctx, 25); err != nil || n != 25 {
			t.Fatalf("first claim: %d rows, %v; want 25", n, err)
		}
		if n, err := b.Claim(e.ctx, 25); err != nil || n != 15 {
			t.Fatalf("second claim: %d rows, %v; want the 15 the first left", n, err)
		}
		got := append(a.ids(), b.ids()...)
		slices.Sort(got)
		if !slices.Equal(got, rows) {
			t.Errorf("the two claims hold %v; want each row once: %v", got, rows)
		}
	})
}

// A claim by lock that ends with no handler started (its window passed)
// gives its rows back at once, and another claimer takes them; a claim by
// lease keeps them until its lease expires.
func TestClaimerGivesBackUnstartedRowsOnlyByLock(t *testing.T) {
	t.Parallel()
	forEachKind(t, func(t *testing.T, e *env, set func(*Env)) {
		for range 5 {
			e.publish("q")
		}
		a := e.harness(set, "q")
		if n, err := a.Claim(e.ctx, 5); err != nil || n != 5 {
			t.Fatalf("claim: %d rows, %v; want 5", n, err)
		}
		a.stop()
		b := e.harness(set, "q")
		n, err := b.Claim(e.ctx, 5)
		if err != nil {
			t.Fatal(err)
		}
		want := 5
		if fmt.Sprintf("%T", a.Claimer) == "*claim.byLease" {
			want = 0
		}
		if n != want {
			t.Errorf("after the first claimer stopped, another took %d rows; want %d", n, want)
		}
	})
}

func TestRunsCoverExactlyTheIDs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ids          []int64
		lower, upper []int64
	}{
		{nil, nil, nil},
		{[]int64{5}, []int64{5}, []int64{5}},
		{[]int64{3, 1, 2, 7, 9, 8, 8}, []int64{1, 7}, []int64{3, 9}},
		{[]int64{10, 12, 14}, []int64{10, 12, 14}, []int64{10, 12, 14}},
	} {
		lower, upper := Runs(tc.ids)
		if diff := cmp.Diff([][]int64{tc.lower, tc.upper}, [][]int64{lower, upper}); diff != "" {
			t.Errorf("Runs(%v) (-want +got):\n%s", tc.ids, diff)
		}
	}
}
