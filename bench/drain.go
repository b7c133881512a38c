package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/outboxgen/outboxgen/outbox"
)

// drainBatch is the rows per backlog insert call.
const drainBatch = 1000

// runDrain measures how fast each contender empties a backlog with a no-op
// handler. The backlog is written before the clock starts; the clock stops
// when the handler has seen every row.
func runDrain(ctx context.Context, env *benchEnv, o options) error {
	n := max(int(100000*o.scale)/drainBatch, 1) * drainBatch
	cs := []contender{
		{"outbox Subscriber", func(n int) (time.Duration, error) { return drainOutbox(ctx, env, n) }},
		{"outbox Subscriber, raw", func(n int) (time.Duration, error) { return drainOutboxRaw(ctx, env, n) }},
		{"river", func(n int) (time.Duration, error) { return drainRiver(ctx, env, n) }},
		{"watermill-sql pgx", func(n int) (time.Duration, error) {
			return drainWatermill(ctx, env, n, wsql.BeginnerFromPgx(env.pool))
		}},
		{"watermill-sql database/sql", func(n int) (time.Duration, error) {
			return drainWatermill(ctx, env, n, wsql.BeginnerFromStdSQL(env.stdDB))
		}},
	}
	s, err := measure(o.rounds, n, func() error { return env.reset(ctx) }, cs)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "%d-row backlog, no-op handler\n", n)
	report(o.out, s, []string{"outbox Subscriber", "outbox Subscriber, raw", "river", "watermill-sql pgx", "watermill-sql database/sql"}, n, "msg", "outbox Subscriber")
	return nil
}

// waitFor polls done until it reports n or a minute passes.
func waitFor(ctx context.Context, done *atomic.Int64, n int) error {
	deadline := time.Now().Add(time.Minute)
	for done.Load() < int64(n) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("handled %d of %d", done.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// outboxBacklog publishes n orders to topic.
func outboxBacklog(ctx context.Context, env *benchEnv, n int) error {
	pub, err := outbox.NewPublisher[order](env.ob, topic, nil)
	if err != nil {
		return err
	}
	msgs := make([]order, drainBatch)
	for first := 0; first < n; first += drainBatch {
		for i := range msgs {
			msgs[i] = sampleOrder(first + i)
		}
		if _, err := pub.PublishBatch(ctx, env.pool, msgs, nil); err != nil {
			return err
		}
	}
	return nil
}

// drainConfig is the subscriber the drain and latency suites run.
func drainConfig[T any]() *outbox.SubscriberConfig[T] {
	return &outbox.SubscriberConfig[T]{
		Workers: 16, FetchBatchSize: 250, AckBatchSize: 250,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// drainOutbox drains into a Subscriber[order]: each payload is decoded
// into the typed message, as River decodes its job args.
func drainOutbox(ctx context.Context, env *benchEnv, n int) (time.Duration, error) {
	var done atomic.Int64
	sub, err := outbox.NewSubscriber(env.ob, []string{topic}, func(context.Context, *outbox.Message[order]) error {
		done.Add(1)
		return nil
	}, drainConfig[order]())
	if err != nil {
		return 0, err
	}
	return drainWith(ctx, env, n, sub, &done)
}

// drainOutboxRaw drains into a Subscriber[[]byte]: payloads are handed
// over undecoded, as watermill hands over its messages.
func drainOutboxRaw(ctx context.Context, env *benchEnv, n int) (time.Duration, error) {
	var done atomic.Int64
	sub, err := outbox.NewSubscriber(env.ob, []string{topic}, func(context.Context, *outbox.Message[[]byte]) error {
		done.Add(1)
		return nil
	}, drainConfig[[]byte]())
	if err != nil {
		return 0, err
	}
	return drainWith(ctx, env, n, sub, &done)
}

// runner is a Subscriber of any message type.
type runner interface{ Run(context.Context) error }

// drainWith writes the backlog, then times sub until done reaches n.
func drainWith(ctx context.Context, env *benchEnv, n int, sub runner, done *atomic.Int64) (time.Duration, error) {
	if err := outboxBacklog(ctx, env, n); err != nil {
		return 0, err
	}
	return timeRun(ctx, sub, func() error { return waitFor(ctx, done, n) })
}

// timeRun starts sub and times it until finished returns, then stops it.
// An error of Run comes first, then finished's.
func timeRun(ctx context.Context, sub runner, finished func() error) (time.Duration, error) {
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- sub.Run(rctx) }()
	werr := finished()
	took := time.Since(start)
	stop()
	if err := <-errc; err != nil {
		return 0, err
	}
	return took, werr
}

func drainRiver(ctx context.Context, env *benchEnv, n int) (time.Duration, error) {
	params := make([]river.InsertManyParams, drainBatch)
	for first := 0; first < n; first += drainBatch {
		for i := range params {
			params[i] = river.InsertManyParams{Args: sampleOrder(first + i)}
		}
		if _, err := env.river.InsertManyFast(ctx, params); err != nil {
			return 0, err
		}
	}
	var done atomic.Int64
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[order]) error {
		done.Add(1)
		return nil
	}))
	// River's own benchmark settings.
	client, err := river.NewClient(riverpgxv5.New(env.pool), &river.Config{
		Schema: schemaRiver, Workers: workers, Logger: discardLogger(),
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 2000}},
		FetchCooldown: 2 * time.Millisecond, FetchPollInterval: 20 * time.Millisecond,
	})
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return 0, err
	}
	werr := waitFor(ctx, &done, n)
	took := time.Since(start)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := client.Stop(sctx); err != nil {
		return 0, err
	}
	return took, werr
}

// drainWatermill drains with watermill-sql's queue schema and DeleteOnAck,
// through db: its pgx adapter or database/sql (what its documentation
// shows).
func drainWatermill(ctx context.Context, env *benchEnv, n int, db wsql.Beginner) (time.Duration, error) {
	msgs := make([]*message.Message, drainBatch)
	for first := 0; first < n; first += drainBatch {
		for i := range msgs {
			payload, err := jsonOrder(first + i)
			if err != nil {
				return 0, err
			}
			msgs[i] = message.NewMessage(watermill.NewUUID(), payload)
		}
		if err := env.watermill.Publish(topic, msgs...); err != nil {
			return 0, err
		}
	}
	sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
		SchemaAdapter: watermillSchema(),
		OffsetsAdapter: wsql.PostgreSQLQueueOffsetsAdapter{
			DeleteOnAck:               true,
			GenerateMessagesTableName: watermillSchema().GenerateMessagesTableName,
		},
		PollInterval: 20 * time.Millisecond,
	}, watermill.NopLogger{})
	if err != nil {
		return 0, err
	}
	defer sub.Close()
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	var done atomic.Int64
	start := time.Now()
	ch, err := sub.Subscribe(rctx, topic)
	if err != nil {
		return 0, err
	}
	go func() {
		for m := range ch {
			done.Add(1)
			m.Ack()
		}
	}()
	werr := waitFor(ctx, &done, n)
	return time.Since(start), werr
}
