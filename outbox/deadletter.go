package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgen/outboxgen/db"
)

// DeadLetter is a row in the dead-letter table.
type DeadLetter struct {
	// ID is the id the row had in the outbox.
	ID int64 `json:"id"`
	// Queue is the queue it was published to.
	Queue string `json:"queue"`
	// Payload is the encoded message; from
	// [Outbox.NewestDeadLetterPreviews], only its first bytes.
	Payload []byte `json:"payload"`
	// PayloadSize is the payload's length in bytes, also when Payload
	// holds only its first bytes.
	PayloadSize int `json:"payload_size"`
	// PayloadCut says Payload holds only the payload's first bytes:
	// [Outbox.NewestDeadLetterPreviews] cut it.
	PayloadCut bool `json:"payload_cut,omitempty"`
	// Headers are its headers.
	Headers map[string]string `json:"headers,omitempty"`
	// RawHeaders holds the headers column as stored when it is not an
	// object of strings (another client wrote it; such a row ends with
	// reason decode_error), and Headers is nil. Otherwise it is nil.
	RawHeaders json.RawMessage `json:"raw_headers,omitempty"`
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
	// Cause, when not nil, selects the rows whose last error is this
	// cause as [Outbox.DeadLetterCauses] writes it (digit and id-like runs
	// as "#"; "" for rows without a last error): every dead letter of the
	// group, not only the sample's. Matching it reads each candidate row's
	// last error, so a cause is best given with its Queue and Reason.
	Cause *string
	// OlderThan selects rows dead-lettered at least this long ago.
	OlderThan time.Duration
	// IDs selects the rows with these ids (an operator's selection); empty
	// selects by the other fields alone.
	IDs []int64
	// UpToID, when not nil, selects only rows with ids up to and
	// including *UpToID: the bound a dry run returns
	// ([ReplayResult.UpToID], [PurgeResult.UpToID]), so that the action
	// confirmed after it leaves the rows dead-lettered since with higher
	// ids. Nil selects every id.
	UpToID *int64
}

// upTo is the highest id f selects.
func (f DeadLetterFilter) upTo() int64 {
	if f.UpToID == nil {
		return math.MaxInt64
	}
	return *f.UpToID
}

// ids is IDs for the queries, where NULL (a nil slice) selects every id.
func (f DeadLetterFilter) ids() []int64 {
	if len(f.IDs) == 0 {
		return nil
	}
	return f.IDs
}

