package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/outbox"
)

// concurrentPublishers are how many transactions publish at once in the
// concurrent suite's runs.
var concurrentPublishers = []int{8, 32}

// runConcurrentPublish measures commit throughput with 8 and with 32
// transactions publishing at once, one row each: a NOTIFY serialises the commits of
// the transactions that issue it. The baseline inserts the same row into
// a copy of the outbox table (same columns, defaults, constraints and
// indexes) without any trigger; the same INSERT into the outbox table
// tells the triggers' cost from the library's. The outbox notifies only while a
// subscriber sleeps (schema 6), so it is measured both ways: with no
// subscriber asleep, and with one asleep on the queue, where every
// publish notifies as every publish did before schema 6.
//
// A second baseline is the one-row INSERT into a plain table with only
// the outbox's identity primary key and pending-rows index. It runs at 8
// and at 32 transactions; the contenders with a subscriber asleep, where
// every publish notifies, run at 32 only.
func runConcurrentPublish(ctx context.Context, env *benchEnv, o options) error {
	for _, publishers := range concurrentPublishers {
		if err := concurrentPublish(ctx, env, o, publishers); err != nil {
			return err
		}
	}
	return nil
}

// ringInsert names the concurrent suite's contender that writes into the
// log tier's ring (its defaults, its lane and key columns, its statement
// trigger) with the bare INSERT any writer uses.
const ringInsert = "bare INSERT into the ring, nobody asleep"

// ringPublish names the concurrent suite's contender that publishes into
// the ring with a Publisher (PublisherConfig.Tier TierRing).
const ringPublish = "outbox Publish into the ring, nobody asleep"

func concurrentPublish(ctx context.Context, env *benchEnv, o options, publishers int) error {
	cfg := env.pool.Config().Copy()
	cfg.MaxConns, cfg.MinConns = int32(publishers), int32(publishers)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return err
	}
	ob, err := outbox.New(pool, &outbox.Config{Schema: schemaOurs})
	if err != nil {
		return err
	}
	pub, err := outbox.NewPublisher[order](ob, topic, nil)
	if err != nil {
		return err
	}
	ringOb, err := outbox.New(pool, &outbox.Config{Schema: schemaRing})
	if err != nil {
		return err
	}
	ringPub, err := outbox.NewPublisher(ringOb, topic, &outbox.PublisherConfig[order]{Tier: outbox.TierRing})
	if err != nil {
		return err
	}
	table := func(name string) string { return pgx.Identifier{schemaOurs, name}.Sanitize() }
	plain := table("outbox_plain")
	if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+plain+"; CREATE TABLE "+plain+" (LIKE "+table("outbox")+" INCLUDING ALL)"); err != nil {
		return err
	}
	minimal := table("outbox_minimal")
	if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+minimal+"; CREATE TABLE "+minimal+` (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		queue text COLLATE "C" NOT NULL,
		payload bytea NOT NULL,
		headers jsonb,
		next_attempt_at timestamptz NOT NULL DEFAULT now(),
		acquired_token uuid,
		blocked boolean NOT NULL DEFAULT false);
		CREATE INDEX ON `+minimal+` (queue, next_attempt_at, id) WHERE acquired_token IS NULL AND NOT blocked`); err != nil {
		return err
	}
	sleepers := table("outbox_sleepers")
	asleep := func(on bool) error {
		_, err := pool.Exec(ctx, "DELETE FROM "+sleepers)
		if err == nil && on {
			_, err = pool.Exec(ctx, "INSERT INTO "+sleepers+" (id, queues, until) VALUES (gen_random_uuid(), ARRAY[$1], now() + interval '1 hour')", topic)
		}
		return err
	}

	// concurrently runs n transactions, concurrentPublishers at a time,
	// each running fn once, and checks that n rows landed in table. With
	// subscriber, a default Subscriber runs throughout, handling the rows
	// as they come, and the check is that it handled all n.
	concurrently := func(table string, sleeping, subscriber bool, fn func(tx pgx.Tx, i int) error) func(int) (time.Duration, error) {
		return func(n int) (time.Duration, error) {
			if err := asleep(sleeping); err != nil {
				return 0, err
			}
			defer func() { _ = asleep(false) }()
			var handled atomic.Int64
			if subscriber {
				sub, err := outbox.NewSubscriber(env.ob, []string{topic}, func(context.Context, *outbox.Message[order]) error {
					handled.Add(1)
					return nil
				}, &outbox.SubscriberConfig[order]{Logger: discardLogger()})
				if err != nil {
					return 0, err
				}
				sctx, stop := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { done <- sub.Run(sctx) }()
				defer func() { stop(); <-done }()
				time.Sleep(200 * time.Millisecond) // let it fall asleep
			}
			var (
				next atomic.Int64
				wg   sync.WaitGroup
				errs = make(chan error, publishers)
			)
			clock := startClock()
			for range publishers {
				wg.Go(func() {
					for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
						err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return fn(tx, i) })
						if err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			elapsed := clock.stop()
			close(errs)
			if err := <-errs; err != nil {
				return 0, err
			}
			if subscriber {
				if err := waitFor(ctx, &handled, n); err != nil {
					return 0, err
				}
				return elapsed, nil
			}
			var rows int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&rows); err != nil {
				return 0, err
			}
			if rows != n {
				return 0, fmt.Errorf("%d rows in %s, want %d", rows, table, n)
			}
			return elapsed, nil
		}
	}
	publish := publishOrder(ctx, pub)
	cs := []contender{
		{"bare INSERT, no trigger", concurrently(plain, false, false, bareInsert(ctx, plain))},
		{"bare INSERT, plain table (primary key and pending index)", concurrently(minimal, false, false, bareInsert(ctx, minimal))},
		{"bare INSERT into the outbox, nobody asleep", concurrently(table("outbox"), false, false, bareInsert(ctx, table("outbox")))},
		{"outbox Publish, nobody asleep", concurrently(table("outbox"), false, false, publish)},
		{ringInsert, concurrently(ringTable.Sanitize(), false, false, bareInsert(ctx, ringTable.Sanitize()))},
		{ringPublish, concurrently(ringTable.Sanitize(), false, false, publishOrder(ctx, ringPub))},
		{"outbox Publish, a subscriber handling", concurrently(table("outbox"), false, true, publish)},
	}
	if publishers == 32 {
		cs = append(cs,
			contender{"outbox Publish, a subscriber asleep", concurrently(table("outbox"), true, false, publish)},
			contender{"outbox Publish, a subscriber handling, every publish notifying", concurrently(table("outbox"), true, true, publish)})
	}
	n := max(int(20000*o.scale), publishers)
	reset := func() error {
		if err := env.reset(ctx); err != nil {
			return err
		}
		_, err := pool.Exec(ctx, "TRUNCATE "+plain+", "+minimal)
		return err
	}
	s, err := measure(o.rounds, n, reset, cs)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "%d transactions of one row, %d at a time\n", n, publishers)
	var names []string
	for _, c := range cs {
		names = append(names, c.name)
	}
	report(o.out, s, names, n, "op", "bare INSERT, no trigger")
	base := "bare INSERT, plain table (primary key and pending index)"
	for _, name := range []string{"outbox Publish, nobody asleep", "outbox Publish, a subscriber handling", ringInsert, ringPublish} {
		fmt.Fprintf(o.out, "%s / %s = %.2fx\n", name, base, rate(median(s[name]), n)/rate(median(s[base]), n))
	}
	return nil
}
