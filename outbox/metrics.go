package outbox

import (
	"log/slog"
	"time"
)

// Metric event names, the values of [MetricEvent].Name.
const (
	EventPublished = "published"
)

// MetricEvent is one observation handed to a [MetricsRecorder]. Fields that
// do not apply to an event are zero.
type MetricEvent struct {
	// Name is what happened, e.g. EventPublished.
	Name string
	// Queue is the queue the event concerns.
	Queue string
	// Count is how many messages the event covers.
	Count int
	// Bytes is the payload bytes the event covers.
	Bytes int
	// Duration is how long the operation took.
	Duration time.Duration
	// ErrorType classifies the error that ended the operation: "input"
	// (an *InputError), "timer_exists", "canceled" or "database"; empty on
	// success.
	ErrorType string
}

// MetricsRecorder receives metric events. Record is called on the hot path
// of publishing and delivery, so it must return quickly and must not block:
// aggregate in memory, or hand the event to a buffered channel. A panic in
// Record is recovered and logged, never passed to the caller.
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
