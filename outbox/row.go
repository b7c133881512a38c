package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
)

// Row states, as [Row.State] reports them.
const (
	// RowReady: due now, waiting for a subscriber.
	RowReady = "ready"
	// RowScheduled: due later (delayed, or waiting for its retry).
	RowScheduled = "scheduled"
	// RowBlocked: waiting behind its ordering key's head.
	RowBlocked = "blocked"
	// RowLeased: a subscriber holds it with a live lease.
	RowLeased = "leased"
	// RowExpired: leased, past its lease's expiry; any claim takes it.
	RowExpired = "expired"
	// RowRetrying chooses, in [RowQuery.State], the scheduled rows that
	// wait for their retry: an attempt failed before. [Row.State] and
	// [RowSummary.State] report them RowScheduled, with their Attempts.
	RowRetrying = "retrying"
)

// Row is one row of the outbox, in whatever state, as [Outbox.Row] reads
// it.
type Row struct {
	// ID is its id.
	ID int64 `json:"id"`
	// Queue is its queue.
	Queue string `json:"queue"`
	// State is RowReady, RowScheduled, RowBlocked, RowLeased or RowExpired,
	// on the server's clock when it was read.
	State string `json:"state"`
	// Payload is the encoded message.
	Payload []byte `json:"payload"`
	// Headers are its headers; RawHeaders holds them as stored when they
	// are not an object of strings, as in [DeadLetter].
	Headers map[string]string `json:"headers,omitempty"`
	// RawHeaders: see Headers.
	RawHeaders json.RawMessage `json:"raw_headers,omitempty"`
	// OrderingKey and TimerID are as published, or empty.
	OrderingKey string `json:"ordering_key,omitempty"`
	// TimerID: see OrderingKey.
	TimerID string `json:"timer_id,omitempty"`
	// Deliveries and Attempts count its claims and handled attempts.
	Deliveries int `json:"deliveries"`
	// Attempts: see Deliveries.
	Attempts int `json:"attempts"`
	// LastError is the last handler error's text, or empty.
	LastError string `json:"last_error,omitempty"`
	// CreatedAt is when it was published, and NextAttemptAt when it is
	// (or was) due.
	CreatedAt time.Time `json:"created_at"`
	// NextAttemptAt: see CreatedAt.
	NextAttemptAt time.Time `json:"next_attempt_at"`
	// FirstAttemptAt and LastAttemptAt bound its handled attempts; zero
	// before the first.
	FirstAttemptAt time.Time `json:"first_attempt_at,omitzero"`
	// LastAttemptAt: see FirstAttemptAt.
	LastAttemptAt time.Time `json:"last_attempt_at,omitzero"`
	// LeasedAt and LeaseExpiresAt are its lease's start and expiry; zero
	// when it is not leased.
	LeasedAt time.Time `json:"leased_at,omitzero"`
	// LeaseExpiresAt: see LeasedAt.
	LeaseExpiresAt time.Time `json:"lease_expires_at,omitzero"`
}

// Row returns the outbox row with the given id, and false when the outbox
// holds none (it was delivered, dead-lettered, or never published). One
// primary-key probe of the outbox table: a row in the ring (written by a
// Publisher with TierRing, or into `<table>_ring`) is found once it moves
// into the table (a retry, a row not yet due, a handler that ran on); the
// ring has no index by id alone, and [Outbox.QueueDepths] counts its
// rows.
func (o *Outbox) Row(ctx context.Context, id int64) (Row, bool, error) {
	return o.row(ctx, fmt.Sprintf("Row %d", id), id)
}

// RowByTimer returns the live row of queue published with timerID (see
// [PublishOptions]), and false when there is none. Two index probes.
func (o *Outbox) RowByTimer(ctx context.Context, queue, timerID string) (Row, bool, error) {
	if err := checkQueueToRead("queue", queue); err != nil {
		return Row{}, false, err
	}
	if timerID == "" {
		return Row{}, false, &InputError{Field: "timerID", Rule: "must not be empty"}
	}
	if err := checkKey("timerID", timerID); err != nil {
		return Row{}, false, err
	}
	op := fmt.Sprintf("RowByTimer %q in %q", timerID, queue)
	id, err := o.queries(o.pool).GetRowIDByTimer(ctx, db.GetRowIDByTimerParams{Queue: queue, TimerID: timerID})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Row{}, false, nil
	case err != nil:
		return Row{}, false, o.readError(ctx, op, err)
	}
	return o.row(ctx, op, id)
}

func (o *Outbox) row(ctx context.Context, op string, id int64) (Row, bool, error) {
	r, err := o.queries(o.pool).GetRow(ctx, id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Row{}, false, nil
	case err != nil:
		return Row{}, false, o.readError(ctx, op, err)
	}
	out := Row{
		ID: r.ID, Queue: r.Queue, Payload: r.Payload, Deliveries: int(r.DeliveriesCount), Attempts: int(r.AttemptsCount),
		CreatedAt: r.CreatedAt, NextAttemptAt: r.NextAttemptAt, FirstAttemptAt: r.FirstAttemptAt,
		LastAttemptAt: r.LastAttemptAt, LeasedAt: r.AcquiredAt, LeaseExpiresAt: r.LeaseExpiresAt,
	}
	if r.OrderingKey != nil {
		out.OrderingKey = *r.OrderingKey
	}
	if r.TimerID != nil {
		out.TimerID = *r.TimerID
	}
	if r.LastError != nil {
		out.LastError = *r.LastError
	}
	var hc headerCache
	out.Headers, out.RawHeaders = readHeaders(&hc, r.Headers)
	out.State = rowState(r.Leased, r.Blocked, r.LeaseExpiresAt, r.NextAttemptAt, r.ReadAt)
	return out, true, nil
}

// rowState is the state of a row read at readAt: leased (its lease
// expiring at expires), blocked behind its key, or due at due.
func rowState(leased, blocked bool, expires, due, readAt time.Time) string {
	switch {
	case leased && expires.Before(readAt):
		return RowExpired
	case leased:
		return RowLeased
	case blocked:
		return RowBlocked
	case due.After(readAt):
		return RowScheduled
	default:
		return RowReady
	}
}
