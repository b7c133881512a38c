package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/outboxgen/outboxgen/internal/dbx"
	"github.com/outboxgen/outboxgen/internal/engine"
)

// core is the untyped part of a subscriber: what the engine runs.
type core struct {
	ob  *Outbox
	eng engine.Subscriber
	// running is set while Run runs.
	running atomic.Bool
	// poolWarned is set once the subscriber warned that its pool is small.
	poolWarned atomic.Bool
}

// run is Run once the subscriber is marked running.
func (s *core) run(ctx context.Context) error {
	release, err := s.takePool()
	if err != nil {
		return err
	}
	defer release()
	if err := s.checkSchema(ctx); err != nil {
		return err
	}
	return engine.Run(ctx, &s.eng)
}

// checkSchema waits until the schema can be checked, and returns a
// *SchemaError when it is not usable. A stop while waiting returns nil.
// The schema it checks for has the log tier's ring beside the outbox
// table (schema 13), which the subscriber claims from too
// (engine.Subscriber.Ring).
func (s *core) checkSchema(ctx context.Context) error {
	errs := dbx.Backoff{Base: 100 * time.Millisecond, Max: min(30*time.Second, s.eng.MaxFetchInterval)}
	for {
		cctx, cancel := context.WithTimeout(ctx, s.eng.QueryTimeout)
		err := s.ob.Check(cctx)
		cancel()
		var se *SchemaError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &se):
			return err
		case ctx.Err() != nil:
			return nil
		}
		wait := errs.Next()
		s.eng.Log.ErrorContext(ctx, "outbox: cannot check the outbox schema; retrying", slog.Any("error", err), slog.Duration("backoff", wait))
		dbx.Sleep(ctx, wait)
	}
}

// txPoolReserve is the pool connections a transactional subscriber keeps
// beside its handlers' transactions: a claim, a heartbeat and an outcome
// write.
const txPoolReserve = 3

// What subscribers need of the outbox's pool.
//
// A transactional subscriber's running handler holds a pool connection
// for its whole transaction; txPoolReserve more are left to the short
// statements of every subscriber on the pool, of any Outbox (claims, heartbeats,
// outcomes), or a heartbeat could wait for a handler to end and its
// leases run out. A configuration that breaks this is refused with a
// *ConfigError. A plain subscriber holds no connection while its handlers
// run: its claims (two by row lock in flight, each for up to LockWindow),
// its batched outcome writes and its heartbeats take a few for a moment.
// When those leave fewer connections than its workers, handlers that use
// the pool (and publishers on it) wait for one: that works, slower, and
// is logged once as a warning. The LISTEN connection is not the pool's.

// poolNeed is what s needs of its pool while it runs: connections held
// by its handlers' transactions, and at its busiest.
func (s *core) poolNeed() (txWorkers, peak int) {
	if s.eng.Tx {
		return s.eng.Workers, s.eng.Workers + txPoolReserve
	}
	return 0, engine.PoolNeed(&s.eng)
}

// poolFix is the fix for a pool of too few connections.
func poolFix(want int) string {
	return fmt.Sprintf("set pool_max_conns=%d in the pool's URL, or pgxpool.Config.MaxConns", want)
}

// takePool counts s among the running subscribers of its pool, whatever
// Outbox they were made on, and returns the function that uncounts it. It
// refuses, with a *ConfigError, a transactional subscriber whose handlers,
// with those of the transactional subscribers already running on the
// pool, would leave fewer than txPoolReserve connections; and warns, once
// per subscriber, when the subscribers' statements leave fewer
// connections than its workers.
func (s *core) takePool() (release func(), err error) {
	ob := s.ob
	maxConns := int(ob.pool.Config().MaxConns)
	tx, peak := s.poolNeed()
	c := &poolClaim{who: claimName(s.eng.Queues, ob.naming.Qualified(ob.naming.Table)), txWorkers: tx, peak: peak}
	u, holders, ok := pools.take(ob.pool, c, maxConns-txPoolReserve)
	if !ok {
		rule := fmt.Sprintf("needs %d pool connections, one per running handler's transaction plus %d for claims, heartbeats and outcomes, "+
			"and the pool has MaxConns %d", tx+txPoolReserve, txPoolReserve, maxConns)
		if u.txWorkers > tx {
			rule = fmt.Sprintf("with the transactional subscribers already running on this pool (%d workers: %s) needs %d pool connections, "+
				"one per running handler's transaction plus %d for claims, heartbeats and outcomes, and the pool has MaxConns %d",
				u.txWorkers-tx, holders, u.txWorkers+txPoolReserve, txPoolReserve, maxConns)
		}
		return nil, &ConfigError{Field: "SubscriberConfig.Workers", Value: fmt.Sprint(s.eng.Workers),
			Rule: rule + ": " + poolFix(u.txWorkers+txPoolReserve) + ", or lower Workers"}
	}
	spare := maxConns - u.peak
	want := u.peak
	if !s.eng.Tx {
		want += s.eng.Workers
	}
	if want > maxConns && s.poolWarned.CompareAndSwap(false, true) {
		s.eng.Log.Warn("outbox: the pool is small for the subscribers running on it: their claims, outcomes, heartbeats and transactional handlers "+
			"take up to engine_conns of its pool_max_conns connections at their busiest, so handlers and publishers that use the pool "+
			"wait for a connection; "+poolFix(want),
			slog.Int("pool_max_conns", maxConns), slog.Int("engine_conns", u.peak), slog.Int("spare_conns", max(spare, 0)),
			slog.Int("workers", s.eng.Workers), slog.Int("running_subscribers", u.subscribers), slog.Int("want_max_conns", want))
	}
	return func() { pools.remove(ob.pool, c) }, nil
}
