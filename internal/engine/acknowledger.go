package engine

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
	"github.com/outboxgen/outboxgen/internal/lease"
)

// acknowledge writes outcomes in batches, flushing when a batch holds
// AckBatchSize outcomes or its oldest is AckLinger old, until outcomes is
// closed; then it writes what is left. An outcome of a row with an
// ordering key does not linger: its key's next row waits for the write,
// so the batch is written with whatever outcomes are already queued. Every write is filtered by the lease
// token, and each outcome's metric is emitted only after its write lands.
//
// ctx bounds every write: once it is done (the graceful timeout after a
// stop has passed) nothing more is written, and the outcomes that were not
// are counted in the result. Their rows keep their leases and are
// delivered again when the leases expire.
func (r *run) acknowledge(ctx context.Context) (unwritten int) {
	cfg := r.s
	var (
		batch  []lease.Outcome
		linger *time.Timer
		due    <-chan time.Time
	)
	flush := func() {
		unwritten += len(r.flushRetrying(ctx, batch))
		batch = nil
		if linger != nil {
			linger.Stop()
		}
		due = nil
	}
	for {
		select {
		case o, ok := <-r.outcomes:
			if !ok {
				flush()
				return unwritten
			}
			if ctx.Err() != nil {
				unwritten++
				continue
			}
			batch = append(batch, o)
			if o.D.Row.OrderingKey != nil {
				// The row's key waits for this write: take what is
				// already queued and write without lingering.
				closed := false
				batch, closed = r.takeQueued(batch, cfg.AckBatchSize)
				flush()
				if closed {
					return unwritten
				}
				continue
			}
			if len(batch) >= cfg.AckBatchSize {
				flush()
			} else if due == nil {
				linger = time.NewTimer(cfg.AckLinger)
				due = linger.C
			}
		case <-due:
			flush()
		}
	}
}

// takeQueued appends the outcomes already waiting in r.outcomes to batch,
// without blocking, until it holds max; closed reports that the channel
// was closed (the run is ending).
func (r *run) takeQueued(batch []lease.Outcome, max int) (_ []lease.Outcome, closed bool) {
	for len(batch) < max {
		select {
		case o, ok := <-r.outcomes:
			if !ok {
				return batch, true
			}
			batch = append(batch, o)
		default:
			return batch, false
		}
	}
	return batch, false
}

// flushRetrying writes batch, retrying failed statements with backoff
// while ctx lives; it returns what could not be written.
func (r *run) flushRetrying(ctx context.Context, batch []lease.Outcome) []lease.Outcome {
	errs := dbx.Backoff{Base: 50 * time.Millisecond, Max: min(5*time.Second, r.s.MaxFetchInterval)}
	for len(batch) > 0 {
		var err error
		if batch, err = r.flush(ctx, batch); err == nil {
			return batch
		}
		if ctx.Err() != nil {
			return batch
		}
		wait := errs.Next()
		r.s.Log.ErrorContext(ctx, "outbox: writing outcomes failed; retrying",
			slog.Int("outcomes", len(batch)), slog.Any("error", err), slog.Duration("backoff", wait))
		dbx.Sleep(ctx, wait)
	}
	return batch
}

// flush writes batch: deletes, retries and dead letters. It returns the
// outcomes still unwritten when a statement fails.
func (r *run) flush(ctx context.Context, batch []lease.Outcome) ([]lease.Outcome, error) {
	var deletes, retries, dead []lease.Outcome
	for _, o := range batch {
		switch o.Kind {
		case lease.Ack, lease.Drop:
			deletes = append(deletes, o)
		case lease.Retry:
			retries = append(retries, o)
		default:
			dead = append(dead, o)
		}
	}
	// Once writes land, the fetcher claims at once: retried rows may be due
	// before the end of its idle wait, and deleted or dead-lettered rows
	// with a key handed the key to its next row.
	wake := false
	defer func() {
		if wake {
			r.wakeFetcher()
		}
	}()
	if left, err := r.write(ctx, deletes, r.writeDeletes); err != nil {
		return append(append(left, retries...), dead...), err
	}
	wake = lease.Keyed(deletes)
	r.claims.HandedOn(deletes)
	if left, err := r.write(ctx, retries, r.writeRetries); err != nil {
		return append(left, dead...), err
	}
	wake = wake || len(retries) > 0
	for i := range dead {
		if left, err := r.write(ctx, dead[i:i+1], r.writeDeadLetter); err != nil {
			return append(left, dead[i+1:]...), err
		}
	}
	wake = wake || lease.Keyed(dead)
	r.claims.HandedOn(dead)
	return nil, nil
}

// writeFunc writes outcomes in one statement and returns the leases it
// matched.
type writeFunc func(ctx context.Context, os []lease.Outcome) ([]lease.Lease, error)

// write writes os with w. When the database refuses the statement for its
// values (isPermanent: writing them again fails the same way) it writes the
// outcomes one by one and gives up only those it refuses, so one bad
// outcome never holds back the others. Any other error returns os
// unwritten.
func (r *run) write(ctx context.Context, os []lease.Outcome, w writeFunc) ([]lease.Outcome, error) {
	if len(os) == 0 {
		return nil, nil
	}
	done, err := w(ctx, os)
	switch {
	case err == nil:
		r.landed(os, done)
		return nil, nil
	case !dbx.IsPermanent(err):
		return os, err
	case len(os) == 1:
		r.refused(ctx, os[0], err)
		return nil, nil
	}
	for i := range os {
		if left, err := r.write(ctx, os[i:i+1], w); err != nil {
			return append(left, os[i+1:]...), err
		}
	}
	return nil, nil
}

