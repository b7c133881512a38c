package engine

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxgen/outboxgen/internal/lease"
)

// DeliveryObserver is outbox.DeliveryObserver, with this package's
// DeliveryInfo and DeliveryOutcome.
type DeliveryObserver interface {
	Start(ctx context.Context, d DeliveryInfo) context.Context
	End(ctx context.Context, d DeliveryInfo, o DeliveryOutcome)
}

// DeliveryInfo is outbox.DeliveryInfo, field for field.
type DeliveryInfo struct {
	Subscriber  string
	Queue       string
	ID          int64
	Deliveries  int
	Attempts    int
	OrderingKey string
	Headers     map[string]string
}

// DeliveryOutcome is outbox.DeliveryOutcome, field for field.
type DeliveryOutcome struct {
	Outcome string
	Err     error
	Delay   time.Duration
	Reason  string
	Ran     time.Duration
}

// The outcomes an observer is told, as outbox documents them
// (outbox.OutcomeAcked, ...).
const (
	OutcomeAcked        = "acked"
	OutcomeRetried      = "retried"
	OutcomeDeadLettered = "dead_lettered"
	OutcomeDropped      = "dropped"
	OutcomeAbandoned    = "abandoned"
)

// deliveryInfo describes d for an observer.
func (r *run) deliveryInfo(d *lease.Delivery, headers map[string]string) DeliveryInfo {
	info := DeliveryInfo{
		Subscriber: r.s.Name, Queue: d.Row.Queue, ID: d.Row.ID, Deliveries: int(d.Row.DeliveriesCount),
		Attempts: lease.Attempts(d.Row.AttemptsCount), Headers: headers,
	}
	if d.Row.OrderingKey != nil {
		info.OrderingKey = *d.Row.OrderingKey
	}
	return info
}

// observeStart runs the observer's Start, keeping ctx when it panics or
// returns nil.
func (r *run) observeStart(ctx context.Context, info DeliveryInfo) (out context.Context) {
	out = ctx
	defer func() {
		if p := recover(); p != nil {
			out = ctx
			r.s.Log.ErrorContext(ctx, "outbox: delivery observer panicked in Start", slog.Any("panic", p))
		}
	}()
	if c := r.s.Observer.Start(ctx, info); c != nil {
		out = c
	}
	return out
}

// observeEnd runs the observer's End.
func (r *run) observeEnd(ctx context.Context, info DeliveryInfo, o DeliveryOutcome) {
	defer func() {
		if p := recover(); p != nil {
			r.s.Log.ErrorContext(ctx, "outbox: delivery observer panicked in End", slog.Any("panic", p))
		}
	}()
	r.s.Observer.End(ctx, info, o)
}

// deliveryOutcome describes a decided outcome for an observer.
func deliveryOutcome(o lease.Outcome, herr error) DeliveryOutcome {
	out := DeliveryOutcome{Err: herr, Delay: o.Delay, Reason: o.Reason, Ran: o.Ran}
	switch o.Kind {
	case lease.Ack:
		out.Outcome = OutcomeAcked
	case lease.Retry:
		out.Outcome = OutcomeRetried
	case lease.DeadLetter:
		out.Outcome = OutcomeDeadLettered
	case lease.Drop:
		out.Outcome = OutcomeDropped
	default:
		out.Outcome = fmt.Sprint("kind ", int(o.Kind))
	}
	return out
}
