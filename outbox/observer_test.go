package outbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// observer records what a DeliveryObserver is told.
type observer struct {
	mu     sync.Mutex
	starts int
	ends   []string
	panic  bool
}

type observedKey struct{}

func (o *observer) Start(ctx context.Context, d DeliveryInfo) context.Context {
	o.mu.Lock()
	o.starts++
	o.mu.Unlock()
	if o.panic {
		panic("observer bug")
	}
	return context.WithValue(ctx, observedKey{}, d.ID)
}

func (o *observer) End(ctx context.Context, d DeliveryInfo, out DeliveryOutcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	id, _ := ctx.Value(observedKey{}).(int64)
	headers := "f"
	if d.Headers[HeaderContentType] != "" {
		headers = "t"
	}
	s := strings.Join([]string{headers, out.Outcome, out.Reason, out.Delay.String()}, " ")
	if id != d.ID {
		s += " (not Start's context)"
	}
	if out.Err != nil {
		s += " err=" + out.Err.Error()
	}
	o.ends = append(o.ends, s)
}

func (o *observer) got() (int, []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.starts, append([]string(nil), o.ends...)
}

// An observer sees each delivery start, gives the handler its context, and
// is told the outcome decided when the handler returns: a retry with its
// delay, the acknowledgement, a dead letter with its reason.
func TestObserverSeesEachDeliveryAndItsOutcome(t *testing.T) {
	t.Parallel()
	e := setup(t)
	obs := &observer{}
	cfg := fastConfig[string](nil)
	cfg.Observer = obs
	pub := newPublisher[string](t, e, "q", nil)
	if _, err := pub.Publish(e.ctx, e.pubPool, "retry once", nil); err != nil {
		t.Fatal(err)
	}
	var seen sync.Map
	startSub(t, e.ob, []string{"q"}, func(ctx context.Context, m *Message[string]) error {
		if ctx.Value(observedKey{}) != m.ID {
			t.Errorf("delivery %d of %d: the handler's context is not the observer's", m.Deliveries, m.ID)
		}
		switch _, again := seen.LoadOrStore(m.Payload, true); {
		case m.Payload == "reject":
			return Reject(errors.New("no"))
		case !again:
			return RetryAfter(errors.New("busy"), 20*time.Millisecond)
		}
		return nil
	}, cfg)
	eventually(t, "the retry and the ack", func() bool { _, ends := obs.got(); return len(ends) == 2 })
	if _, err := pub.Publish(e.ctx, e.pubPool, "reject", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the dead letter", func() bool { _, ends := obs.got(); return len(ends) == 3 })
	starts, ends := obs.got()
	want := []string{"t retried  20ms err=retry after 20ms: busy", "t acked  0s", "t dead_lettered rejected 0s err=rejected: no"}
	if diff := cmp.Diff(want, ends); diff != "" || starts != 3 {
		t.Errorf("%d starts; ends (-want +got):\n%s", starts, diff)
	}
}

// A panicking observer costs no delivery: the handler runs with the
// subscriber's own context, and the row is acknowledged.
func TestPanickingObserverLosesNoDelivery(t *testing.T) {
	t.Parallel()
	e := setup(t)
	obs := &observer{panic: true}
	cfg := fastConfig[string](nil)
	cfg.Observer = obs
	if _, err := newPublisher[string](t, e, "q", nil).Publish(e.ctx, e.pubPool, "x", nil); err != nil {
		t.Fatal(err)
	}
	handled := make(chan time.Time, 1)
	startSub(t, e.ob, []string{"q"}, func(ctx context.Context, m *Message[string]) error {
		handled <- time.Now()
		return nil
	}, cfg)
	within(t, handled, 10*time.Second, "the row")
	eventually(t, "the ack", func() bool { return e.count("outbox") == 0 })
	if starts, ends := obs.got(); starts != 1 || len(ends) != 1 || !strings.Contains(ends[0], "acked") {
		t.Errorf("%d starts, ends %v", starts, ends)
	}
}
