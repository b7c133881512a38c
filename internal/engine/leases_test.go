package engine

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
)

// events records metric events.
type events struct {
	mu  sync.Mutex
	evs []MetricEvent
}

func (e *events) Record(ev MetricEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.evs = append(e.evs, ev)
}

func (e *events) all() []MetricEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]MetricEvent(nil), e.evs...)
}

// The local lease counts from when the claim or heartbeat was sent, not
// from when its answer arrived: the server stamped the expiry in between,
// so an answer that comes late (a loaded client) must not leave the
// handler a lease the server has already let go.
func TestLocalLeaseCountsFromTheStatementsSending(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	l := newLeases(ttl)
	late := l.add(context.Background(), []db.ClaimRow{{ID: 1}}, testToken(1), time.Now().Add(-ttl))[0]
	select {
	case <-late.batch.ctx.Done():
	case <-time.After(ttl / 2):
		t.Fatal("a claim answered a whole lease after it was sent left the delivery's lease running")
	}
	if !errors.Is(context.Cause(late.batch.ctx), ErrLeaseLost) {
		t.Errorf("cause %v, want ErrLeaseLost", context.Cause(late.batch.ctx))
	}
	if l.start(late) {
		t.Error("a handler started on a lease that ran out")
	}
	l.remove(late)

	held := l.add(context.Background(), []db.ClaimRow{{ID: 2}}, testToken(2), time.Now())[0]
	if !l.start(held) {
		t.Fatal("a handler could not start on a fresh lease")
	}
	ds, _, _ := l.snapshot()
	l.extended([]lease{held.lease()}, ds, time.Now().Add(-ttl+100*time.Millisecond))
	select {
	case <-held.ctx.Done():
	case <-time.After(ttl / 2):
		t.Fatal("a heartbeat answered late extended the local lease past the server's")
	}
	if !errors.Is(context.Cause(held.ctx), ErrLeaseLost) {
		t.Errorf("cause %v, want ErrLeaseLost", context.Cause(held.ctx))
	}
	l.remove(held)
}

// A handler's context is cancelled a margin before its lease ends, so the
// cancellation reaches it before another claim can take the row: never
// before LeaseTTL less the margin from the claim's sending, and before
// LeaseTTL itself.
func TestHandlerIsCancelledAMarginBeforeItsLeaseEnds(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	l := newLeases(ttl)
	sent := time.Now()
	d := l.add(context.Background(), []db.ClaimRow{{ID: 1}}, testToken(1), sent)[0]
	defer l.remove(d)
	<-d.batch.ctx.Done()
	took := time.Since(sent)
	if margin := leaseMargin(ttl); took < ttl-margin || took >= ttl {
		t.Errorf("cancelled %v after the claim was sent; want from %v and before %v", took, ttl-margin, ttl)
	}
}

// The rows of one claim share its token and lease deadline, but a
// heartbeat that finds one of them taken cancels only that row's
// handler; the others run on, extended.
func TestHeartbeatLossCancelsOnlyItsRow(t *testing.T) {
	t.Parallel()
	l := newLeases(time.Hour)
	ds := l.add(context.Background(), []db.ClaimRow{{ID: 1}, {ID: 2}, {ID: 3}}, testToken(1), time.Now())
	for _, d := range ds[:2] {
		if !l.start(d) {
			t.Fatalf("row %d: handler could not start", d.row.ID)
		}
	}
	tried, _, _ := l.snapshot()
	lost := l.extended([]lease{{2, testToken(1)}}, tried, time.Now())
	var lostIDs []int64
	for _, d := range lost {
		lostIDs = append(lostIDs, d.row.ID)
	}
	slices.Sort(lostIDs)
	if diff := cmp.Diff([]int64{1, 3}, lostIDs); diff != "" {
		t.Errorf("lost (-want +got):\n%s", diff)
	}
	if !errors.Is(context.Cause(ds[0].ctx), ErrLeaseLost) {
		t.Errorf("started row 1: cause %v, want ErrLeaseLost", context.Cause(ds[0].ctx))
	}
	if err := ds[1].ctx.Err(); err != nil {
		t.Errorf("extended row 2: context ended: %v", context.Cause(ds[1].ctx))
	}
	if l.start(ds[2]) {
		t.Error("row 3, found taken before it started, started all the same")
	}
	for _, d := range ds {
		l.remove(d)
	}
	if n := l.held(); n != 0 {
		t.Errorf("%d deliveries held after every one was removed", n)
	}
}

