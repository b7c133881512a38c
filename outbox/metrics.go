package outbox

import (
	"log/slog"
	"time"
)

// Metric event names, the values of [MetricEvent].Name.
const (
	// EventPublished: a Publish or PublishBatch call ended.
	EventPublished = "published"
	// EventFetched: a claim round trip ended (Count rows, possibly 0).
	EventFetched = "fetched"
	// EventDispatched: a handler is about to run.
	EventDispatched = "dispatched"
	// EventAcked: a handler succeeded and the row's delete landed.
	EventAcked = "acked"
	// EventRetried: a failed row was rescheduled (Delay) and the write landed.
	EventRetried = "retried"
	// EventDeadLettered: a row moved to the dead-letter table (Reason).
	EventDeadLettered = "dead_lettered"
	// EventTerminal: a row ended without a dead-letter table: deleted and
	// logged (Reason).
	EventTerminal = "terminal"
	// EventLeaseLost: a write found the row's lease taken by a newer claim,
	// or a heartbeat found it gone; the newer delivery decides.
	EventLeaseLost = "lease_lost"
	// EventWriteRefused: the database refused to store an outcome (a data
	// error, SQLSTATE class 22 or 23, even after retrying it alone); the
	// row is left to lease expiry. Reason names the write.
	EventWriteRefused = "write_refused"
	// EventDrainTimeout: the subscriber stopped with handlers still running
	// after its graceful timeout (Count of them).
	EventDrainTimeout = "drain_timeout"
)

// MetricEvent is one observation handed to a [MetricsRecorder]. Fields that
// do not apply to an event are zero.
type MetricEvent struct {
	// Name is what happened, e.g. EventPublished.
	Name string
	// Queue is the queue the event concerns.
	Queue string
	// Subscriber names the subscriber (SubscriberConfig.Name); empty for
	// publisher events.
	Subscriber string
	// ID is the row's id for per-row events.
	ID int64
	// Deliveries is the row's delivery count, this one included.
	Deliveries int
	// Reason is the terminal reason (ReasonRejected, ...) or, for
	// lease_lost, the write that found the lease gone ("ack", "retry",
	// "dead_letter", "heartbeat").
	Reason string
	// Delay is the retry delay of a retried event.
	Delay time.Duration
	// Count is how many messages the event covers.
	Count int
	// Bytes is the payload bytes the event covers.
	Bytes int
	// Duration is how long the operation took; for acked, retried and
	// terminal events, how long the handler ran.
	Duration time.Duration
	// Age is, for a dispatched event, how long ago the row was created:
	// from its created_at (the server's clock, at the start of the
	// publishing transaction) to the dispatch (this process's clock), so a
	// skew between the two clocks shifts it. It is 0 when the clocks make
	// it negative.
	Age time.Duration
	// ErrorType classifies the error that ended the operation: "input"
	// (an *InputError), "timer_exists", "canceled" or "database"; empty on
	// success.
	ErrorType string
}

// MetricsRecorder receives metric events. A Publisher calls Record on the
// caller's goroutine, so it must return quickly: aggregate in memory, or
// hand the event to a buffered channel. A Subscriber calls it from a
// goroutine of its own and drops events (with a warning) when the recorder
// falls more than a few thousand behind, so a slow recorder never stalls
// delivery. A panic in Record is recovered and logged, never passed on.
//
// Adapters for Prometheus or OpenTelemetry implement this interface outside
// this package, which keeps its dependencies few.
type MetricsRecorder interface {
	Record(MetricEvent)
}

// record hands ev to r, shielding the caller from a panicking recorder.
func record(r MetricsRecorder, log *slog.Logger, ev MetricEvent) {
	if r == nil {
		return
	}
	defer func() {
		if p := recover(); p != nil {
			log.Error("outbox: metrics recorder panicked", slog.String("event", ev.Name), slog.Any("panic", p))
		}
	}()
	r.Record(ev)
}
