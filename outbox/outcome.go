package outbox

import (
	"errors"
	"time"

	"github.com/outboxgen/outboxgen/internal/engine"
)

// ErrLeaseLost is the cause of a handler's context cancellation when the
// row's lease expired or was taken by a newer claim: the handler's outcome
// will not be recorded, the newer delivery decides. Check it with
// context.Cause(ctx).
var ErrLeaseLost = engine.ErrLeaseLost

// ErrSubscriberStopped is the cause of a handler's context cancellation
// when the subscriber stops and the graceful timeout has passed. The row
// keeps its lease and is delivered again once the lease expires.
var ErrSubscriberStopped = engine.ErrSubscriberStopped

// ErrAlreadyRunning is returned by [Subscriber.Run] when the subscriber is
// already running.
var ErrAlreadyRunning = errors.New("outbox: Subscriber.Run: already running")

// RetryAfter wraps err so the row is retried after d, whatever the retry
// strategy would say. MaxDeliveries still applies. A negative d means 0.
func RetryAfter(err error, d time.Duration) error { return engine.RetryAfter(err, d) }

// Reject wraps err so the delivery ends now, without retries: the row is
// dead-lettered with reason rejected (or deleted when dead-lettering is
// off).
func Reject(err error) error { return engine.Reject(err) }

// Terminal reasons: the failure_reason of a dead-lettered row and the
// Reason of the terminal and dead_lettered metric events.
const (
	ReasonMaxDeliveries  = "max_deliveries"
	ReasonRetryExhausted = "retry_exhausted"
	ReasonRejected       = "rejected"
	ReasonDecodeError    = "decode_error"
)