func (f DeadLetterFilter) check() error {
	if f.OlderThan < 0 {
		return &InputError{Field: "DeadLetterFilter.OlderThan", Rule: "must not be negative"}
	}
	if f.Cause != nil {
		if err := checkText("DeadLetterFilter.Cause", *f.Cause, 2048, false); err != nil {
			return err
		}
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
// next page. Ids are positive unless another client wrote the rows: pass
// math.MinInt64 for a first page that cannot miss one.
func (o *Outbox) DeadLetters(ctx context.Context, f DeadLetterFilter, afterID int64, limit int) ([]DeadLetter, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, &InputError{Field: "limit", Rule: "must be positive"}
	}
	rows, err := o.queries(o.pool).ListDeadLetters(ctx, db.ListDeadLettersParams{
		Queue: orNil(f.Queue), Reason: orNil(f.Reason), Cause: f.Cause, Ids: f.ids(), OlderThanSeconds: f.OlderThan.Seconds(),
		AfterID: afterID, MaxRows: int32(min(limit, 1<<30)),
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: DeadLetters: %w", err)
	}
	// In id order, the rows past the bound are the last ones.
	for len(rows) > 0 && rows[len(rows)-1].ID > f.upTo() {
		rows = rows[:len(rows)-1]
	}
	return deadLettersOf(rows), nil
}

// deadLettersOf converts the rows the dead-letter reads return.
func deadLettersOf[R db.ListDeadLettersRow | db.ListDeadLettersNewestRow | db.GetDeadLetterRow](rows []R) []DeadLetter {
	var hc headerCache
	out := make([]DeadLetter, len(rows))
	for i, row := range rows {
		r := db.ListDeadLettersRow(row)
		d := DeadLetter{
			ID: r.ID, Queue: r.Queue, Payload: r.Payload, PayloadSize: int(r.PayloadSize), PayloadCut: int64(len(r.Payload)) < r.PayloadSize,
			Deliveries: int(r.DeliveriesCount), Attempts: int(r.AttemptsCount),
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
		d.Headers, d.RawHeaders = readHeaders(&hc, r.Headers)
		out[i] = d
	}
	return out
}

// NewestDeadLetters returns up to limit dead-lettered rows matching f with
// ids below beforeID, newest (highest id) first: what failed last. Pass
// math.MaxInt64 for the first page and the last id returned for the next.
// It reads at most limit matching rows' worth of the primary key (or, for
// one queue, of the queue index), so a page costs the same on a dead-letter
// table of any size when the filter matches often.
func (o *Outbox) NewestDeadLetters(ctx context.Context, f DeadLetterFilter, beforeID int64, limit int) ([]DeadLetter, error) {
	return o.newestDeadLetters(ctx, "NewestDeadLetters", f, beforeID, limit, -1)
}

// NewestDeadLetterPreviews is [Outbox.NewestDeadLetters] for a list that
// shows the start of each payload: the database sends at most prefix
// bytes of each payload (and reads little more of a large one), so a
// page's time and memory do not grow with the payloads' size. Each
// DeadLetter's Payload holds those bytes, [DeadLetter.PayloadSize] the
// payload's length and [DeadLetter.PayloadCut] whether it was cut.
// [Outbox.DeadLetter] reads one in full.
func (o *Outbox) NewestDeadLetterPreviews(ctx context.Context, f DeadLetterFilter, beforeID int64, limit, prefix int) ([]DeadLetter, error) {
	if prefix < 0 {
		return nil, &InputError{Field: "prefix", Rule: "must not be negative"}
	}
	return o.newestDeadLetters(ctx, "NewestDeadLetterPreviews", f, beforeID, limit, int32(min(prefix, math.MaxInt32)))
}

// newestDeadLetters reads a page of the newest dead letters, with at most
// prefix bytes of each payload, or all of it when prefix is negative.
func (o *Outbox) newestDeadLetters(ctx context.Context, op string, f DeadLetterFilter, beforeID int64, limit int, prefix int32) ([]DeadLetter, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, &InputError{Field: "limit", Rule: "must be positive"}
	}
	if up := f.upTo(); up < math.MaxInt64 {
		beforeID = min(beforeID, up+1)
	}
	rows, err := o.queries(o.pool).ListDeadLettersNewest(ctx, db.ListDeadLettersNewestParams{
		Queue: orNil(f.Queue), Reason: orNil(f.Reason), Cause: f.Cause, Ids: f.ids(), OlderThanSeconds: f.OlderThan.Seconds(),
		BeforeID: beforeID, MaxRows: int32(min(limit, 1<<30)), PayloadBytes: prefix,
	})
	if err != nil {
		return nil, wrapOp(op, err)
	}
	return deadLettersOf(rows), nil
}

// DeadLetter returns the dead-lettered row with the given id (its id in
// the outbox), and false when the dead-letter table holds none.
func (o *Outbox) DeadLetter(ctx context.Context, id int64) (DeadLetter, bool, error) {
	row, err := o.queries(o.pool).GetDeadLetter(ctx, id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return DeadLetter{}, false, nil
	case err != nil:
		return DeadLetter{}, false, wrapOp(fmt.Sprintf("DeadLetter %d", id), err)
	}
	return deadLettersOf([]db.GetDeadLetterRow{row})[0], true, nil
}

// isUniqueViolation reports whether err is PostgreSQL's unique_violation.
func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}
