package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxgen/outboxgen/db"
)

// DeadLetter is a row in the dead-letter table.
type DeadLetter struct {
	// ID is the id the row had in the outbox.
	ID int64 `json:"id"`
	// Queue is the queue it was published to.
	Queue string `json:"queue"`
	// Payload is the encoded message.
	Payload []byte `json:"payload"`
	// Headers are its headers.
	Headers map[string]string `json:"headers,omitempty"`
	// OrderingKey and TimerID are as published, or empty.
	OrderingKey string `json:"ordering_key,omitempty"`
	// TimerID: see OrderingKey.
	TimerID string `json:"timer_id,omitempty"`
	// Deliveries and Attempts count its claims and handled attempts.
	Deliveries int `json:"deliveries"`
	// Attempts: see Deliveries.
	Attempts int `json:"attempts"`
	// CreatedAt is when it was published; FailedAt when it was dead-lettered.
	CreatedAt time.Time `json:"created_at"`
	// FailedAt: see CreatedAt.
	FailedAt time.Time `json:"failed_at"`
	// Reason is why: ReasonMaxDeliveries, ReasonRetryExhausted,
	// ReasonRejected or ReasonDecodeError.
	Reason string `json:"reason"`
	// LastError is the last error's text, cut to 2,048 characters.
	LastError string `json:"last_error,omitempty"`
}

// DeadLetterFilter selects dead-lettered rows; zero fields select all.
type DeadLetterFilter struct {
	// Queue selects one queue.
	Queue string
	// Reason selects one failure reason.
	Reason string
	// OlderThan selects rows dead-lettered at least this long ago.
	OlderThan time.Duration
}

func (f DeadLetterFilter) check() error {
	if f.OlderThan < 0 {
		return &InputError{Field: "DeadLetterFilter.OlderThan", Rule: "must not be negative"}
	}
	switch f.Reason {
	case "", ReasonMaxDeliveries, ReasonRetryExhausted, ReasonRejected, ReasonDecodeError:
		return nil
	}
	return &InputError{Field: "DeadLetterFilter.Reason",
		Rule: fmt.Sprintf("%q is not one of max_deliveries, retry_exhausted, rejected, decode_error", f.Reason)}
}

func orNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// DeadLetters returns up to limit dead-lettered rows matching f with ids
// above afterID, in id order; pass the last id back as afterID for the
// next page.
func (o *Outbox) DeadLetters(ctx context.Context, f DeadLetterFilter, afterID int64, limit int) ([]DeadLetter, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, &InputError{Field: "limit", Rule: "must be positive"}
	}
	rows, err := o.queries(o.pool).ListDeadLetters(ctx, db.ListDeadLettersParams{
		Queue: orNil(f.Queue), Reason: orNil(f.Reason), OlderThanSeconds: f.OlderThan.Seconds(),
		AfterID: afterID, MaxRows: int32(min(limit, 1<<30)),
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: DeadLetters: %w", err)
	}
	var hc headerCache
	out := make([]DeadLetter, len(rows))
	for i, r := range rows {
		d := DeadLetter{
			ID: r.ID, Queue: r.Queue, Payload: r.Payload, Deliveries: int(r.DeliveriesCount), Attempts: int(r.AttemptsCount),
			CreatedAt: r.CreatedAt, FailedAt: r.FailedAt, Reason: r.FailureReason,
		}
		if r.OrderingKey != nil {
			d.OrderingKey = *r.OrderingKey
		}
		if r.TimerID != nil {
			d.TimerID = *r.TimerID
		}
		if r.LastError != nil {
			d.LastError = *r.LastError
		}
		if len(r.Headers) > 0 {
			// Headers written by other clients may not be a string map;
			// they are left out rather than failing the read.
			d.Headers, _ = hc.decode(r.Headers)
		}
		out[i] = d
	}
	return out, nil
}

// replayBatch is how many rows one replay statement moves.
const replayBatch = 500

// ReplayDeadLetters moves the dead-lettered rows matching f back into the
// outbox, in batches of 500, each batch one statement: however the replay
// ends (an error, a cancelled ctx), every row is in exactly one of the two
// tables, and none twice. Replayed rows get new ids and start from zero
// attempts with their original payload and headers. Rows dead-lettered
// after the replay began are left for the next one. progress, when not
// nil, is called after each batch with the rows moved so far and the
// total to move. It returns the rows moved.
func (o *Outbox) ReplayDeadLetters(ctx context.Context, f DeadLetterFilter, progress func(done, total int64)) (int64, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	q := o.queries(o.pool)
	count, err := q.CountDeadLetters(ctx, db.CountDeadLettersParams{
		Queue: orNil(f.Queue), Reason: orNil(f.Reason), OlderThanSeconds: f.OlderThan.Seconds()})
	if err != nil {
		return 0, fmt.Errorf("outbox: ReplayDeadLetters: %w", err)
	}
	var done int64
	for done < count.Total {
		if err := ctx.Err(); err != nil {
			return done, err
		}
		ids, err := q.ReplayDeadLetters(ctx, db.ReplayDeadLettersParams{
			Queue: orNil(f.Queue), Reason: orNil(f.Reason), OlderThanSeconds: f.OlderThan.Seconds(),
			UpToID: count.MaxID, MaxRows: replayBatch,
		})
		if err != nil {
			return done, fmt.Errorf("outbox: ReplayDeadLetters after %d rows: %w", done, err)
		}
		if len(ids) == 0 {
			break // another replay took the rest
		}
		done += int64(len(ids))
		if progress != nil {
			progress(done, count.Total)
		}
	}
	return done, nil
}

// PurgeDeadLetters deletes the dead-lettered rows matching f for good and
// returns how many it deleted.
func (o *Outbox) PurgeDeadLetters(ctx context.Context, f DeadLetterFilter) (int64, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	n, err := o.queries(o.pool).PurgeDeadLetters(ctx, db.PurgeDeadLettersParams{
		Queue: orNil(f.Queue), Reason: orNil(f.Reason), OlderThanSeconds: f.OlderThan.Seconds()})
	if err != nil {
		return 0, fmt.Errorf("outbox: PurgeDeadLetters: %w", err)
	}
	return n, nil
}
