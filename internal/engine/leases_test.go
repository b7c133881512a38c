package engine

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/lease"
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
	stale := &lease.Delivery{Row: db.ClaimRow{ID: 7, Queue: "q"}, Token: testToken(1), Ctx: context.Background()}
	sibling := &lease.Delivery{Row: db.ClaimRow{ID: 8, Queue: "q"}, Token: testToken(1), Ctx: context.Background()}
	fresh := &lease.Delivery{Row: db.ClaimRow{ID: 7, Queue: "q"}, Token: testToken(2), Ctx: context.Background()}
	r.landed([]lease.Outcome{{D: stale, Kind: lease.Ack}, {D: sibling, Kind: lease.Ack}, {D: fresh, Kind: lease.Ack}},
		[]lease.Lease{{ID: 8, Token: testToken(1)}, {ID: 7, Token: testToken(2)}})
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
