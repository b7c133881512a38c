package outbox

import (
	"log/slog"
	"sync/atomic"
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

// metricsBuffer is the fewest events a subscriber queues for its
// recorder before it drops them; it queues at least four claims' worth
// (see newMetricsSink), as a claim's outcomes are emitted together when
// it ends.
const metricsBuffer = 4096

// metricsSink hands events to a recorder from a goroutine of its own, so a
// slow or stuck recorder costs dropped events, never delivery.
type metricsSink struct {
	r        MetricsRecorder
	log      *slog.Logger
	ch       chan MetricEvent
	done     chan struct{}
	stopping atomic.Bool
	dropped  atomic.Int64
}

// newMetricsSink starts a sink; nil when there is no recorder.
func newMetricsSink(r MetricsRecorder, log *slog.Logger, batch int) *metricsSink {
	if r == nil {
		return nil
	}
	s := &metricsSink{r: r, log: log, ch: make(chan MetricEvent, max(metricsBuffer, 4*batch)), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for ev := range s.ch {
			if s.stopping.Load() {
				s.dropped.Add(1)
				continue
			}
			record(s.r, s.log, ev)
		}
	}()
	return s
}

// emit queues ev without blocking, dropping it when the buffer is full.
func (s *metricsSink) emit(ev MetricEvent) {
	if s == nil {
		return
	}
	select {
	case s.ch <- ev:
	default:
		if s.dropped.Add(1) == 1 {
			s.log.Warn("outbox: metrics recorder is falling behind; dropping events")
		}
	}
}

// close stops the sink, delivering queued events for at most grace; the
// rest are dropped. A Record call that never returns is abandoned. No emit
// may follow.
func (s *metricsSink) close(grace time.Duration) {
	if s == nil {
		return
	}
	close(s.ch)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-s.done:
	case <-t.C:
		s.stopping.Store(true)
		select {
		case <-s.done:
		case <-time.After(grace):
			s.log.Warn("outbox: metrics recorder did not return; abandoning it")
		}
	}
	if n := s.dropped.Load(); n > 0 {
		s.log.Warn("outbox: metric events dropped because the recorder was slow", slog.Int64("dropped", n))
	}
}
