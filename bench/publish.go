package main

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/outbox"
)

// runPublish compares one transactional Publish with a hand-written INSERT
// of the same row (same table, same encoded payload and headers) in the
// same kind of transaction: begin, insert, commit. The difference is what
// the library costs on top of the database work. The same pair runs
// against the ring (a Publisher with TierRing, and the bare INSERT into
// the ring).
func runPublish(ctx context.Context, env *benchEnv, o options) error {
	pub, err := outbox.NewPublisher[order](env.ob, topic, nil)
	if err != nil {
		return err
	}
	ringPub, err := outbox.NewPublisher(env.ring, topic, &outbox.PublisherConfig[order]{Tier: outbox.TierRing})
	if err != nil {
		return err
	}
	inTx := func(fn func(tx pgx.Tx, i int) error) func(int) (time.Duration, error) {
		return func(n int) (time.Duration, error) {
			start := time.Now()
			for i := range n {
				tx, err := env.pool.Begin(ctx)
				if err != nil {
					return 0, err
				}
				if err := fn(tx, i); err != nil {
					_ = tx.Rollback(ctx)
					return 0, err
				}
				if err := tx.Commit(ctx); err != nil {
					return 0, err
				}
			}
			return time.Since(start), nil
		}
	}
	cs := []contender{
		{"bare INSERT", inTx(bareInsert(ctx, pgx.Identifier{schemaOurs, "outbox"}.Sanitize()))},
		{"outbox Publish", inTx(publishOrder(ctx, pub))},
		{"bare INSERT into the ring", inTx(bareInsert(ctx, ringTable.Sanitize()))},
		{"outbox Publish into the ring", inTx(publishOrder(ctx, ringPub))},
	}
	n := max(int(2000*o.scale), 10)
	s, err := measure(o.rounds, n, func() error { return env.reset(ctx) }, cs)
	if err != nil {
		return err
	}
	var names []string
	for _, c := range cs {
		names = append(names, c.name)
	}
	report(o.out, s, names, n, "op", "bare INSERT")
	return nil
}

// bareInsert returns the operation that inserts sample order i into
// table with the hand-written INSERT ... RETURNING id any writer would
// send, its payload encoded and its headers (benchHeaders) written as
// Publish writes them.
func bareInsert(ctx context.Context, table string) func(tx pgx.Tx, i int) error {
	insert := "INSERT INTO " + table + " (queue, payload, headers) VALUES ($1, $2, $3) RETURNING id"
	headers := []byte(benchHeaders)
	return func(tx pgx.Tx, i int) error {
		payload, err := json.Marshal(sampleOrder(i))
		if err != nil {
			return err
		}
		var id int64
		return tx.QueryRow(ctx, insert, topic, payload, headers).Scan(&id)
	}
}

// publishOrder returns the operation that publishes sample order i with
// pub.
func publishOrder(ctx context.Context, pub *outbox.Publisher[order]) func(tx pgx.Tx, i int) error {
	return func(tx pgx.Tx, i int) error {
		_, err := pub.Publish(ctx, tx, sampleOrder(i), nil)
		return err
	}
}
