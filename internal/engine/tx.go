package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
	"github.com/outboxgen/outboxgen/internal/lease"
)

// ErrTxEnded fails a transactional delivery whose outbox.TxHandler ended the
// subscriber's transaction with SQL (ROLLBACK, COMMIT, END, ABORT): the
// message is not acknowledged, since the acknowledgement could no longer
// commit with the handler's writes, and the delivery is retried as a
// handler's error is. A ROLLBACK undid the handler's earlier writes; a
// COMMIT made them durable without the acknowledgement, so the retry
// applies them again. Either is a bug in the handler, which the
// subscriber logs as an error.
var ErrTxEnded = errors.New("outbox: the TxHandler ended its transaction with SQL; the message was not acknowledged")

// ErrTxAborted fails a transactional delivery whose outbox.TxHandler returned
// nil from a transaction a failed statement had aborted: nothing of it can
// commit, so the message is not acknowledged and the delivery is retried
// as a handler's error is. A handler that means to carry on after a
// statement that may fail runs it in a nested transaction (tx.Begin).
var ErrTxAborted = errors.New("outbox: the TxHandler returned nil from a transaction aborted by a failed statement; the message was not acknowledged")

// errTxLeaseLost ends a transactional delivery whose acknowledgement
// found the lease taken: the transaction rolled back.
var errTxLeaseLost = errors.New("outbox: lease lost before the acknowledgement; the transaction rolled back")

// txResult is how a transactional delivery ended.
type txResult int

const (
	txRolledBack txResult = iota // the handler or the transaction failed: decide an outcome
	txCommitted                  // the handler's writes and the acknowledgement committed
	txLeaseLost                  // the acknowledgement found the lease taken
)

// handleInTx runs the transactional handler for d and, when it returns
// nil, deletes d's row in its transaction and commits. herr is the error
// that decides the outcome of a rolled-back delivery.
func (r *run) handleInTx(ctx context.Context, d *lease.Delivery, msg Call) (res txResult, herr error) {
	tx, err := r.s.Pool.Begin(ctx)
	if err != nil {
		return txRolledBack, fmt.Errorf("outbox: beginning the handler's transaction: %w", err)
	}
	defer func() {
		if res != txCommitted {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.s.QueryTimeout)
			_ = tx.Rollback(rctx)
			cancel()
		}
	}()
	if r.liftIdle > 0 {
		err := r.s.Queries(dbx.Bounded{Inner: tx, Timeout: r.s.QueryTimeout}).LiftIdleInTransactionTimeout(ctx, r.liftIdle)
		if err != nil {
			return txRolledBack, fmt.Errorf("outbox: setting the handler's transaction's idle timeout: %w", err)
		}
	}
	herr = safeHandle(ctx, func(ctx context.Context) error { return msg.HandleTx(ctx, tx) })
	if misuse := txMisuse(tx, herr); misuse != nil {
		// Nothing more may run on this connection but the deferred
		// rollback: after a handler's COMMIT or ROLLBACK, a statement
		// would commit on its own. The handler's own error, if any,
		// still decides the outcome.
		attrs := append(rowAttrs(d), slog.Any("error", misuse))
		if herr != nil {
			attrs = append(attrs, slog.Any("handler_error", herr))
		} else {
			herr = misuse
		}
		r.s.Log.ErrorContext(d.Context(), "outbox: a transactional handler misused its transaction; the message was not acknowledged", attrs...)
		return txRolledBack, herr
	}
	if herr != nil {
		return txRolledBack, herr
	}
	// From here the row is ours to delete: the heartbeat lets it be, so
	// its statement never waits on the row lock the delete takes.
	r.leases.Settle(d)
	n, err := r.s.Queries(dbx.Bounded{Inner: tx, Timeout: r.s.QueryTimeout}).DeleteWithLease(ctx,
		db.DeleteWithLeaseParams{ID: d.Row.ID, Token: d.Token})
	switch {
	case err != nil:
		return txRolledBack, fmt.Errorf("outbox: acknowledging in the handler's transaction: %w", err)
	case n == 0:
		return txLeaseLost, errTxLeaseLost
	}
	cctx, cancel := context.WithTimeout(ctx, r.s.QueryTimeout)
	defer cancel()
	if err := tx.Commit(cctx); err != nil {
		return txRolledBack, fmt.Errorf("outbox: committing the handler's transaction: %w", err)
	}
	return txCommitted, nil
}

// txMisuse reports, from the transaction status of tx's connection at its
// last ready-for-query, a handler that ended tx (ErrTxEnded), or that
// returned nil although tx was aborted (ErrTxAborted): a handler that
// returns the error of its failed statement leaves tx aborted rightly.
// A connection that broke keeps its last status, and its failure is
// found by the statements that follow.
func txMisuse(tx pgx.Tx, herr error) error {
	switch tx.Conn().PgConn().TxStatus() {
	case 'T':
		return nil
	case 'E':
		if herr != nil {
			return nil
		}
		return ErrTxAborted
	default: // 'I': idle, the handler's COMMIT or ROLLBACK ended tx
		return ErrTxEnded
	}
}

// txEnded reports what became of a transactional delivery that committed
// or lost its lease: there is no outcome left to write, so its event is
// reported as a landed acknowledgement's, or a lost one's, would be.
func (r *run) txEnded(hctx context.Context, d *lease.Delivery, res txResult, ran time.Duration, observed bool, info DeliveryInfo) {
	r.leases.Remove(d)
	o := lease.Outcome{D: d, Kind: lease.Ack, Attempted: true, Ran: ran}
	var matched map[lease.Lease]bool // nil: the acknowledgement landed
	out := deliveryOutcome(o, nil)
	if res == txLeaseLost {
		matched = map[lease.Lease]bool{}
		out = DeliveryOutcome{Outcome: OutcomeAbandoned, Err: errTxLeaseLost, Ran: ran}
	} else if d.Row.OrderingKey != nil {
		r.wakeFetcher() // the delete handed the key to its next row
	}
	if observed {
		r.observeEnd(hctx, info, out)
	}
	r.report([]lease.Outcome{o}, matched)
}
