package outbox

import (
	"context"
	"fmt"

	"github.com/outboxgen/outboxgen/db"
)

// CancelTimer deletes the row of queue published with timerID, through tx,
// and reports whether there was one to delete. It returns false once a
// subscriber has claimed the row: the delivery is under way and is no
// longer the publisher's to cancel. With a pgx.Tx the cancellation takes
// effect when the caller commits. A timer id that no publish could have
// stored (a NUL, say) is an *[InputError], and tx stays usable.
func (o *Outbox) CancelTimer(ctx context.Context, tx DBTX, queue, timerID string) (bool, error) {
	if tx == nil {
		return false, &InputError{Field: "tx", Rule: "must not be nil"}
	}
	if err := checkQueue("queue", queue); err != nil {
		return false, err
	}
	if timerID == "" {
		return false, &InputError{Field: "timerID", Rule: "must not be empty"}
	}
	if err := checkKey("timerID", timerID); err != nil {
		return false, err
	}
	n, err := o.queries(tx).CancelTimer(ctx, db.CancelTimerParams{Queue: queue, TimerID: timerID})
	if err != nil {
		return false, wrapOp(fmt.Sprintf("CancelTimer %q in %q", timerID, queue), err)
	}
	return n > 0, nil
}
