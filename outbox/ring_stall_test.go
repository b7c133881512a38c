package outbox

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// A subscriber whose connection stalls while its claim holds lanes of
// the ring frees them after LeaseTTL, when the server ends the claim's
// idle transaction, as a stalled claim by lock of the table frees its
// rows: another subscriber then delivers the lane's row, after the
// stalled handler's context was cancelled. The stall is a blackhole: the
// stalled subscriber's close of its connection never reaches the
// server, which learns only from its own timeout that the claim is gone.
func TestStalledClaimOfTheRingFreesItsLanesAfterTheLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id, err := ringPublisher(t, e, "q").Publish(e.ctx, e.pubPool, "x", nil)
	if err != nil {
		t.Fatal(err)
	}
	ob, proxy := proxiedOutbox(t, e)
	var stalledCancelled, otherStarted atomic.Int64
	cfg := lockingConfig(nil)
	cfg.LeaseTTL = time.Second
	cfg.LockWindow = 500 * time.Millisecond
	cfg.QueryTimeout = 2 * time.Second
	cfg.GracefulTimeout = 500 * time.Millisecond
	stalled := startSub(t, ob, []string{"q"}, func(ctx context.Context, m *Message[string]) error {
		if m.ID == id {
			proxy.Blackhole()
		}
		<-ctx.Done()
		stalledCancelled.Store(time.Now().UnixNano())
		return context.Cause(ctx)
	}, cfg)
	eventually(t, "the stalled subscriber's handler cancelled", func() bool { return stalledCancelled.Load() != 0 })
	handled := make(chan int64, 1)
	other := startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
		if otherStarted.CompareAndSwap(0, time.Now().UnixNano()) {
			handled <- m.ID
		}
		return nil
	}, lockingConfig(nil))
	if got := waitForWithin(t, handled, "the row handled by the other subscriber", time.Minute); got != id {
		t.Errorf("the other subscriber handled row %d, want %d", got, id)
	}
	eventually(t, "the row consumed", func() bool { return e.undelivered("q") == 0 })
	if err := other.stop(); err != nil {
		t.Errorf("other Run: %v", err)
	}
	if c, o := stalledCancelled.Load(), otherStarted.Load(); o < c {
		t.Errorf("the other subscriber started %v before the stalled handler was cancelled", time.Duration(c-o))
	}
	if err := stalled.stop(); err != nil && !errors.Is(err, ErrGracefulTimeout) {
		t.Errorf("stalled Run: %v, want nil or ErrGracefulTimeout", err)
	}
}
