package outbox

import "testing"

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
	stalledClaimIsFreedAfterTheLease(t, e, id)
}
