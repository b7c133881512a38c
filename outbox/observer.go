package outbox

import (
	"context"
	"time"
)

// DeliveryObserver sees each delivery a subscriber hands to its handler,
// from before the handler starts to the outcome decided when it returns:
// a tracer starts a span in Start and ends it in End (contrib/otel's does).
// Both run on the handler's goroutine and must return quickly; a panic in
// either is recovered and logged.
type DeliveryObserver interface {
	// Start returns the context the handler runs with: ctx, or a context
	// derived from it.
	Start(ctx context.Context, d DeliveryInfo) context.Context
	// End reports the delivery's outcome, with the context Start
	// returned. It is called once for every Start.
	End(ctx context.Context, d DeliveryInfo, o DeliveryOutcome)
}

// DeliveryInfo describes a delivery to a [DeliveryObserver].
type DeliveryInfo struct {
	// Subscriber is SubscriberConfig.Name.
	Subscriber string
	// Queue, ID, Deliveries, Attempts, OrderingKey and Headers are the
	// message's (see [Message]). Headers must not be modified.
	Queue       string
	ID          int64
	Deliveries  int
	Attempts    int
	OrderingKey string
	Headers     map[string]string
}

// Outcomes a [DeliveryObserver] is told.
const (
	// OutcomeAcked: the handler succeeded; the row is deleted.
	OutcomeAcked = "acked"
	// OutcomeRetried: the handler failed; the row is rescheduled after
	// DeliveryOutcome.Delay.
	OutcomeRetried = "retried"
	// OutcomeDeadLettered: the delivery ended (DeliveryOutcome.Reason); the
	// row moves to the dead-letter table.
	OutcomeDeadLettered = "dead_lettered"
	// OutcomeDropped: the delivery ended (Reason) where dead letters are
	// disabled; the row is deleted and logged.
	OutcomeDropped = "dropped"
	// OutcomeAbandoned: the handler's outcome is not written (its lease was
	// lost, or the subscriber was forced to stop); another delivery decides.
	OutcomeAbandoned = "abandoned"
)

// DeliveryOutcome is what a subscriber decided when a handler returned.
// The decision's write lands later, in a batch; a write that finds the
// lease gone is reported as EventLeaseLost.
type DeliveryOutcome struct {
	// Outcome is OutcomeAcked, OutcomeRetried, ...
	Outcome string
	// Err is the handler's error, if any.
	Err error
	// Delay is a retry's delay; Reason a terminal outcome's reason.
	Delay  time.Duration
	Reason string
	// Ran is how long the handler ran.
	Ran time.Duration
}
