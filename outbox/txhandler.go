package outbox

import (
	"fmt"
	"log/slog"

	"github.com/outboxgen/outboxgen/internal/engine"
)

// ErrTxEnded fails a transactional delivery whose [TxHandler] ended the
// subscriber's transaction with SQL (ROLLBACK, COMMIT, END, ABORT): the
// message is not acknowledged, since the acknowledgement could no longer
// commit with the handler's writes, and the delivery is retried as a
// handler's error is. A ROLLBACK undid the handler's earlier writes; a
// COMMIT made them durable without the acknowledgement, so the retry
// applies them again. Either is a bug in the handler, which the
// subscriber logs as an error.
var ErrTxEnded = engine.ErrTxEnded

// ErrTxAborted fails a transactional delivery whose [TxHandler] returned
// nil from a transaction a failed statement had aborted: nothing of it can
// commit, so the message is not acknowledged and the delivery is retried
// as a handler's error is. A handler that means to carry on after a
// statement that may fail runs it in a nested transaction (tx.Begin).
var ErrTxAborted = engine.ErrTxAborted

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
// running on one pool share the three, whatever [Outbox] they were made
// on: [Subscriber.Run] refuses one whose workers, with theirs, would leave
// fewer. Acknowledgements are not
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
		s.eng.Log.Info("outbox: the pool leaves this transactional subscriber fewer workers than WorkersDefault: each running handler holds a connection "+
			"for its transaction and 3 stay free for claims, heartbeats and outcomes; for more, "+poolFix(WorkersDefault+txPoolReserve),
			slog.Int("workers", s.cfg.Workers), slog.Int("pool_max_conns", maxConns), slog.Int("want_max_conns", WorkersDefault+txPoolReserve))
	}
	s.txHandler = handler
	s.eng.Tx = true
	return s, nil
}
