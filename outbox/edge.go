package outbox

import (
	"context"
	"time"

	"github.com/outboxgen/outboxgen/internal/engine"
)

// The engine (internal/engine) runs subscribers without their message
// type and mirrors the public types it reports through. These adapters
// hand it the public strategy, recorder and observer a SubscriberConfig
// names.

// retryOf asks a RetryStrategy as the engine does: a panic or an unusable
// answer is a problem, which ends the delivery.
type retryOf struct{ s RetryStrategy }

// NextDelay asks the strategy for the delay before attempt.
func (r retryOf) NextDelay(attempt int, elapsed time.Duration, err error) (time.Duration, bool, error) {
	return nextDelay(r.s, attempt, elapsed, err)
}

// Allow asks whether the strategy's caps let a delivery retry after a
// delay the handler chose.
func (r retryOf) Allow(attempt int, elapsed, delay time.Duration, err error) (bool, error) {
	return allowRetry(r.s, attempt, elapsed, delay, err)
}

// recorderOf hands the engine's metric events to a MetricsRecorder.
type recorderOf struct{ r MetricsRecorder }

// Record converts ev, field for field, and records it.
func (r recorderOf) Record(ev engine.MetricEvent) { r.r.Record(MetricEvent(ev)) }

// observerOf shows the engine's deliveries to a DeliveryObserver.
type observerOf struct{ o DeliveryObserver }

// Start calls the observer's Start.
func (o observerOf) Start(ctx context.Context, d engine.DeliveryInfo) context.Context {
	return o.o.Start(ctx, DeliveryInfo(d))
}

// End calls the observer's End.
func (o observerOf) End(ctx context.Context, d engine.DeliveryInfo, out engine.DeliveryOutcome) {
	o.o.End(ctx, DeliveryInfo(d), DeliveryOutcome(out))
}
