package outbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
)

// A claimer with a short LeaseTTL must not take a row whose holder leased
// it for longer, and a claimer with a long LeaseTTL must not wait past
// the expiry the holder stamped.
func TestLeaseExpiryIsJudgedByTheHoldersTTL(t *testing.T) {
	t.Parallel()
	e := setup(t)
	long := e.publish("long")
	short := e.publish("short")
	if got, err := e.q.Claim(e.ctx, db.ClaimParams{Token: newToken(), Queues: []string{"long"}, MaxRows: 1, LeaseTtlSeconds: 30}); err != nil || len(got) != 1 {
		t.Fatalf("claim long: %v, %v", got, err)
	}
	if got, err := e.q.Claim(e.ctx, db.ClaimParams{Token: newToken(), Queues: []string{"short"}, MaxRows: 1, LeaseTtlSeconds: 0.2}); err != nil || len(got) != 1 {
		t.Fatalf("claim short: %v, %v", got, err)
	}
	eventually(t, "the 200ms lease expired", func() bool { r, _ := e.row(short); return !r.LeaseExpiresAt.After(e.serverNow()) })

	got, err := e.q.Claim(e.ctx, db.ClaimParams{Token: newToken(), Queues: []string{"long"}, MaxRows: 10, LeaseTtlSeconds: 0.1})
	if err != nil || len(got) != 0 {
		t.Errorf("a 100ms claimer took a row leased for 30s: %v, %v", claimIDs(got), err)
	}
	got, err = e.q.Claim(e.ctx, db.ClaimParams{Token: newToken(), Queues: []string{"short"}, MaxRows: 10, LeaseTtlSeconds: 3600})
	if err != nil || !cmp.Equal(claimIDs(got), []int64{short}) {
		t.Errorf("a one-hour claimer did not take row %d whose 200ms lease expired: %v, %v", short, claimIDs(got), err)
	}
	r, _ := e.row(long)
	if r.LeaseExpiresAt == nil || r.LeaseExpiresAt.Sub(*r.AcquiredAt) != 30*time.Second {
		t.Errorf("lease of row %d: acquired %v, expires %v; want 30s apart", long, r.AcquiredAt, r.LeaseExpiresAt)
	}
}

// A rolling deploy: a subscriber with LeaseTTL 3s heartbeats its slow
// handler while another, with LeaseTTL 200ms, claims over and over. The
// row is delivered once.
func TestSubscribersWithDifferentLeaseTTLsNeverShareARow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var calls atomic.Int32
	entered := make(chan struct{})
	slow := fastConfig[string](nil)
	slow.LeaseTTL, slow.HeartbeatInterval = 3*time.Second, time.Second
	startSub(t, e.ob, []string{"q"}, func(ctx context.Context, _ *Message[string]) error {
		calls.Add(1)
		close(entered)
		select {
		case <-time.After(4 * time.Second):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}, slow)
	id := e.publish("q")
	<-entered

	fast := fastConfig[string](nil)
	fast.LeaseTTL, fast.HeartbeatInterval = 200*time.Millisecond, 50*time.Millisecond
	startSub(t, e.ob, []string{"q"}, func(context.Context, *Message[string]) error {
		calls.Add(1)
		return nil
	}, fast)
	eventually(t, "the slow handler's ack", func() bool { _, ok := e.row(id); return !ok })
	if n := calls.Load(); n != 1 {
		t.Errorf("handler calls = %d, want 1", n)
	}
}

func TestHeartbeatIntervalIsAtMostHalfTheLease(t *testing.T) {
	t.Parallel()
	_, err := NewSubscriber(&Outbox{}, []string{"q"}, func(context.Context, *Message[string]) error { return nil },
		&SubscriberConfig[string]{LeaseTTL: time.Second, HeartbeatInterval: 600 * time.Millisecond})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "SubscriberConfig.HeartbeatInterval" {
		t.Fatalf("err = %v, want a ConfigError for HeartbeatInterval", err)
	}
	if _, err := NewSubscriber(&Outbox{}, []string{"q"}, func(context.Context, *Message[string]) error { return nil },
		&SubscriberConfig[string]{LeaseTTL: time.Second, HeartbeatInterval: 500 * time.Millisecond}); err != nil {
		t.Errorf("LeaseTTL/2: %v", err)
	}
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

func testToken(b byte) pgtype.UUID { return pgtype.UUID{Bytes: [16]byte{b}, Valid: true} }

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
	s := &core{cfg: settings{Name: "s"}, queues: []string{"q"}, log: discard()}
	r := &run{s: s, metrics: newMetricsSink(rec, s.log, 1), logs: newLogSummary(s.log, time.Hour)}
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

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
