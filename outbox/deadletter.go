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
	// Payload is the encoded message.
	Payload []byte `json:"payload"`
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
	// OlderThan selects rows dead-lettered at least this long ago.
	OlderThan time.Duration
	// IDs selects the rows with these ids (an operator's selection); empty
	// selects by the other fields alone.
	IDs []int64
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
		Queue: orNil(f.Queue), Reason: orNil(f.Reason), Ids: f.ids(), OlderThanSeconds: f.OlderThan.Seconds(),
		AfterID: afterID, MaxRows: int32(min(limit, 1<<30)),
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: DeadLetters: %w", err)
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
	if err := f.check(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, &InputError{Field: "limit", Rule: "must be positive"}
	}
	rows, err := o.queries(o.pool).ListDeadLettersNewest(ctx, db.ListDeadLettersNewestParams{
		Queue: orNil(f.Queue), Reason: orNil(f.Reason), Ids: f.ids(), OlderThanSeconds: f.OlderThan.Seconds(),
		BeforeID: beforeID, MaxRows: int32(min(limit, 1<<30)),
	})
	if err != nil {
		return nil, wrapOp("NewestDeadLetters", err)
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

// replayBatch is how many rows one replay statement moves.
const replayBatch = 500

// replayRetries is how many times one batch is run again after a
// publisher committed a timer id the batch was moving.
const replayRetries = 5

// ReplayOpts are options of [Outbox.ReplayDeadLetters]. A nil *ReplayOpts
// means the defaults.
type ReplayOpts struct {
	// DropConflictingTimerIDs replays a row whose timer id is live in the
	// outbox (a row of its queue holds the same timer id) without its timer
	// id, instead of leaving it in the dead-letter table. Default false.
	DropConflictingTimerIDs bool

	// DryRun reports what the replay would do now, moving nothing: the
	// same statements run in a transaction that is rolled back, so the
	// result counts the rows it would replay and lists the timer
	// conflicts it would meet, as of that moment.
	DryRun bool

	// Progress, when not nil, is called after each batch with the rows
	// handled so far (replayed or skipped) and the total to handle.
	Progress func(done, total int64)
}

// TimerConflict names a dead-lettered row whose timer id was live in the
// outbox when it was to be replayed.
type TimerConflict struct {
	// ID is the row's id in the dead-letter table.
	ID int64 `json:"id"`
	// Queue is its queue.
	Queue string `json:"queue"`
	// TimerID is the timer id a live row of Queue holds.
	TimerID string `json:"timer_id"`
}

// ReplayResult is what [Outbox.ReplayDeadLetters] did.
type ReplayResult struct {
	// Replayed counts the rows moved into the outbox, TimerIDsDropped
	// included.
	Replayed int64 `json:"replayed"`
	// Skipped lists, in id order, the rows left in the dead-letter table
	// because their timer id was live in the outbox.
	Skipped []TimerConflict `json:"skipped,omitempty"`
	// TimerIDsDropped lists, in id order, the rows replayed without their
	// timer id under [ReplayOpts.DropConflictingTimerIDs].
	TimerIDsDropped []TimerConflict `json:"timer_ids_dropped,omitempty"`
}

// ReplayDeadLetters moves the dead-lettered rows matching f back into the
// outbox, in batches of 500, each batch one statement: however the replay
// ends (an error, a cancelled ctx), every row is in exactly one of the two
// tables, and none twice. Replayed rows get new ids and start from zero
// attempts with their original payload, headers, ordering key and timer
// id, and each carries [HeaderReplayedFrom] and [HeaderFirstFailedAt],
// which link it to its dead letter (headers another client wrote that are
// not a JSON object are left as they are). Rows dead-lettered after the
// replay began are left for the next one.
// A replayed row with an ordering key joins the end of its key, behind rows
// of the key published since it was dead-lettered.
//
// A row whose timer id is live in the outbox cannot go back with it (one
// live row per queue and timer id): it is left in the dead-letter table
// and listed in [ReplayResult.Skipped], or, with
// [ReplayOpts.DropConflictingTimerIDs], replayed without its timer id and
// listed in [ReplayResult.TimerIDsDropped]. It never fails the rows around
// it. The same holds when two replayed rows share a timer id: the lower id
// takes it.
//
// It returns what it did, also when it returns an error.
func (o *Outbox) ReplayDeadLetters(ctx context.Context, f DeadLetterFilter, opts *ReplayOpts) (ReplayResult, error) {
	var res ReplayResult
	if err := f.check(); err != nil {
		return res, err
	}
	if opts == nil {
		opts = &ReplayOpts{}
	}
	q := o.queries(o.pool)
	if opts.DryRun {
		tx, err := o.pool.Begin(ctx)
		if err != nil {
			return res, wrapOp("ReplayDeadLetters (dry run)", err)
		}
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			_ = tx.Rollback(rctx)
		}()
		q = o.queries(tx)
	}
	count, err := q.CountDeadLetters(ctx, db.CountDeadLettersParams{
		Queue: orNil(f.Queue), Reason: orNil(f.Reason), Ids: f.ids(), OlderThanSeconds: f.OlderThan.Seconds()})
	if err != nil {
		return res, fmt.Errorf("outbox: ReplayDeadLetters: %w", err)
	}
	// Ids start below zero too when other clients wrote them.
	var done int64
	after := int64(math.MinInt64)
	for done < count.Total {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		p := db.ReplayDeadLettersParams{
			Queue: orNil(f.Queue), Reason: orNil(f.Reason), Ids: f.ids(), OlderThanSeconds: f.OlderThan.Seconds(),
			AfterID: after, UpToID: count.MaxID, MaxRows: replayBatch, DropTimerIds: opts.DropConflictingTimerIDs,
			HeaderReplayedFrom: HeaderReplayedFrom, HeaderFirstFailedAt: HeaderFirstFailedAt,
		}
		rows, err := q.ReplayDeadLetters(ctx, p)
		// A publisher committed a timer id of this batch after the
		// statement's snapshot was taken; the statement moved nothing, and
		// run again it sees that row as a conflict.
		// A dry run's transaction is aborted by the failure: it reports it.
		for try := 0; !opts.DryRun && isUniqueViolation(err) && try < replayRetries; try++ {
			rows, err = q.ReplayDeadLetters(ctx, p)
		}
		if err != nil {
			return res, fmt.Errorf("outbox: ReplayDeadLetters after %d rows: %w", res.Replayed, err)
		}
		if len(rows) == 0 {
			break // another replay took the rest
		}
		for _, r := range rows {
			var c TimerConflict
			if r.Conflict {
				c = TimerConflict{ID: r.ID, Queue: r.Queue, TimerID: *r.TimerID}
			}
			switch {
			case r.Moved && r.Conflict:
				res.TimerIDsDropped = append(res.TimerIDsDropped, c)
			case r.Conflict:
				res.Skipped = append(res.Skipped, c)
			}
			if r.Moved {
				res.Replayed++
			}
		}
		done += int64(len(rows))
		after = rows[len(rows)-1].ID
		if opts.Progress != nil {
			opts.Progress(done, count.Total)
		}
	}
	return res, nil
}