func (r *run) writeDeletes(ctx context.Context, os []lease.Outcome) ([]lease.Lease, error) {
	ids, tokens := leaseArgs(os)
	rows, err := r.queries().DeleteBatchWithLease(ctx, db.DeleteBatchWithLeaseParams{Ids: ids, Tokens: tokens})
	return lease.LeasesOf(rows, func(r db.DeleteBatchWithLeaseRow) (int64, pgtype.UUID) { return r.ID, r.Token }), err
}

func (r *run) writeRetries(ctx context.Context, os []lease.Outcome) ([]lease.Lease, error) {
	ids, tokens := leaseArgs(os)
	delays := make([]float64, len(os))
	texts := make([]string, len(os))
	for i, o := range os {
		delays[i], texts[i] = o.Delay.Seconds(), o.Text
	}
	rows, err := r.queries().MarkPendingBatchWithLease(ctx, db.MarkPendingBatchWithLeaseParams{
		Ids: ids, Tokens: tokens, DelaySeconds: delays, LastErrors: texts})
	return lease.LeasesOf(rows, func(r db.MarkPendingBatchWithLeaseRow) (int64, pgtype.UUID) { return r.ID, r.Token }), err
}

// writeDeadLetter moves one row to the dead-letter table. Should the
// database refuse the error text, the row goes with a placeholder instead.
func (r *run) writeDeadLetter(ctx context.Context, os []lease.Outcome) ([]lease.Lease, error) {
	o := os[0]
	q := r.queries()
	p := db.DeadLetterWithLeaseParams{ID: o.D.Row.ID, Token: o.D.Token, Attempted: o.Attempted, Reason: o.Reason, LastError: &o.Text}
	n, err := q.DeadLetterWithLease(ctx, p)
	if dbx.IsPermanent(err) {
		placeholder := fmt.Sprintf("(the error text could not be stored: SQLSTATE %s)", dbx.SQLState(err))
		p.LastError = &placeholder
		n, err = q.DeadLetterWithLease(ctx, p)
	}
	if err != nil || n == 0 {
		return nil, err
	}
	return []lease.Lease{o.D.Lease()}, nil
}

// refused gives up an outcome the database will not store: its row keeps
// its lease and is delivered again when the lease expires.
func (r *run) refused(ctx context.Context, o lease.Outcome, err error) {
	r.s.Log.ErrorContext(o.D.Context(), "outbox: the database refused an outcome; the row is left to lease expiry",
		append(rowAttrs(o.D), slog.String("write", lease.Writes[o.Kind]), slog.String("sqlstate", dbx.SQLState(err)), slog.Any("error", err))...)
	r.emit(MetricEvent{Name: EventWriteRefused, Queue: o.D.Row.Queue, ID: o.D.Row.ID, Deliveries: int(o.D.Row.DeliveriesCount),
		Reason: lease.Writes[o.Kind]})
}

// landed emits the metrics and logs of written outcomes; done are the
// leases the write matched, and any other delivery lost its lease.
func (r *run) landed(os []lease.Outcome, done []lease.Lease) {
	// A write returns only leases it was given, and the deliveries of os
	// are distinct: when it returns as many as it was given, all matched.
	var matched map[lease.Lease]bool
	if len(done) < len(os) {
		matched = make(map[lease.Lease]bool, len(done))
		for _, l := range done {
			matched[l] = true
		}
	}
	r.report(os, matched)
}

// report emits the metrics and logs of outcomes whose writes landed: all
// of os when matched is nil, else those whose lease it holds; any other
// lost its lease.
func (r *run) report(os []lease.Outcome, matched map[lease.Lease]bool) {
	for _, o := range os {
		d := o.D
		ev := MetricEvent{Queue: d.Row.Queue, ID: d.Row.ID, Deliveries: int(d.Row.DeliveriesCount), Duration: o.Ran, Reason: o.Reason}
		if matched != nil && !matched[d.Lease()] {
			ev.Name, ev.Reason = EventLeaseLost, lease.Writes[o.Kind]
			r.s.Log.WarnContext(d.Context(), "outbox: lease lost before the outcome was written; the newer delivery decides",
				append(rowAttrs(d), slog.String("write", ev.Reason))...)
			r.emit(ev)
			continue
		}
		switch o.Kind {
		case lease.Ack:
			ev.Name = EventAcked
		case lease.Retry:
			ev.Name, ev.Delay = EventRetried, o.Delay
			r.logs.note(d, "retried", o.Text)
		case lease.DeadLetter:
			ev.Name = EventDeadLettered
			r.logs.note(d, "dead_lettered:"+o.Reason, o.Text)
		case lease.Drop:
			ev.Name = EventTerminal
			r.logs.note(d, "deleted:"+o.Reason, o.Text)
		}
		r.emit(ev)
	}
}

func leaseArgs(os []lease.Outcome) ([]int64, []pgtype.UUID) {
	ids := make([]int64, len(os))
	tokens := make([]pgtype.UUID, len(os))
	for i, o := range os {
		ids[i], tokens[i] = o.D.Row.ID, o.D.Token
	}
	return ids, tokens
}
