package outbox

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// A handler slower than its lease, with no heartbeat to extend it, has
// its context cancelled with ErrLeaseLost, and its outcome finds the row
// taken: the row was delivered again, and the later delivery decides.
// With a 300ms lease a later delivery can lose its lease too on a loaded
// machine, so the test holds every handler call to account (each but the
// acknowledged one lost its lease) rather than counting two.
func TestSlowHandlerWithoutHeartbeatLosesItsLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id, err := newPublisher[string](t, e, "slow", nil).Publish(e.ctx, e.pubPool, "x", nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := &events{}
	cfg := fastConfig[string](rec)
	cfg.LeaseTTL, cfg.HeartbeatInterval = 300*time.Millisecond, -1
	var cause atomic.Value
	var (
		mu    sync.Mutex
		calls []int // the Deliveries of each handler call; the first is the slow one
	)
	redelivered := make(chan struct{})
	var once sync.Once
	startSub(t, e.ob, []string{"slow"}, func(ctx context.Context, m *Message[string]) error {
		mu.Lock()
		calls = append(calls, m.Deliveries)
		first := len(calls) == 1
		mu.Unlock()
		if first {
			<-ctx.Done() // slower than the lease
			cause.Store(context.Cause(ctx))
			<-redelivered // and still running when the row is delivered again
			return nil
		}
		once.Do(func() { close(redelivered) })
		return nil
	}, cfg)
	handled := func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(calls)
	}
	eventually(t, "one ack, and a lost lease for every other handler call", func() bool {
		return len(rec.named(EventAcked)) == 1 && len(rec.named(EventLeaseLost)) == len(handled())-1
	})
	if c, _ := cause.Load().(error); !errors.Is(c, ErrLeaseLost) {
		t.Errorf("stale handler's context cause = %v, want ErrLeaseLost", c)
	}
	got := handled()
	acked := rec.named(EventAcked)[0]
	if len(got) < 2 || acked.Deliveries <= got[0] || acked.Deliveries != slices.Max(got) {
		t.Errorf("acked delivery %d of handler calls %v, want the last, after the slow one", acked.Deliveries, got)
	}
	var want []MetricEvent
	for _, d := range got {
		if d != acked.Deliveries {
			want = append(want, MetricEvent{Name: EventLeaseLost, Subscriber: "slow", Queue: "slow", ID: id, Deliveries: d, Reason: "ack"})
		}
	}
	byDeliveries := cmpopts.SortSlices(func(a, b MetricEvent) bool { return a.Deliveries < b.Deliveries })
	if diff := cmp.Diff(want, rec.named(EventLeaseLost), cmpopts.IgnoreFields(MetricEvent{}, "Duration"), byDeliveries); diff != "" {
		t.Errorf("lease_lost (-want +got):\n%s", diff)
	}
	if _, ok := e.row(id); ok {
		t.Error("the row is still in the outbox after its acknowledgement")
	}
}

func TestHeartbeatKeepsASlowHandlersLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if _, err := newPublisher[string](t, e, "slow", nil).Publish(e.ctx, e.pubPool, "x", nil); err != nil {
		t.Fatal(err)
	}
	rec := &events{}
	cfg := fastConfig[string](rec)
	// A heartbeat may come 19 intervals late before the lease lapses: the
	// margin a loaded machine needs. BenchmarkHeartbeatGap measures the
	// gap between the lease's extensions.
	cfg.LeaseTTL, cfg.HeartbeatInterval = 2*time.Second, 100*time.Millisecond
	var deliveries atomic.Int32
	startSub(t, e.ob, []string{"slow"}, func(ctx context.Context, m *Message[string]) error {
		deliveries.Add(1)
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(5 * cfg.LeaseTTL / 2): // two and a half leases
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
	ids, err := newPublisher[int](t, e, "batch", nil).PublishBatch(e.ctx, e.pubPool, []int{0, 1, 2}, nil)
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
