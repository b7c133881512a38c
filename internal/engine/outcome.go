package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/outboxgen/outboxgen/internal/lease"
)

// lease.ErrLeaseLost is lease.ErrLeaseLost: see outbox.ErrLeaseLost.
var ErrLeaseLost = lease.ErrLeaseLost

// ErrSubscriberStopped is the cause of a handler's context cancellation
// when the subscriber stops and the graceful timeout has passed. The row
// keeps its lease and is delivered again once the lease expires.
var ErrSubscriberStopped = errors.New("outbox: subscriber stopped")

// RetryAfter wraps err so the row is retried after d, whatever the retry
// strategy would say. MaxDeliveries still applies. A negative d means 0.
func RetryAfter(err error, d time.Duration) error {
	return &retryAfterError{err: err, delay: max(d, 0)}
}

// Reject wraps err so the delivery ends now, without retries: the row is
// dead-lettered with reason rejected (or deleted when dead-lettering is
// off).
func Reject(err error) error { return &rejectError{err: err} }

type retryAfterError struct {
	err   error
	delay time.Duration
}

func (e *retryAfterError) Error() string {
	return fmt.Sprintf("retry after %v: %v", e.delay, e.err)
}

func (e *retryAfterError) Unwrap() error { return e.err }

type rejectError struct{ err error }

func (e *rejectError) Error() string { return fmt.Sprintf("rejected: %v", e.err) }

func (e *rejectError) Unwrap() error { return e.err }

// Terminal reasons: the failure_reason of a dead-lettered row and the
// Reason of the terminal and dead_lettered metric events, as outbox
// documents them (outbox.ReasonRejected, ...).
const (
	ReasonMaxDeliveries  = "max_deliveries"
	ReasonRetryExhausted = "retry_exhausted"
	ReasonRejected       = "rejected"
	ReasonDecodeError    = "decode_error"
)
