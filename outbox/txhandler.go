package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
)

// TxHandler handles one delivery inside a transaction the subscriber
// began on the outbox's pool. Returning nil acknowledges the message in
// that same transaction: the row is deleted (filtered by its lease, as
// every outcome is) and the transaction commits, so the handler's writes,
// any messages it published through tx, and the acknowledgement commit
// together or not at all. An error, or a panic, rolls the transaction
// back, and the retry or dead letter is recorded afterwards as for a
// [Handler].
//
// The handler must not commit or roll back tx, by its methods or with SQL:
// its Commit and Rollback return [ErrTxOwned], and a handler that ends
// the transaction itself (tx.Exec(ctx, "ROLLBACK") or "COMMIT", directly
// or in code it calls) is never acknowledged: its delivery fails, with
// [ErrTxEnded] when it returned nil, else with its own error. Nested transactions (tx.Begin, savepoints) are fine, and are
// how a handler carries on after a statement that failed: returning nil
// from a transaction left failed fails the delivery with [ErrTxAborted].
// ctx is cancelled as a Handler's is, with cause ErrLeaseLost when the
// lease is lost; tx's statements then fail and nothing commits.
type TxHandler[T any] func(ctx context.Context, tx pgx.Tx, m *Message[T]) error

// ErrTxOwned is returned by Commit and Rollback of the transaction a
// [TxHandler] is given: the subscriber ends it.
var ErrTxOwned = errors.New("outbox: the subscriber commits or rolls back a TxHandler's transaction")

// ErrTxEnded fails a transactional delivery whose [TxHandler] ended the
// subscriber's transaction with SQL (ROLLBACK, COMMIT, END, ABORT): the
// message is not acknowledged, since the acknowledgement could no longer
// commit with the handler's writes, and the delivery is retried as a
// handler's error is. A ROLLBACK undid the handler's earlier writes; a
// COMMIT made them durable without the acknowledgement, so the retry
// applies them again. Either is a bug in the handler, which the
// subscriber logs as an error.
var ErrTxEnded = errors.New("outbox: the TxHandler ended its transaction with SQL; the message was not acknowledged")

// ErrTxAborted fails a transactional delivery whose [TxHandler] returned
// nil from a transaction a failed statement had aborted: nothing of it can
// commit, so the message is not acknowledged and the delivery is retried
// as a handler's error is. A handler that means to carry on after a
// statement that may fail runs it in a nested transaction (tx.Begin).
var ErrTxAborted = errors.New("outbox: the TxHandler returned nil from a transaction aborted by a failed statement; the message was not acknowledged")

// errTxLeaseLost ends a transactional delivery whose acknowledgement
// found the lease taken: the transaction rolled back.
var errTxLeaseLost = errors.New("outbox: lease lost before the acknowledgement; the transaction rolled back")

// NewTxSubscriber returns a subscriber of queues that runs handler for
// each message in a transaction of its own and acknowledges the message in
// it (see [TxHandler]): the handler's effects happen exactly once in the
// database, even though delivery stays at least once. A redelivered
// message (after a crash, or a lease that ran out) finds its earlier
// attempt rolled back, or the row gone.
//
// Its rules and cfg are [NewSubscriber]'s, with these differences: every
// claim writes leases (the transaction deletes the row itself, which a
// claim by row lock would hold), so cfg.LockWindow must be 0 or negative;
// each running handler holds a pool connection for its transaction, so
// the pool needs Workers connections plus three for claims, heartbeats
// and outcomes: Workers defaults to the pool's MaxConns minus three (at
// most WorkersDefault; a default below it is logged), and a larger
// Workers, or a pool of fewer than four connections, is refused with a
// *[ConfigError] naming the MaxConns it needs (pool_max_conns in the
// pool's URL, or pgxpool.Config.MaxConns). Transactional subscribers
// running on one pool share the three: [Subscriber.Run] refuses one whose
// workers, with theirs, would leave fewer. Acknowledgements are not
// batched, one commit each; retries and dead letters still are.
//
// The transaction uses the pool's default isolation level; a handler that
// needs another sets it with its first statement (SET TRANSACTION
// ISOLATION LEVEL ...). A commit that fails (a serialization failure, a
// lost connection) is retried like a handler's error; one whose answer
// was lost after the server committed left the row deleted, so that
// retry finds the lease gone and writes nothing.
//
// The handler must not end the transaction. One that does it with SQL
// (tx.Exec(ctx, "ROLLBACK") or "COMMIT", itself or in code it calls) is
// logged as an error and its delivery fails, with [ErrTxEnded] when it
// returned nil: the subscriber checks that the transaction is still open
// before it acknowledges, and writes nothing more on its connection, so
// the row stays and is retried per cfg.Retry. After a ROLLBACK the
// handler's earlier writes never happened; after a COMMIT they are
// durable but the acknowledgement is not, so the next delivery applies
// them again. The check sees only the transaction's state when the
// handler returns: a handler that ends it and begins another defeats it.
func NewTxSubscriber[T any](ob *Outbox, queues []string, handler TxHandler[T], cfg *SubscriberConfig[T]) (*Subscriber[T], error) {
	if cfg != nil && cfg.LockWindow > 0 {
		return nil, &ConfigError{Field: "LockWindow", Value: cfg.LockWindow.String(),
			Rule: "must be 0 or negative for NewTxSubscriber: a transactional handler's claims write leases"}
	}
	var c SubscriberConfig[T]
	if cfg != nil {
		c = *cfg
	}
	c.LockWindow = -1
	defaulted := c.Workers == 0
	spare := 0 // pool connections beside the reserve
	if ob != nil {
		spare = int(ob.pool.Config().MaxConns) - txPoolReserve
		if defaulted && spare >= 1 {
			c.Workers = min(WorkersDefault, spare)
		}
	}
	s, err := newSubscriber(ob, queues, handler == nil, &c)
	if err != nil {
		return nil, err
	}
	maxConns := int(ob.pool.Config().MaxConns)
	switch {
	case spare < 1:
		return nil, &ConfigError{Field: "pool", Value: fmt.Sprintf("MaxConns %d", maxConns),
			Rule: fmt.Sprintf("a transactional subscriber needs at least %d pool connections, one per running handler's transaction plus %d for claims, heartbeats and outcomes: %s",
				1+txPoolReserve, txPoolReserve, poolFix(1+txPoolReserve))}
	case s.cfg.Workers > spare:
		return nil, &ConfigError{Field: "SubscriberConfig.Workers", Value: fmt.Sprint(s.cfg.Workers),
			Rule: fmt.Sprintf("needs %d pool connections, one per running handler's transaction plus %d for claims, heartbeats and outcomes, and the pool has MaxConns %d: %s, or lower Workers to %d",
				s.cfg.Workers+txPoolReserve, txPoolReserve, maxConns, poolFix(s.cfg.Workers+txPoolReserve), spare)}
	case defaulted && s.cfg.Workers < WorkersDefault:
		s.log.Info("outbox: the pool leaves this transactional subscriber fewer workers than WorkersDefault: each running handler holds a connection "+
			"for its transaction and 3 stay free for claims, heartbeats and outcomes; for more, "+poolFix(WorkersDefault+txPoolReserve),
			slog.Int("workers", s.cfg.Workers), slog.Int("pool_max_conns", maxConns), slog.Int("want_max_conns", WorkersDefault+txPoolReserve))
	}
	s.txHandler = handler
	s.tx = true
	return s, nil
}

