package outbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
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
	if got, err := e.q.Claim(e.ctx, db.ClaimParams{Queues: []string{"long"}, MaxRows: 1, LeaseTtlSeconds: 30}); err != nil || len(got) != 1 {
		t.Fatalf("claim long: %v, %v", got, err)
	}
	if got, err := e.q.Claim(e.ctx, db.ClaimParams{Queues: []string{"short"}, MaxRows: 1, LeaseTtlSeconds: 0.2}); err != nil || len(got) != 1 {
		t.Fatalf("claim short: %v, %v", got, err)
	}
	time.Sleep(400 * time.Millisecond)

	got, err := e.q.Claim(e.ctx, db.ClaimParams{Queues: []string{"long"}, MaxRows: 10, LeaseTtlSeconds: 0.1})
	if err != nil || len(got) != 0 {
		t.Errorf("a 100ms claimer took a row leased for 30s: %v, %v", ids(got), err)
	}
	got, err = e.q.Claim(e.ctx, db.ClaimParams{Queues: []string{"short"}, MaxRows: 10, LeaseTtlSeconds: 3600})
	if err != nil || !cmp.Equal(ids(got), []int64{short}) {
		t.Errorf("a one-hour claimer did not take row %d whose 200ms lease expired: %v, %v", short, ids(got), err)
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
	l := leases{ttl: ttl, m: map[pgtype.UUID]*delivery{}}
	late := l.add(context.Background(), db.ClaimRow{ID: 1, AcquiredToken: testToken(1)}, time.Now().Add(-ttl))
	select {
	case <-late.ctx.Done():
	case <-time.After(ttl / 2):
		t.Fatal("a claim answered a whole lease after it was sent left the delivery's lease running")
	}
	if !errors.Is(context.Cause(late.ctx), ErrLeaseLost) {
		t.Errorf("cause %v, want ErrLeaseLost", context.Cause(late.ctx))
	}
	l.remove(late)

	held := l.add(context.Background(), db.ClaimRow{ID: 2, AcquiredToken: testToken(2)}, time.Now())
	_, toks := l.snapshot()
	l.extended(toks, toks, time.Now().Add(-ttl+100*time.Millisecond))
	select {
	case <-held.ctx.Done():
	case <-time.After(ttl / 2):
		t.Fatal("a heartbeat answered late extended the local lease past the server's")
	}
	l.remove(held)
}

func testToken(b byte) pgtype.UUID { return pgtype.UUID{Bytes: [16]byte{b}, Valid: true} }

// One run can hold two deliveries of one row (its lease expired and its
// own next claim took the row back). Finishing the stale first must leave
// the second tracked, extended and not lost.
func TestRedeliveryOfOneRowIsTrackedByItsToken(t *testing.T) {
	t.Parallel()
	l := leases{ttl: time.Hour, m: map[pgtype.UUID]*delivery{}}
	first := l.add(context.Background(), db.ClaimRow{ID: 7, AcquiredToken: testToken(1)}, time.Now())
	second := l.add(context.Background(), db.ClaimRow{ID: 7, AcquiredToken: testToken(2)}, time.Now())
	l.remove(first)

	ids, toks := l.snapshot()
	if diff := cmp.Diff([]int64{7}, ids); diff != "" || !cmp.Equal(toks, []pgtype.UUID{testToken(2)}) {
		t.Fatalf("held after the first finished: %v %v (-want +got ids: %s)", ids, toks, diff)
	}
	if lost := l.extended([]pgtype.UUID{testToken(2)}, toks, time.Now()); len(lost) != 0 || l.isLost(second) {
		t.Errorf("second delivery reported lost: %v", lost)
	}
	if second.ctx.Err() != nil {
		t.Errorf("second delivery's context ended: %v", context.Cause(second.ctx))
	}
	l.remove(second)
}

// The outcomes of two deliveries of one row, written in one batch, are
// told apart by token: only the delivery whose lease matched is acked.
func TestOutcomesOfOneRowAreMatchedByToken(t *testing.T) {
	t.Parallel()
	rec := &events{}
	s := &Subscriber[string]{cfg: SubscriberConfig[string]{Name: "s"}, queues: []string{"q"}, log: discard()}
	r := &run[string]{s: s, metrics: newMetricsSink(rec, s.log), logs: newLogSummary(s.log, time.Hour)}
	stale := &delivery{row: db.ClaimRow{ID: 7, Queue: "q"}, token: testToken(1), ctx: context.Background()}
	fresh := &delivery{row: db.ClaimRow{ID: 7, Queue: "q"}, token: testToken(2), ctx: context.Background()}
	r.landed([]outcome{{d: stale, kind: kindAck}, {d: fresh, kind: kindAck}}, []pgtype.UUID{testToken(2)})
	r.metrics.close(time.Second)
	r.logs.close()
	var got []string
	for _, ev := range rec.all() {
		got = append(got, ev.Name)
	}
	if diff := cmp.Diff([]string{EventLeaseLost, EventAcked}, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
