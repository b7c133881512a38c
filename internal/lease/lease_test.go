package lease

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
)

func testToken(b byte) pgtype.UUID { return pgtype.UUID{Bytes: [16]byte{b}, Valid: true} }

// The local lease counts from when the claim or heartbeat was sent, not
// from when its answer arrived: the server stamped the expiry in between,
// so an answer that comes late (a loaded client) must not leave the
// handler a lease the server has already let go.
func TestLocalLeaseCountsFromTheStatementsSending(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	l := NewTracker(ttl)
	late := l.Add(context.Background(), []db.ClaimRow{{ID: 1}}, testToken(1), time.Now().Add(-ttl))[0]
	// At once, before the expiry timer's goroutine could have run.
	if l.StartIn(late, late.Batch.Ctx) {
		t.Fatal("a handler started on a lease that had run out before its claim's answer came")
	}
	select {
	case <-late.Batch.Ctx.Done():
	case <-time.After(ttl / 2):
		t.Fatal("a claim answered a whole lease after it was sent left the delivery's lease running")
	}
	if !errors.Is(context.Cause(late.Batch.Ctx), ErrLeaseLost) {
		t.Errorf("cause %v, want ErrLeaseLost", context.Cause(late.Batch.Ctx))
	}
	if l.StartIn(late, late.Batch.Ctx) {
		t.Error("a handler started on a lease that ran out")
	}
	l.Remove(late)

	held := l.Add(context.Background(), []db.ClaimRow{{ID: 2}}, testToken(2), time.Now())[0]
	if !l.StartIn(held, held.Batch.Ctx) {
		t.Fatal("a handler could not start on a fresh lease")
	}
	ds, _, _ := l.Snapshot()
	l.Extended([]Lease{held.Lease()}, ds, time.Now().Add(-ttl+100*time.Millisecond))
	select {
	case <-held.Ctx.Done():
	case <-time.After(ttl / 2):
		t.Fatal("a heartbeat answered late extended the local lease past the server's")
	}
	if !errors.Is(context.Cause(held.Ctx), ErrLeaseLost) {
		t.Errorf("cause %v, want ErrLeaseLost", context.Cause(held.Ctx))
	}
	l.Remove(held)

	// A lease renewed by a statement answered after the lease's end
	// (a locked claim's end) lets no handler of its batch start, though
	// the expiry timer's goroutine may not have run yet.
	two := l.Add(context.Background(), []db.ClaimRow{{ID: 3}, {ID: 4}}, testToken(3), time.Now())
	if !l.StartIn(two[0], two[0].Batch.Ctx) {
		t.Fatal("a handler could not start on a fresh lease")
	}
	l.Renew(two[0].Batch, time.Now().Add(-ttl))
	if l.StartIn(two[1], two[1].Batch.Ctx) {
		t.Error("a handler started on a lease renewed by an answer that came after the lease's end")
	}
	l.Remove(two[0])
	l.Remove(two[1])
}

// A handler's context is cancelled a margin before its lease ends, so the
// cancellation reaches it before another claim can take the row: never
// before LeaseTTL less the margin from the claim's sending, and before
// LeaseTTL itself.
func TestHandlerIsCancelledAMarginBeforeItsLeaseEnds(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	l := NewTracker(ttl)
	sent := time.Now()
	d := l.Add(context.Background(), []db.ClaimRow{{ID: 1}}, testToken(1), sent)[0]
	defer l.Remove(d)
	<-d.Batch.Ctx.Done()
	took := time.Since(sent)
	if margin := Margin(ttl); took < ttl-margin || took >= ttl {
		t.Errorf("cancelled %v after the claim was sent; want from %v and before %v", took, ttl-margin, ttl)
	}
}

