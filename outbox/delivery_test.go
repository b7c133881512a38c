package outbox

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestSlowHandlerWithoutHeartbeatLosesItsLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id, err := newPublisher[string](t, e, "slow", nil).Publish(e.ctx, e.db.Pool, "x", nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := &events{}
	cfg := fastConfig[string](rec)
	cfg.LeaseTTL, cfg.HeartbeatInterval = 300*time.Millisecond, -1
	var cause atomic.Value
	var deliveries atomic.Int32
	startSub(t, e.ob, []string{"slow"}, func(ctx context.Context, m *Message[string]) error {
		deliveries.Add(1)
		if m.Deliveries == 1 {
			<-ctx.Done() // slower than the lease
			cause.Store(context.Cause(ctx))
			time.Sleep(600 * time.Millisecond) // the row is reclaimed meanwhile
		}
		return nil
	}, cfg)
	eventually(t, "one ack and one lost lease", func() bool {
		return len(rec.named(EventAcked)) == 1 && len(rec.named(EventLeaseLost)) == 1
	})
	if c, _ := cause.Load().(error); !errors.Is(c, ErrLeaseLost) {
		t.Errorf("stale handler's context cause = %v, want ErrLeaseLost", c)
	}
	want := []MetricEvent{{Name: EventLeaseLost, Subscriber: "slow", Queue: "slow", ID: id, Deliveries: 1, Reason: "ack"}}
	if diff := cmp.Diff(want, rec.named(EventLeaseLost), cmpopts.IgnoreFields(MetricEvent{}, "Duration")); diff != "" {
		t.Errorf("lease_lost (-want +got):\n%s", diff)
	}
	if got := rec.named(EventAcked); got[0].Deliveries != 2 {
		t.Errorf("acked delivery %d, want the second", got[0].Deliveries)
	}
	if n := deliveries.Load(); n != 2 {
		t.Errorf("handled %d times, want 2", n)
	}
}

func TestHeartbeatKeepsASlowHandlersLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if _, err := newPublisher[string](t, e, "slow", nil).Publish(e.ctx, e.db.Pool, "x", nil); err != nil {
		t.Fatal(err)
	}
	rec := &events{}
	cfg := fastConfig[string](rec)
	cfg.LeaseTTL, cfg.HeartbeatInterval = time.Second, 100*time.Millisecond
	var deliveries atomic.Int32
	startSub(t, e.ob, []string{"slow"}, func(ctx context.Context, m *Message[string]) error {
		deliveries.Add(1)
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(2500 * time.Millisecond): // two and a half leases
			return nil
		}
	}, cfg)
	eventually(t, "the ack", func() bool { return len(rec.named(EventAcked)) == 1 })
	if n := deliveries.Load(); n != 1 {
		t.Errorf("handled %d times, want once", n)
	}
	if got := rec.named(EventLeaseLost); len(got) != 0 {
		t.Errorf("lease_lost despite heartbeats: %v", got)
	}
}

func TestBatchedFlushReportsTheRowWhoseLeaseWasTaken(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ids, err := newPublisher[int](t, e, "batch", nil).PublishBatch(e.ctx, e.db.Pool, []int{0, 1, 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := &events{}
	cfg := fastConfig[int](rec)
	cfg.AckLinger, cfg.AckBatchSize = 300*time.Millisecond, 10
	startSub(t, e.ob, []string{"batch"}, func(ctx context.Context, m *Message[int]) error {
		if m.Payload == 1 {
			// A newer claim takes this row while its handler runs.
			if _, err := e.db.Pool.Exec(ctx, "UPDATE outbox SET acquired_token = gen_random_uuid() WHERE id = $1", m.ID); err != nil {
				return err
			}
		}
		return nil
	}, cfg)
	eventually(t, "three outcomes", func() bool {
		return len(rec.named(EventAcked))+len(rec.named(EventLeaseLost)) == 3
	})
	if diff := cmp.Diff([]int64{ids[0], ids[2]}, sortedIDs(rec.named(EventAcked))); diff != "" {
		t.Errorf("acked (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{ids[1]}, sortedIDs(rec.named(EventLeaseLost))); diff != "" {
		t.Errorf("lease_lost (-want +got):\n%s", diff)
	}
	if _, ok := e.row(ids[1]); !ok {
		t.Error("the row whose lease was taken was deleted")
	}
	for _, id := range []int64{ids[0], ids[2]} {
		if _, ok := e.row(id); ok {
			t.Errorf("acked row %d still there", id)
		}
	}
}

// A dispatched event carries the row's age: from its creation to the
// dispatch.
func TestDispatchedEventCarriesTheRowsAge(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.exec(`INSERT INTO outbox (queue, payload, created_at) VALUES ('aged', '"old"', now() - interval '1 hour'), ('aged', '"new"', now())`)
	rec := &events{}
	startSub(t, e.ob, []string{"aged"}, func(context.Context, *Message[string]) error { return nil }, fastConfig[string](rec))
	eventually(t, "both dispatched", func() bool { return len(rec.named(EventDispatched)) == 2 })
	ages := map[bool]time.Duration{}
	for _, ev := range rec.named(EventDispatched) {
		ages[ev.Age >= time.Hour] = ev.Age
	}
	if old, ok := ages[true]; !ok || old > time.Hour+time.Minute {
		t.Errorf("the row created an hour ago: age %v", old)
	}
	if young, ok := ages[false]; !ok || young > time.Minute {
		t.Errorf("the row created now: age %v", young)
	}
}
