package outbox

import (
	"context"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
)

// replayBatch is how many rows one replay statement moves; each batch
// commits on its own.
const replayBatch = 500

// purgeBatch is how many rows one purge statement deletes; each batch
// commits on its own.
const purgeBatch = 1000

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

	// DryRun reports what the replay would do now and does nothing: it
	// reads, in one read-only snapshot, how many rows match and which of
	// them would meet a timer conflict. It takes no row or advisory lock
	// and writes nothing, so a publisher of the same keys or timer ids
	// never waits for it, and it leaves no dead row versions behind. Its
	// [ReplayResult.UpToID] is the bound to pass in
	// [DeadLetterFilter.UpToID] to the replay confirmed after it, and its
	// [ReplayResult.Matched] what that replay's should be if the set did
	// not change.
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

// ReplayResult is what [Outbox.ReplayDeadLetters] did, or with
// [ReplayOpts.DryRun] would do.
type ReplayResult struct {
	// Matched counts the rows that matched the filter (within its UpToID)
	// when the replay began. After a dry run, a replay with the dry run's
	// UpToID whose Matched differs acted on a set that changed in
	// between: rows of lower ids were dead-lettered, rows aged into
	// DeadLetterFilter.OlderThan, or another client took some.
	Matched int64 `json:"matched"`
	// UpToID is the highest id among them (math.MinInt64 when none
	// matched): the bound to carry from a dry run to its confirmation in
	// [DeadLetterFilter.UpToID].
	UpToID int64 `json:"up_to_id"`
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
// outbox, in id order, in batches of 500, each batch one statement that
// commits on its own: however the replay ends (an error, a cancelled ctx),
// every row is in exactly one of the two tables, and none twice; the
// batches before the end are replayed for good, and the same call again
// (with the same f) goes on with the rows that are left. Replayed rows get new ids and start from zero
// attempts with their original payload, headers, ordering key and timer
// id, and each carries [HeaderReplayedFrom] and [HeaderFirstFailedAt],
// which link it to its dead letter (headers another client wrote that are
// not a JSON object are left as they are). Rows with ids above the highest
// that matched when the replay began are left for the next one, and so are
// rows above [DeadLetterFilter.UpToID].
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
// With [ReplayOpts.DryRun] it only reads, and says what the replay would
// do as of that moment.
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
	if opts.DryRun {
		err := pgx.BeginTxFunc(ctx, o.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			if err := o.queries(tx).NoJIT(ctx); err != nil {
				return err
			}
			var err error
			res, err = o.replayDryRun(ctx, tx, f, opts.DropConflictingTimerIDs)
			return err
		})
		if err != nil {
			return res, wrapOp("ReplayDeadLetters (dry run)", err)
		}
		return res, nil
	}
	q := o.queries(o.pool)
	count, err := q.CountDeadLetters(ctx, countParams(f))
	if err != nil {
		return res, fmt.Errorf("outbox: ReplayDeadLetters: %w", err)
	}
	res.Matched, res.UpToID = count.Total, count.MaxID
	err = inBatches(ctx, count.Total, opts.Progress, func(after int64) (int64, int64, error) {
		p := db.ReplayDeadLettersParams{
			Queue: orNil(f.Queue), Reason: orNil(f.Reason), Cause: f.Cause, Ids: f.ids(), OlderThanSeconds: f.OlderThan.Seconds(),
			AfterID: after, UpToID: count.MaxID, MaxRows: replayBatch, DropTimerIds: opts.DropConflictingTimerIDs,
			HeaderReplayedFrom: HeaderReplayedFrom, HeaderFirstFailedAt: HeaderFirstFailedAt,
		}
		rows, err := q.ReplayDeadLetters(ctx, p)
		// A publisher committed a timer id of this batch after the
		// statement's snapshot was taken; the statement moved nothing, and
		// run again it sees that row as a conflict.
		for try := 0; isUniqueViolation(err) && try < replayRetries; try++ {
			rows, err = q.ReplayDeadLetters(ctx, p)
		}
		if err != nil {
			return 0, 0, fmt.Errorf("outbox: ReplayDeadLetters after %d rows: %w", res.Replayed, err)
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
		if len(rows) == 0 {
			return 0, 0, nil
		}
		return int64(len(rows)), rows[len(rows)-1].ID, nil
	})
	return res, err
}

// inBatches runs batch over the total rows an action matched, in id
// order: each call handles the rows after the id it is given (ids start
// below zero too when other clients wrote them) and returns how many it
// looked at and the last id among them. It ends when total rows were
// looked at, when a batch finds none (another client took the rest), at
// an error, or when ctx ends, calling progress, if not nil, after each
// batch.
func inBatches(ctx context.Context, total int64, progress func(done, total int64), batch func(after int64) (looked, last int64, err error)) error {
	var done int64
	after := int64(math.MinInt64)
	for done < total {
		if err := ctx.Err(); err != nil {
			return err
		}
		looked, last, err := batch(after)
		if err != nil {
			return err
		}
		if looked == 0 {
			return nil
		}
		done += looked
		after = last
		if progress != nil {
			progress(done, max(done, total))
		}
	}
	return nil
}

