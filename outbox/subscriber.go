package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/engine"
)

// Handler handles one delivery of a message. Returning nil acknowledges it
// (the row is deleted). An error is retried according to the subscriber's
// RetryStrategy; wrap it with [RetryAfter] to choose the delay, or with
// [Reject] to end the delivery now. A panic is recovered and treated as an
// error.
//
// ctx is cancelled with cause [ErrLeaseLost] when the row's lease is lost,
// and with cause [ErrSubscriberStopped] when the subscriber stops and its
// graceful timeout passes. Delivery is at least once: a handler must
// tolerate seeing a message again.
type Handler[T any] func(ctx context.Context, m *Message[T]) error

// Subscriber delivers the rows of one or more queues to a typed handler,
// at least once. Any number of subscribers, in one process or many, can
// serve the same queues: rows are claimed with FOR UPDATE SKIP LOCKED and
// leased, and every outcome is written only if the lease is still held.
type Subscriber[T any] struct {
	// core is what the engine runs: everything but the message type.
	core
	handler     Handler[T]
	txHandler   TxHandler[T] // set by NewTxSubscriber, instead of handler
	cfg         SubscriberConfig[T]
	contentType string
}

// typedCall is a decoded message and the subscriber whose handler takes
// it.
type typedCall[T any] struct {
	msg Message[T]
	s   *Subscriber[T]
}

// Headers returns the message's headers.
func (c *typedCall[T]) Headers() map[string]string { return c.msg.Headers }

// Handle runs the subscriber's Handler.
func (c *typedCall[T]) Handle(ctx context.Context) error { return c.s.handler(ctx, &c.msg) }

// HandleTx runs the subscriber's TxHandler in tx, which it must not end.
func (c *typedCall[T]) HandleTx(ctx context.Context, tx pgx.Tx) error {
	return c.s.txHandler(ctx, ownedTx{tx}, &c.msg)
}

// decoder returns the decoding function of one worker: it keeps the
// worker's header cache.
func (s *Subscriber[T]) decoder() func(row *db.ClaimRow) (engine.Call, error) {
	var hc headerCache
	return func(row *db.ClaimRow) (engine.Call, error) {
		c := &typedCall[T]{s: s}
		if err := decodeMessage(&c.msg, s.cfg.Codec, s.contentType, row, &hc); err != nil {
			return nil, err
		}
		return c, nil
	}
}

// NewSubscriber returns a subscriber of queues that runs handler for each
// message. It validates its arguments and cfg and returns a *[ConfigError]
// naming the first that breaks a rule; it does not touch the database.
// Call [Subscriber.Run] to start delivering.
func NewSubscriber[T any](ob *Outbox, queues []string, handler Handler[T], cfg *SubscriberConfig[T]) (*Subscriber[T], error) {
	s, err := newSubscriber(ob, queues, handler == nil, cfg)
	if err != nil {
		return nil, err
	}
	s.handler = handler
	return s, nil
}

// newSubscriber validates a subscriber's arguments in NewSubscriber's
// order (noHandler: the handler given is nil) and returns the subscriber
// without its handler.
func newSubscriber[T any](ob *Outbox, queues []string, noHandler bool, cfg *SubscriberConfig[T]) (*Subscriber[T], error) {
	if ob == nil {
		return nil, &ConfigError{Field: "ob", Value: "<nil>", Rule: "must not be nil"}
	}
	if len(queues) == 0 {
		return nil, &ConfigError{Field: "queues", Value: "[]", Rule: "must name at least one queue"}
	}
	seen := map[string]bool{}
	for i, q := range queues {
		if err := checkQueue(fmt.Sprintf("queues[%d]", i), q); err != nil {
			return nil, err
		}
		if seen[q] {
			return nil, &ConfigError{Field: fmt.Sprintf("queues[%d]", i), Value: q, Rule: "is listed twice"}
		}
		seen[q] = true
	}
	if noHandler {
		return nil, &ConfigError{Field: "handler", Value: "<nil>", Rule: "must not be nil"}
	}
	c, err := cfg.resolve(queues)
	if err != nil {
		return nil, err
	}
	set := c.settings()
	s := &Subscriber[T]{
		core:        core{ob: ob, eng: set.engine(ob, queues)},
		cfg:         c,
		contentType: c.Codec.ContentType(),
	}
	s.eng.Calls = s.decoder
	return s, nil
}

// Config returns the subscriber's configuration as it runs: every field
// left zero in the SubscriberConfig it was made with holds its default
// (Workers, LeaseTTL, HeartbeatInterval, Retry, Codec, Logger, ...), so
// code built around a subscriber can read its timing.
func (s *Subscriber[T]) Config() SubscriberConfig[T] { return s.cfg }

// Run delivers messages until ctx is done, then stops claiming, releases
// the rows it claimed but did not start, waits for running handlers,
// writes their outcomes, and returns.
//
// Everything after the stop is bounded by the graceful timeout: Run
// returns within GracefulTimeout plus [StopSlack] after ctx ends, whatever
// the database does. Handlers still running when it passes are abandoned
// (their context cancelled with cause ErrSubscriberStopped), and outcomes
// not written by then are given up: those rows keep their leases and are
// delivered again when the leases expire. Run then returns an error
// wrapping [ErrGracefulTimeout] that counts them; otherwise it returns nil
// after a stop. The stop logs at Info through the subscriber's Logger when
// it begins ("outbox: stopping; waiting for running handlers until the
// deadline", with the handlers running, the graceful timeout and the
// deadline) and when it ends ("outbox: stopped", ended "drained" or
// "forced", with the handlers abandoned and the outcomes not written).
//
// Run first counts what the subscribers running on the outbox's pool, of
// every Outbox made on it, need of the pool. It returns a *[ConfigError] when transactional subscribers' handlers
// would hold all but fewer than three of the pool's connections (see
// [NewTxSubscriber]), and logs a warning, once per subscriber, when the
// subscribers' claims, outcomes and heartbeats leave the pool fewer
// connections than the subscriber's workers (handlers that use the pool
// then wait for one).
//
// Run then checks the outbox's schema ([Outbox.Check]) and returns its
// *[SchemaError] when the schema is missing or not at the version this
// library needs. Database errors while running, including at that first
// check, are logged and retried with backoff; they do not end Run.
func (s *Subscriber[T]) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer s.running.Store(false)
	return s.core.run(ctx)
}

// StopSlack is how much longer than its GracefulTimeout [Subscriber.Run]
// may take to return after its context ends: the time to close its
// connections and hand the last metric events to the recorder.
const StopSlack = time.Second

// ErrGracefulTimeout is wrapped by the error [Subscriber.Run] returns when
// the graceful timeout passed before every running handler finished and
// every outcome was written. Rows it counts keep their leases and are
// delivered again when the leases expire.
var ErrGracefulTimeout = engine.ErrGracefulTimeout

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

// ownedTx is the transaction a TxHandler gets: the subscriber ends it.
type ownedTx struct{ pgx.Tx }

// Commit returns ErrTxOwned.
func (ownedTx) Commit(context.Context) error { return ErrTxOwned }

// Rollback returns ErrTxOwned.
func (ownedTx) Rollback(context.Context) error { return ErrTxOwned }
