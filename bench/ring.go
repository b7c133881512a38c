package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/naming"
	"github.com/outboxgen/outboxgen/internal/ring"
	"github.com/outboxgen/outboxgen/outbox"
)

// The log tier's ring (package ring) beside an outbox table: writers
// INSERT into the ring, and a subscriber of an outbox that has one claims
// from both. These suites measure it against the outbox table alone and
// against watermill-sql, side by side.

// ringTable is the bench ring outbox's ring, which writers INSERT into.
var ringTable = pgx.Identifier{schemaRing, "outbox_ring"}

// ringOutbox migrates an outbox in schemaRing and adds the ring beside
// its table.
func ringOutbox(ctx context.Context, pool *pgxpool.Pool) (*outbox.Outbox, error) {
	ob, err := outbox.New(pool, &outbox.Config{Schema: schemaRing})
	if err != nil {
		return nil, err
	}
	if err := ob.Migrate(ctx); err != nil {
		return nil, err
	}
	if err := ring.Create(ctx, pool, naming.Names{Schema: schemaRing, Table: naming.DefaultTable}); err != nil {
		return nil, err
	}
	return ob, nil
}

// ringTables lists, for TRUNCATE, the ring outbox's tables that hold
// rows or reading positions: an emptied ring's lanes read from its start.
func ringTables() string {
	var ts []string
	for _, t := range []string{"outbox", "outbox_dlq", "outbox_handoff", "outbox_ring", "outbox_ring_progress", "outbox_ring_claims"} {
		ts = append(ts, pgx.Identifier{schemaRing, t}.Sanitize())
	}
	return strings.Join(ts, ", ")
}

// ringDrainedSQL is true when the ring outbox's table is empty and every
// lane's newest progress has passed the lane's newest row: its snapshot's
// xmin is above the row's transaction, so every row of the lane is
// behind it (the backlog committed before the drain began).
func ringDrainedSQL() string {
	t := func(name string) string { return pgx.Identifier{schemaRing, name}.Sanitize() }
	return "SELECT NOT EXISTS (SELECT 1 FROM " + t("outbox") + ") AND NOT EXISTS (" +
		" SELECT 1 FROM " + t("outbox_ring_lanes") + " AS l" +
		" CROSS JOIN LATERAL (SELECT r.txid FROM " + t("outbox_ring") + " AS r" +
		"  WHERE r.queue = l.queue AND r.lane = l.lane ORDER BY r.txid DESC LIMIT 1) AS m" +
		" WHERE NOT coalesce((SELECT pg_snapshot_xmin(p.snap) > m.txid FROM " + t("outbox_ring_progress") + " AS p" +
		"  WHERE p.queue = l.queue AND p.lane = l.lane ORDER BY p.seq DESC LIMIT 1), false))"
}

// waitRingDrained polls until ringDrainedSQL holds, for up to 2 minutes.
func waitRingDrained(ctx context.Context, env *benchEnv) error {
	q := ringDrainedSQL()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var drained bool
		if err := env.pool.QueryRow(ctx, q).Scan(&drained); err != nil {
			return err
		}
		if drained {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("ring outbox not drained after 2 minutes")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// runRingDrain drains the same backlog, unkeyed and keyed (rowsPerKey rows
// per key), from the outbox table alone and from the ring beside it,
// with the Subscriber at its defaults (claims by lock, and by lease);
// watermill-sql drains the unkeyed backlog at each -watermill-batch. The
// backlogs are written by one plain SQL statement per drainBatch rows.
// The clock stops when the handler has seen every row and every
// acknowledgement landed: the table is empty and, for the ring, every
// lane's progress has passed its rows.
func runRingDrain(ctx context.Context, env *benchEnv, o options) error {
	n := max(int(100000*o.scale)/drainBatch, 1) * drainBatch
	keys := n / rowsPerKey
	drain := func(ob *outbox.Outbox, table pgx.Identifier, keys int, cfg func() *outbox.SubscriberConfig[order]) func(int) (time.Duration, error) {
		return func(n int) (time.Duration, error) {
			if err := keyedBacklog(ctx, env, table, n, keys); err != nil {
				return 0, err
			}
			var done atomic.Int64
			var check *orderCheck
			if keys > 0 {
				check = newOrderCheck(keys)
			}
			sub, err := outbox.NewSubscriber(ob, []string{topic}, func(_ context.Context, m *outbox.Message[order]) error {
				if check != nil {
					defer check.leave(check.enter(m.OrderingKey, m.ID))
				}
				done.Add(1)
				return nil
			}, cfg())
			if err != nil {
				return 0, err
			}
			drained := func() error { return waitEmpty(ctx, env) }
			if ob == env.ring {
				drained = func() error { return waitRingDrained(ctx, env) }
			}
			took, err := timeRun(ctx, sub, func() error {
				if err := waitFor(ctx, &done, n); err != nil {
					return err
				}
				return drained()
			})
			if err == nil && done.Load() != int64(n) {
				err = fmt.Errorf("handled %d messages for %d rows", done.Load(), n)
			}
			if err == nil && check != nil {
				err = check.err()
			}
			return took, err
		}
	}
	leases := func() *outbox.SubscriberConfig[order] { return leasing(defaultConfig[order]()) }
	keyed := fmt.Sprintf("%d keys", keys)
	ringUnkeyed, ringKeyed := "ring, no key", "ring, "+keyed
	cs := []contender{
		{ringUnkeyed, drain(env.ring, ringTable, 0, defaultConfig[order])},
		{ringKeyed, drain(env.ring, ringTable, keys, defaultConfig[order])},
		{ringUnkeyed + ", claims by lease", drain(env.ring, ringTable, 0, leases)},
		{"table, no key", drain(env.ob, outboxTable, 0, defaultConfig[order])},
		{"table, " + keyed, drain(env.ob, outboxTable, keys, defaultConfig[order])},
	}
	var watermills []string
	for _, b := range o.watermillBatch {
		name := fmt.Sprintf("watermill-sql pgx, batch %d", b)
		watermills = append(watermills, name)
		cs = append(cs, contender{name, func(n int) (time.Duration, error) {
			return drainWatermill(ctx, env, n, wsql.BeginnerFromPgx(env.pool), b, false)
		}})
	}
	cs = o.only(cs)
	stats := o.statementStats(ctx, env)
	clockStatements = stats
	defer func() { clockStatements = nil }()
	s, err := measure(o.rounds, n, func() error { return env.reset(ctx) }, stats.wrap(ctx, cs))
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "%d-row backlog (keyed: %d rows on each key), no-op handler, Subscriber[order] at its defaults; "+
		"clock stops when every acknowledgement landed\n", n, rowsPerKey)
	var names []string
	for _, c := range cs {
		names = append(names, c.name)
	}
	base := ringUnkeyed
	if s[base] == nil {
		base = names[0]
	}
	report(o.out, s, names, n, "msg", base)
	defer stats.report(o.out, names, o.rounds, n)
	if s[ringUnkeyed] != nil && s[ringKeyed] != nil {
		fmt.Fprintf(o.out, "%s / %s = %.2fx\n", ringKeyed, ringUnkeyed, rate(median(s[ringKeyed]), n)/rate(median(s[ringUnkeyed]), n))
	}
	for _, w := range watermills {
		if s[w] != nil && s[ringUnkeyed] != nil {
			fmt.Fprintf(o.out, "%s / %s = %.2fx\n", ringUnkeyed, w, rate(median(s[ringUnkeyed]), n)/rate(median(s[w]), n))
		}
	}
	return nil
}
