package main

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgen/outboxgen/outbox"
)

// txWorkers is the workers of the transactional drain's contenders: each
// running transactional handler holds one of the bench pool's 16
// connections, and claims, heartbeats and outcomes need three more.
const txWorkers = 12

// txContenders measure what a transactional handler costs per message:
// a TxSubscriber against a Subscriber claiming by lease (as every
// TxSubscriber does) at the same workers, with a no-op handler, and with
// a handler that inserts one row (in its own statement for the
// Subscriber, in the delivery's transaction for the TxSubscriber).
func txContenders(ctx context.Context, env *benchEnv) []contender {
	effects := pgx.Identifier{schemaOurs, "effects"}.Sanitize()
	insert := "INSERT INTO " + effects + " (order_id) VALUES ($1)"
	prepare := func() error {
		_, err := env.pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+effects+" (order_id text NOT NULL); TRUNCATE "+effects)
		return err
	}
	cfg := func() *outbox.SubscriberConfig[order] {
		c := leasing(defaultConfig[order]())
		c.Workers = txWorkers
		return c
	}
	// drain times a Subscriber (tx false) or a TxSubscriber whose handler
	// counts each message and, with write, inserts its row: on the pool
	// for the Subscriber, in the delivery's transaction for the other.
	drain := func(n int, tx, write bool) (time.Duration, error) {
		if err := prepare(); err != nil {
			return 0, err
		}
		var done atomic.Int64
		handle := func(ctx context.Context, db interface {
			Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
		}, m *outbox.Message[order]) error {
			if write {
				if _, err := db.Exec(ctx, insert, m.Payload.ID); err != nil {
					return err
				}
			}
			done.Add(1)
			return nil
		}
		var (
			sub runner
			err error
		)
		if tx {
			sub, err = outbox.NewTxSubscriber(env.ob, []string{topic}, func(ctx context.Context, tx pgx.Tx, m *outbox.Message[order]) error {
				return handle(ctx, tx, m)
			}, cfg())
		} else {
			sub, err = outbox.NewSubscriber(env.ob, []string{topic}, func(ctx context.Context, m *outbox.Message[order]) error {
				return handle(ctx, env.pool, m)
			}, cfg())
		}
		if err != nil {
			return 0, err
		}
		return drainWith(ctx, env, n, sub, &done)
	}
	return []contender{
		{"outbox Subscriber, 12 workers, claims by lease", func(n int) (time.Duration, error) { return drain(n, false, false) }},
		{"outbox TxSubscriber, 12 workers", func(n int) (time.Duration, error) { return drain(n, true, false) }},
		{"outbox Subscriber, 12 workers, claims by lease, handler inserts a row", func(n int) (time.Duration, error) { return drain(n, false, true) }},
		{"outbox TxSubscriber, 12 workers, handler inserts a row in its transaction", func(n int) (time.Duration, error) { return drain(n, true, true) }},
	}
}
