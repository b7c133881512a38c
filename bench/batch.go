package main

import (
	"context"
	"encoding/json"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/outboxgen/outboxgen/outbox"
)

// batchSize is the rows per call for every contender, watermill-sql's
// batch size in its own benchmarks.
const batchSize = 500

// runBatch compares bulk publishing: PublishBatch (one INSERT ... SELECT
// unnest per call, returning ids), a raw COPY into the outbox table (no
// ids; the alternative PublishBatch could use), River's InsertManyFast
// (COPY) and watermill-sql's batch Publish (one multi-row INSERT).
func runBatch(ctx context.Context, env *benchEnv, o options) error {
	pub, err := outbox.NewPublisher[order](env.ob, topic, nil)
	if err != nil {
		return err
	}
	batches := func(fn func(first int) error) func(int) (time.Duration, error) {
		return func(n int) (time.Duration, error) {
			start := time.Now()
			for first := 0; first < n; first += batchSize {
				if err := fn(first); err != nil {
					return 0, err
				}
			}
			return time.Since(start), nil
		}
	}
	orders := func(first int) []order {
		out := make([]order, batchSize)
		for i := range out {
			out[i] = sampleOrder(first + i)
		}
		return out
	}
	table := pgx.Identifier{schemaOurs, "outbox"}
	cs := []contender{
		{"outbox PublishBatch", batches(func(first int) error {
			_, err := pub.PublishBatch(ctx, env.pool, orders(first), nil)
			return err
		})},
		{"outbox raw COPY", batches(func(first int) error {
			rows := make([][]any, batchSize)
			for i, m := range orders(first) {
				payload, err := json.Marshal(m)
				if err != nil {
					return err
				}
				headers := []byte(`{"content-type": "application/json", "correlation-id": "` + watermill.NewUUID() + `", "message-type": "order"}`)
				rows[i] = []any{topic, payload, headers}
			}
			_, err := env.pool.CopyFrom(ctx, table, []string{"queue", "payload", "headers"}, pgx.CopyFromRows(rows))
			return err
		})},
		{"river InsertManyFast", batches(func(first int) error {
			params := make([]river.InsertManyParams, batchSize)
			for i, m := range orders(first) {
				params[i] = river.InsertManyParams{Args: m}
			}
			_, err := env.river.InsertManyFast(ctx, params)
			return err
		})},
		{"watermill-sql Publish", batches(func(first int) error {
			msgs := make([]*message.Message, batchSize)
			for i, m := range orders(first) {
				payload, err := json.Marshal(m)
				if err != nil {
					return err
				}
				msgs[i] = message.NewMessage(watermill.NewUUID(), payload)
			}
			return env.watermill.Publish(topic, msgs...)
		})},
	}
	n := max(int(50000*o.scale)/batchSize, 1) * batchSize
	s, err := measure(o.rounds, n, func() error { return env.reset(ctx) }, cs)
	if err != nil {
		return err
	}
	report(o.out, s, []string{"outbox PublishBatch", "outbox raw COPY", "river InsertManyFast", "watermill-sql Publish"}, n, "row", "outbox PublishBatch")
	return nil
}
