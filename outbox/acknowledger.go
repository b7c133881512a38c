package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
)

type outcomeKind int

const (
	kindAck        outcomeKind = iota // delete: the handler succeeded
	kindRetry                         // reschedule after delay
	kindDeadLetter                    // move to the dead-letter table
	kindDrop                          // delete a terminal row (no DLQ)
)

// outcome is what became of one delivery.
type outcome struct {
	d         *delivery
	kind      outcomeKind
	delay     time.Duration // kindRetry
	reason    string        // kindDeadLetter, kindDrop
	err       error         // the handler's error or the terminal cause
	attempted bool          // the handler ran
	ran       time.Duration // how long it ran
}

// acknowledge writes outcomes in batches, flushing when a batch holds
// AckBatchSize outcomes or its oldest is AckLinger old, until outcomes is
// closed; then it writes what is left. Every write is filtered by the lease
// token, and each outcome's metric is emitted only after its write lands.
func (r *run[T]) acknowledge(ctx context.Context) error {
	cfg := &r.s.cfg
	var (
		batch  []outcome
		linger *time.Timer
		due    <-chan time.Time
	)
	flush := func() {
		batch = r.flushRetrying(ctx, batch)
		if linger != nil {
			linger.Stop()
		}
		due = nil
	}
	for {
		select {
		case o, ok := <-r.outcomes:
			if !ok {
				return r.final(ctx, batch)
			}
			batch = append(batch, o)
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

// flushRetrying writes batch, retrying database errors with backoff while
// ctx lives; it returns what could not be written.
func (r *run[T]) flushRetrying(ctx context.Context, batch []outcome) []outcome {
	errs := backoff{base: 50 * time.Millisecond, max: 5 * time.Second}
	for len(batch) > 0 {
		var err error
		if batch, err = r.flush(ctx, batch); err == nil {
			return batch
		}
		if ctx.Err() != nil {
			return batch
		}
		wait := errs.next()
		r.s.log.ErrorContext(ctx, "outbox: writing outcomes failed; retrying",
			slog.Int("outcomes", len(batch)), slog.Any("error", err), slog.Duration("backoff", wait))
		sleep(ctx, wait)
	}
	return batch
}

// final writes the last outcomes within the graceful timeout.
func (r *run[T]) final(ctx context.Context, batch []outcome) error {
	ctx, cancel := context.WithTimeout(ctx, r.s.cfg.GracefulTimeout)
	defer cancel()
	if left := r.flushRetrying(ctx, batch); len(left) > 0 {
		return fmt.Errorf("outbox: %d outcomes not written before the graceful timeout; their rows will be delivered again", len(left))
	}
	return nil
}

// flush writes batch: deletes, retries and dead letters. It returns the
// outcomes still unwritten when a statement fails.
func (r *run[T]) flush(ctx context.Context, batch []outcome) ([]outcome, error) {
	q := r.s.ob.queries(r.s.ob.pool)
	var deletes, retries, dead []outcome
	for _, o := range batch {
		switch o.kind {
		case kindAck, kindDrop:
			deletes = append(deletes, o)
		case kindRetry:
			retries = append(retries, o)
		default:
			dead = append(dead, o)
		}
	}
	if len(deletes) > 0 {
		ids, tokens := leaseArgs(deletes)
		done, err := q.DeleteBatchWithLease(ctx, db.DeleteBatchWithLeaseParams{Ids: ids, Tokens: tokens})
		if err != nil {
			return batch, err
		}
		r.landed(deletes, done)
		batch = append(retries, dead...)
	}
	if len(retries) > 0 {
		ids, tokens := leaseArgs(retries)
		delays := make([]float64, len(retries))
		for i, o := range retries {
			delays[i] = o.delay.Seconds()
		}
		done, err := q.MarkPendingBatchWithLease(ctx, db.MarkPendingBatchWithLeaseParams{Ids: ids, Tokens: tokens, DelaySeconds: delays})
		if err != nil {
			return batch, err
		}
		r.landed(retries, done)
		batch = dead
	}
	for i, o := range dead {
		msg := errorText(o.err)
		n, err := q.DeadLetterWithLease(ctx, db.DeadLetterWithLeaseParams{
			ID: o.d.row.ID, Token: o.d.token, Attempted: o.attempted, Reason: o.reason, LastError: &msg,
		})
		if err != nil {
			return dead[i:], err
		}
		var done []int64
		if n == 1 {
			done = []int64{o.d.row.ID}
		}
		r.landed(dead[i:i+1], done)
	}
	return nil, nil
}

// landed emits the metrics and logs of written outcomes; ids are the rows
// the write matched, and any other lost its lease.
func (r *run[T]) landed(os []outcome, ids []int64) {
	matched := make(map[int64]bool, len(ids))
	for _, id := range ids {
		matched[id] = true
	}
	for _, o := range os {
		d := o.d
		ev := MetricEvent{Queue: d.row.Queue, ID: d.row.ID, Deliveries: int(d.row.DeliveriesCount), Duration: o.ran, Reason: o.reason}
		if !matched[d.row.ID] {
			ev.Name, ev.Reason = EventLeaseLost, [...]string{"ack", "retry", "dead_letter", "delete"}[o.kind]
			r.s.log.Warn("outbox: lease lost before the outcome was written; the newer delivery decides",
				append(rowAttrs(d), slog.String("write", ev.Reason))...)
			r.emit(ev)
			continue
		}
		switch o.kind {
		case kindAck:
			ev.Name = EventAcked
		case kindRetry:
			ev.Name, ev.Delay = EventRetried, o.delay
			r.s.log.Info("outbox: handler failed; retrying",
				append(rowAttrs(d), slog.Duration("delay", o.delay), slog.Any("error", o.err))...)
		case kindDeadLetter:
			ev.Name = EventDeadLettered
			r.s.log.Warn("outbox: delivery ended; row dead-lettered",
				append(rowAttrs(d), slog.String("reason", o.reason), slog.Any("error", o.err))...)
		case kindDrop:
			ev.Name = EventTerminal
			r.s.log.Error("outbox: delivery ended; row deleted (dead-lettering is off)",
				append(rowAttrs(d), slog.String("reason", o.reason), slog.Any("error", o.err))...)
		}
		r.emit(ev)
	}
}

func leaseArgs(os []outcome) ([]int64, []pgtype.UUID) {
	ids := make([]int64, len(os))
	tokens := make([]pgtype.UUID, len(os))
	for i, o := range os {
		ids[i], tokens[i] = o.d.row.ID, o.d.token
	}
	return ids, tokens
}

// errorText is the last_error recorded with a dead-lettered row.
func errorText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