// The rows of one claim share its token and lease deadline, but a
// heartbeat that finds one of them taken cancels only that row's
// handler; the others run on, extended.
func TestHeartbeatLossCancelsOnlyItsRow(t *testing.T) {
	t.Parallel()
	l := NewTracker(time.Hour)
	ds := l.Add(context.Background(), []db.ClaimRow{{ID: 1}, {ID: 2}, {ID: 3}}, testToken(1), time.Now())
	for _, d := range ds[:2] {
		if !l.StartIn(d, d.Batch.Ctx) {
			t.Fatalf("row %d: handler could not start", d.Row.ID)
		}
	}
	tried, _, _ := l.Snapshot()
	lost := l.Extended([]Lease{{2, testToken(1)}}, tried, time.Now())
	var lostIDs []int64
	for _, d := range lost {
		lostIDs = append(lostIDs, d.Row.ID)
	}
	slices.Sort(lostIDs)
	if diff := cmp.Diff([]int64{1, 3}, lostIDs); diff != "" {
		t.Errorf("lost (-want +got):\n%s", diff)
	}
	if !errors.Is(context.Cause(ds[0].Ctx), ErrLeaseLost) {
		t.Errorf("started row 1: cause %v, want ErrLeaseLost", context.Cause(ds[0].Ctx))
	}
	if err := ds[1].Ctx.Err(); err != nil {
		t.Errorf("extended row 2: context ended: %v", context.Cause(ds[1].Ctx))
	}
	if l.StartIn(ds[2], ds[2].Batch.Ctx) {
		t.Error("row 3, found taken before it started, started all the same")
	}
	for _, d := range ds {
		l.Remove(d)
	}
	if n := l.Held(); n != 0 {
		t.Errorf("%d deliveries held after every one was removed", n)
	}
}

// One run can hold two deliveries of one row (its lease expired and its
// own next claim took the row back). Finishing the stale first must leave
// the second tracked, extended and not lost.
func TestRedeliveryOfOneRowIsTrackedByItsToken(t *testing.T) {
	t.Parallel()
	l := NewTracker(time.Hour)
	first := l.Add(context.Background(), []db.ClaimRow{{ID: 7}}, testToken(1), time.Now())[0]
	second := l.Add(context.Background(), []db.ClaimRow{{ID: 7}}, testToken(2), time.Now())[0]
	if !l.StartIn(second, second.Batch.Ctx) {
		t.Fatal("second delivery could not start")
	}
	l.Remove(first)

	ds, ids, toks := l.Snapshot()
	if diff := cmp.Diff([]int64{7}, ids); diff != "" || !cmp.Equal(toks, []pgtype.UUID{testToken(2)}) {
		t.Fatalf("held after the first finished: %v %v (-want +got ids: %s)", ids, toks, diff)
	}
	if lost := l.Extended([]Lease{{7, testToken(2)}}, ds, time.Now()); len(lost) != 0 || l.IsLost(second) {
		t.Errorf("second delivery reported lost: %v", lost)
	}
	if second.Ctx.Err() != nil {
		t.Errorf("second delivery's context ended: %v", context.Cause(second.Ctx))
	}
	l.Remove(second)
}

// A heartbeat leaves out the rows of a locked claim whose end is writing
// their leases until that end commits: run on another connection, its
// statement would not find the uncommitted leases and take them for
// lost, cancelling handlers that hold their rows (seen through PgBouncer,
// whose extra hop widens the window). After the commit they are extended
// like any lease.
func TestHeartbeatWaitsForALockedClaimsLeasesToCommit(t *testing.T) {
	t.Parallel()
	l := NewTracker(time.Minute)
	ds := l.AddEach(t.Context(), 2, func(i int, r *db.ClaimRow) { r.ID = int64(i + 1) }, pgtype.UUID{}, time.Now())
	if !l.StartIn(ds[0], ds[0].Batch.Ctx) {
		t.Fatal("the handler of row 1 did not start")
	}
	snapshotIDs := func() []int64 {
		_, ids, _ := l.Snapshot()
		return ids
	}
	if ids := snapshotIDs(); len(ids) != 0 {
		t.Errorf("a heartbeat extends rows held by lock: %v", ids)
	}
	token := testToken(9)
	running := l.LeaseStarted(ds, nil, token)
	if len(running) != 1 || running[0] != ds[0] {
		t.Fatalf("rows leased at the claim's end: %v, want row 1's", running)
	}
	if ids := snapshotIDs(); len(ids) != 0 {
		t.Errorf("a heartbeat extends leases the claim's end has not committed: %v", ids)
	}
	l.Renew(ds[0].Batch, time.Now())
	if diff := cmp.Diff([]int64{1}, snapshotIDs()); diff != "" {
		t.Errorf("a heartbeat after the end committed (-want +got):\n%s", diff)
	}
	ds[0].Batch.expiry.Stop()
}
