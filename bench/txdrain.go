package main

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

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
	plain := func(n int, write bool) (time.Duration, error) {
		if err := prepare(); err != nil {
			return 0, err
		}
		var done atomic.Int64
		sub, err := outbox.NewSubscriber(env.ob, []string{topic}, func(ctx context.Context, m *outbox.Message[order]) error {
			if write {
				if _, err := env.pool.Exec(ctx, insert, m.Payload.ID); err != nil {
					return err
				}
			}
			done.Add(1)
			return nil
		}, cfg())
		if err != nil {
			return 0, err
		}
		return drainWith(ctx, env, n, sub, &done)
	}
	tx := func(n int, write bool) (time.Duration, error) {
		if err := prepare(); err != nil {
			return 0, err
		}
		var done atomic.Int64
		sub, err := outbox.NewTxSubscriber(env.ob, []string{topic}, func(ctx context.Context, tx pgx.Tx, m *outbox.Message[order]) error {
			if write {
				if _, err := tx.Exec(ctx, insert, m.Payload.ID); err != nil {
					return err
				}
			}
			done.Add(1)
			return nil
		}, cfg())
		if err != nil {
			return 0, err
		}
		return drainWith(ctx, env, n, sub, &done)
	}
	return []contender{
		{"outbox Subscriber, 12 workers, claims by lease", func(n int) (time.Duration, error) { return plain(n, false) }},
		{"outbox TxSubscriber, 12 workers", func(n int) (time.Duration, error) { return tx(n, false) }},
		{"outbox Subscriber, 12 workers, claims by lease, handler inserts a row", func(n int) (time.Duration, error) { return plain(n, true) }},
		{"outbox TxSubscriber, 12 workers, handler inserts a row in its transaction", func(n int) (time.Duration, error) { return tx(n, true) }},
	}
}