// txPoolReserve is the pool connections a transactional subscriber keeps
// beside its handlers' transactions: a claim, a heartbeat and an outcome
// write.
const txPoolReserve = 3

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
func (r *run) handleInTx(ctx context.Context, d *delivery, msg call) (res txResult, herr error) {
	tx, err := r.s.ob.pool.Begin(ctx)
	if err != nil {
		return txRolledBack, fmt.Errorf("outbox: beginning the handler's transaction: %w", err)
	}
	defer func() {
		if res != txCommitted {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.s.cfg.QueryTimeout)
			_ = tx.Rollback(rctx)
			cancel()
		}
	}()
	if r.liftIdle > 0 {
		err := r.s.ob.queries(dbx.Bounded{Inner: tx, Timeout: r.s.cfg.QueryTimeout}).LiftIdleInTransactionTimeout(ctx, r.liftIdle)
		if err != nil {
			return txRolledBack, fmt.Errorf("outbox: setting the handler's transaction's idle timeout: %w", err)
		}
	}
	herr = safeHandle(ctx, func(ctx context.Context) error { return msg.handleTx(ctx, tx) })
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
		r.s.log.ErrorContext(d.context(), "outbox: a transactional handler misused its transaction; the message was not acknowledged", attrs...)
		return txRolledBack, herr
	}
	if herr != nil {
		return txRolledBack, herr
	}
	// From here the row is ours to delete: the heartbeat lets it be, so
	// its statement never waits on the row lock the delete takes.
	r.leases.settle(d)
	n, err := r.s.ob.queries(dbx.Bounded{Inner: tx, Timeout: r.s.cfg.QueryTimeout}).DeleteWithLease(ctx,
		db.DeleteWithLeaseParams{ID: d.row.ID, Token: d.token})
	switch {
	case err != nil:
		return txRolledBack, fmt.Errorf("outbox: acknowledging in the handler's transaction: %w", err)
	case n == 0:
		return txLeaseLost, errTxLeaseLost
	}
	cctx, cancel := context.WithTimeout(ctx, r.s.cfg.QueryTimeout)
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
func (r *run) txEnded(hctx context.Context, d *delivery, res txResult, ran time.Duration, observed bool, info DeliveryInfo) {
	r.leases.remove(d)
	o := outcome{d: d, kind: kindAck, attempted: true, ran: ran}
	var matched map[lease]bool // nil: the acknowledgement landed
	out := deliveryOutcome(o, nil)
	if res == txLeaseLost {
		matched = map[lease]bool{}
		out = DeliveryOutcome{Outcome: OutcomeAbandoned, Err: errTxLeaseLost, Ran: ran}
	} else if d.row.OrderingKey != nil {
		r.wakeFetcher() // the delete handed the key to its next row
	}
	if observed {
		r.observeEnd(hctx, info, out)
	}
	r.report([]outcome{o}, matched)
}

// ownedTx is the transaction a TxHandler gets: the subscriber ends it.
type ownedTx struct{ pgx.Tx }

// Commit returns ErrTxOwned.
func (ownedTx) Commit(context.Context) error { return ErrTxOwned }

// Rollback returns ErrTxOwned.
func (ownedTx) Rollback(context.Context) error { return ErrTxOwned }
