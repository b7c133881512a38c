package outbox

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/internal/engine"
)

// The engine names its metric events, observed outcomes and terminal
// reasons, and keeps its StopSlack, with its own constants; they are the
// public ones, value for value. (MetricEvent, DeliveryInfo and DeliveryOutcome are converted
// from the engine's, which the compiler holds field for field.)
func TestEngineSpeaksThePublicNames(t *testing.T) {
	t.Parallel()
	public := []string{
		EventFetched, EventDispatched, EventAcked, EventRetried, EventDeadLettered, EventTerminal, EventLeaseLost,
		EventWriteRefused, EventDrainTimeout,
		OutcomeAcked, OutcomeRetried, OutcomeDeadLettered, OutcomeDropped, OutcomeAbandoned,
		ReasonMaxDeliveries, ReasonRetryExhausted, ReasonRejected, ReasonDecodeError,
	}
	internal := []string{
		engine.EventFetched, engine.EventDispatched, engine.EventAcked, engine.EventRetried, engine.EventDeadLettered,
		engine.EventTerminal, engine.EventLeaseLost, engine.EventWriteRefused, engine.EventDrainTimeout,
		engine.OutcomeAcked, engine.OutcomeRetried, engine.OutcomeDeadLettered, engine.OutcomeDropped, engine.OutcomeAbandoned,
		engine.ReasonMaxDeliveries, engine.ReasonRetryExhausted, engine.ReasonRejected, engine.ReasonDecodeError,
	}
	if diff := cmp.Diff(public, internal); diff != "" {
		t.Errorf("engine names (-public +engine):\n%s", diff)
	}
	if StopSlack != engine.StopSlack {
		t.Errorf("StopSlack %v; the engine's %v", StopSlack, engine.StopSlack)
	}
}