// One run can hold two deliveries of one row (its lease expired and its
// own next claim took the row back). Finishing the stale first must leave
// the second tracked, extended and not lost.
func TestRedeliveryOfOneRowIsTrackedByItsToken(t *testing.T) {
	t.Parallel()
	l := newLeases(time.Hour)
	first := l.add(context.Background(), []db.ClaimRow{{ID: 7}}, testToken(1), time.Now())[0]
	second := l.add(context.Background(), []db.ClaimRow{{ID: 7}}, testToken(2), time.Now())[0]
	if !l.start(second) {
		t.Fatal("second delivery could not start")
	}
	l.remove(first)

	ds, ids, toks := l.snapshot()
	if diff := cmp.Diff([]int64{7}, ids); diff != "" || !cmp.Equal(toks, []pgtype.UUID{testToken(2)}) {
		t.Fatalf("held after the first finished: %v %v (-want +got ids: %s)", ids, toks, diff)
	}
	if lost := l.extended([]lease{{7, testToken(2)}}, ds, time.Now()); len(lost) != 0 || l.isLost(second) {
		t.Errorf("second delivery reported lost: %v", lost)
	}
	if second.ctx.Err() != nil {
		t.Errorf("second delivery's context ended: %v", context.Cause(second.ctx))
	}
	l.remove(second)
}

// The outcomes of two deliveries of one row, written in one batch, are
// told apart by token: only the delivery whose lease matched is acked.
// The rows of one claim share a token, so a lease is the row id and the
// token together: another row of the stale delivery's claim, whose write
// matched, does not make the stale delivery's write count.
func TestOutcomesOfOneRowAreMatchedByToken(t *testing.T) {
	t.Parallel()
	rec := &events{}
	s := &Subscriber{Name: "s", Queues: []string{"q"}, Log: discard()}
	r := &run{s: s, metrics: newMetricsSink(rec, s.Log, 1), logs: newLogSummary(s.Log, time.Hour)}
	stale := &delivery{row: db.ClaimRow{ID: 7, Queue: "q"}, token: testToken(1), ctx: context.Background()}
	sibling := &delivery{row: db.ClaimRow{ID: 8, Queue: "q"}, token: testToken(1), ctx: context.Background()}
	fresh := &delivery{row: db.ClaimRow{ID: 7, Queue: "q"}, token: testToken(2), ctx: context.Background()}
	r.landed([]outcome{{d: stale, kind: kindAck}, {d: sibling, kind: kindAck}, {d: fresh, kind: kindAck}},
		[]lease{{8, testToken(1)}, {7, testToken(2)}})
	r.metrics.close(time.Second)
	r.logs.close()
	var got []string
	for _, ev := range rec.all() {
		got = append(got, ev.Name+" "+strconv.FormatInt(ev.ID, 10))
	}
	if diff := cmp.Diff([]string{EventLeaseLost + " 7", EventAcked + " 8", EventAcked + " 7"}, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

// A heartbeat leaves out the rows of a locked claim whose end is writing
// their leases until that end commits: run on another connection, its
// statement would not find the uncommitted leases and take them for
// lost, cancelling handlers that hold their rows (seen through PgBouncer,
// whose extra hop widens the window). After the commit they are extended
// like any lease.
func TestHeartbeatWaitsForALockedClaimsLeasesToCommit(t *testing.T) {
	t.Parallel()
	l := newLeases(time.Minute)
	ds := l.addEach(t.Context(), 2, func(i int, r *db.ClaimRow) { r.ID = int64(i + 1) }, pgtype.UUID{}, time.Now())
	if !l.start(ds[0]) {
		t.Fatal("the handler of row 1 did not start")
	}
	snapshotIDs := func() []int64 {
		_, ids, _ := l.snapshot()
		return ids
	}
	if ids := snapshotIDs(); len(ids) != 0 {
		t.Errorf("a heartbeat extends rows held by lock: %v", ids)
	}
	token := testToken(9)
	running := l.leaseStarted(ds, nil, token)
	if len(running) != 1 || running[0] != ds[0] {
		t.Fatalf("rows leased at the claim's end: %v, want row 1's", running)
	}
	if ids := snapshotIDs(); len(ids) != 0 {
		t.Errorf("a heartbeat extends leases the claim's end has not committed: %v", ids)
	}
	l.renew(ds[0].batch, time.Now())
	if diff := cmp.Diff([]int64{1}, snapshotIDs()); diff != "" {
		t.Errorf("a heartbeat after the end committed (-want +got):\n%s", diff)
	}
	ds[0].batch.expiry.Stop()
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
		lower, upper := runs(tc.ids)
		if diff := cmp.Diff([][]int64{tc.lower, tc.upper}, [][]int64{lower, upper}); diff != "" {
			t.Errorf("runs(%v) (-want +got):\n%s", tc.ids, diff)
		}
	}
}
