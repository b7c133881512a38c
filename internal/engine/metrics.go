package engine

import (
	"log/slog"
	"sync/atomic"
	"time"
)

// The metric events the engine emits, as outbox documents them
// (outbox.EventFetched, ...): the same names, checked by a test there.
const (
	EventFetched      = "fetched"
	EventDispatched   = "dispatched"
	EventAcked        = "acked"
	EventRetried      = "retried"
	EventDeadLettered = "dead_lettered"
	EventTerminal     = "terminal"
	EventLeaseLost    = "lease_lost"
	EventWriteRefused = "write_refused"
	EventDrainTimeout = "drain_timeout"
)

// MetricEvent is outbox.MetricEvent, field for field, so that package
// converts one to the other; outbox documents the fields.
type MetricEvent struct {
	Name       string
	Queue      string
	Subscriber string
	ID         int64
	Deliveries int
	Reason     string
	Delay      time.Duration
	Count      int
	Bytes      int
	Duration   time.Duration
	Age        time.Duration
	ErrorType  string
}

// MetricsRecorder receives a run's metric events from a goroutine of
// their own (see metricsSink).
type MetricsRecorder interface {
	Record(MetricEvent)
}

// record hands ev to r, shielding the sink from a panicking recorder.
func record(r MetricsRecorder, log *slog.Logger, ev MetricEvent) {
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