// replayDryRun reads on conn what a replay of f would do: how many rows
// match and which would meet a timer conflict. It runs reads only, so it
// locks no row and writes nothing; on a read-only snapshot of its own the
// two reads agree.
func (o *Outbox) replayDryRun(ctx context.Context, conn db.DBTX, f DeadLetterFilter, drop bool) (ReplayResult, error) {
	var res ReplayResult
	q := o.queries(conn)
	count, err := q.CountDeadLetters(ctx, countParams(f))
	if err != nil {
		return res, err
	}
	res.Matched, res.UpToID = count.Total, count.MaxID
	if count.Total == 0 {
		return res, nil
	}
	rows, err := q.ReplayTimerConflicts(ctx, db.ReplayTimerConflictsParams{
		Queue: orNil(f.Queue), Reason: orNil(f.Reason), Cause: f.Cause, Ids: f.ids(), OlderThanSeconds: f.OlderThan.Seconds(),
		UpToID: count.MaxID})
	if err != nil {
		return res, err
	}
	for _, r := range rows {
		c := TimerConflict{ID: r.ID, Queue: r.Queue, TimerID: r.TimerID}
		if drop {
			res.TimerIDsDropped = append(res.TimerIDsDropped, c)
		} else {
			res.Skipped = append(res.Skipped, c)
		}
	}
	res.Replayed = count.Total - int64(len(res.Skipped))
	return res, nil
}

// countParams are the parameters of CountDeadLetters for f.
func countParams(f DeadLetterFilter) db.CountDeadLettersParams {
	return db.CountDeadLettersParams{Queue: orNil(f.Queue), Reason: orNil(f.Reason), Cause: f.Cause, Ids: f.ids(),
		OlderThanSeconds: f.OlderThan.Seconds(), UpToID: f.upTo()}
}

// CountDeadLetters returns how many dead-lettered rows match f: what
// [Outbox.ReplayDeadLetters] or [Outbox.PurgeDeadLetters] with f would
// handle if nothing changed in between. It only reads.
func (o *Outbox) CountDeadLetters(ctx context.Context, f DeadLetterFilter) (int64, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	count, err := o.queries(o.pool).CountDeadLetters(ctx, countParams(f))
	if err != nil {
		return 0, fmt.Errorf("outbox: CountDeadLetters: %w", err)
	}
	return count.Total, nil
}

// PurgeOpts are options of [Outbox.PurgeDeadLetters]. A nil *PurgeOpts
// means the defaults.
type PurgeOpts struct {
	// DryRun counts the rows a purge would delete now and deletes none: a
	// read that locks nothing. Its [PurgeResult.UpToID] is the bound to
	// pass in [DeadLetterFilter.UpToID] to the purge confirmed after it.
	DryRun bool

	// Progress, when not nil, is called after each batch with the rows
	// handled so far and the total to handle.
	Progress func(done, total int64)
}

// PurgeResult is what [Outbox.PurgeDeadLetters] did, or with
// [PurgeOpts.DryRun] would do.
type PurgeResult struct {
	// Matched and UpToID are as in [ReplayResult]: how many rows matched
	// the filter when the purge began, and the highest id among them.
	Matched int64 `json:"matched"`
	// UpToID: see Matched.
	UpToID int64 `json:"up_to_id"`
	// Deleted counts the rows deleted (none in a dry run).
	Deleted int64 `json:"deleted"`
}

// PurgeDeadLetters deletes the dead-lettered rows matching f for good, in
// id order, in batches of 1,000, each batch one statement that commits on
// its own: when it is interrupted (an error, a cancelled ctx) the batches
// before are deleted, and the same call again (with the same f) goes on
// with the rest. Rows with ids above the highest that matched when it
// began are left, and so are rows above [DeadLetterFilter.UpToID]. It
// returns what it did, also when it returns an error.
func (o *Outbox) PurgeDeadLetters(ctx context.Context, f DeadLetterFilter, opts *PurgeOpts) (PurgeResult, error) {
	var res PurgeResult
	if err := f.check(); err != nil {
		return res, err
	}
	if opts == nil {
		opts = &PurgeOpts{}
	}
	q := o.queries(o.pool)
	count, err := q.CountDeadLetters(ctx, countParams(f))
	if err != nil {
		return res, fmt.Errorf("outbox: PurgeDeadLetters: %w", err)
	}
	res.Matched, res.UpToID = count.Total, count.MaxID
	if opts.DryRun {
		return res, nil
	}
	err = inBatches(ctx, count.Total, opts.Progress, func(after int64) (int64, int64, error) {
		b, err := q.PurgeDeadLetters(ctx, db.PurgeDeadLettersParams{
			Queue: orNil(f.Queue), Reason: orNil(f.Reason), Cause: f.Cause, Ids: f.ids(), OlderThanSeconds: f.OlderThan.Seconds(),
			AfterID: after, UpToID: count.MaxID, MaxRows: purgeBatch})
		if err != nil {
			return 0, 0, fmt.Errorf("outbox: PurgeDeadLetters after %d rows: %w", res.Deleted, err)
		}
		res.Deleted += b.Deleted
		return b.Looked, b.LastID, nil
	})
	return res, err
}