// isUniqueViolation reports whether err is PostgreSQL's unique_violation.
func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// CountDeadLetters returns how many dead-lettered rows match f: what
// [Outbox.ReplayDeadLetters] or [Outbox.PurgeDeadLetters] with f would
// handle if nothing changed in between.
func (o *Outbox) CountDeadLetters(ctx context.Context, f DeadLetterFilter) (int64, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	count, err := o.queries(o.pool).CountDeadLetters(ctx, db.CountDeadLettersParams{
		Queue: orNil(f.Queue), Reason: orNil(f.Reason), Ids: f.ids(), OlderThanSeconds: f.OlderThan.Seconds()})
	if err != nil {
		return 0, fmt.Errorf("outbox: CountDeadLetters: %w", err)
	}
	return count.Total, nil
}

// PurgeDeadLetters deletes the dead-lettered rows matching f for good and
// returns how many it deleted.
func (o *Outbox) PurgeDeadLetters(ctx context.Context, f DeadLetterFilter) (int64, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	n, err := o.queries(o.pool).PurgeDeadLetters(ctx, db.PurgeDeadLettersParams{
		Queue: orNil(f.Queue), Reason: orNil(f.Reason), Ids: f.ids(), OlderThanSeconds: f.OlderThan.Seconds()})
	if err != nil {
		return 0, fmt.Errorf("outbox: PurgeDeadLetters: %w", err)
	}
	return n, nil
}
