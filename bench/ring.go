package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
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

// ringTables lists, for TRUNCATE, the ring outbox's tables that hold
// rows or reading positions: an emptied ring's lanes read from its start.
func ringTables() string {
	var ts []string
	for _, t := range []string{"outbox", "outbox_dlq", "outbox_handoff", "outbox_ring", "outbox_ring_progress", "outbox_ring_claims"} {
		ts = append(ts, pgx.Identifier{schemaRing, t}.Sanitize())
	}
	return strings.Join(ts, ", ")
}

// ringQueries renders the generated queries for the bench's ring outbox.
func ringQueries() func(db.DBTX) *db.Queries {
	return naming.Queries(naming.Names{Schema: schemaRing, Table: naming.DefaultTable})
}

// waitRingDrained polls, every every, until every lane of the ring outbox
// has read past its rows and its table holds no row (ringRead), for up to
// 2 minutes.
func waitRingDrained(ctx context.Context, env *benchEnv, every time.Duration) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		drained, err := ringRead(ctx, env)
		if err != nil {
			return err
		}
		if drained {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("ring outbox not drained after 2 minutes")
		}
		time.Sleep(every)
	}
}

// ringRead reports whether no row of the ring is unread and the ring
// outbox's table is empty (a claim moves rows that need state there in
// the transaction that writes its lanes' progress, so the ring is asked
// first), in a transaction with JIT off, as ring.Unread runs (the planner
// has no statistics of the ring's small tables). It asks whether any row
// is unread (RingQueueDepths with a cap of one) where ring.Unread counts
// them all: polled while a clock runs, a count of the whole backlog
// would be much of the server's work.
func ringRead(ctx context.Context, env *benchEnv) (bool, error) {
	tx, err := env.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	q := ringQueries()(tx)
	if err := q.NoJIT(ctx); err != nil {
		return false, err
	}
	depths, err := q.RingQueueDepths(ctx, 1)
	if err != nil {
		return false, err
	}
	for _, d := range depths {
		if d.Ready+d.Scheduled > 0 {
			return false, nil
		}
	}
	var empty bool
	err = tx.QueryRow(ctx, "SELECT NOT EXISTS (SELECT 1 FROM "+pgx.Identifier{schemaRing, "outbox"}.Sanitize()+")").Scan(&empty)
	return empty, err
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
				drained = func() error { return waitRingDrained(ctx, env, 5*time.Millisecond) }
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
			return drainWatermill(ctx, env, n, wsql.BeginnerFromPgx(env.pool), b, nil, false)
		}})
	}
	cs = o.only(cs)
	s, stats, err := o.measureStatements(ctx, env, n, cs)
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

// ringTurnEvery is how often the ringturn suite's turner turns the ring,
// and ringTurnAge how long writers write into one partition there: a
// turn every few hundred milliseconds, where a subscriber's own are
// every RingTurnAge/4 (10 s).
const (
	ringTurnEvery = 250 * time.Millisecond
	ringTurnAge   = time.Second
)

// runRingTurn measures whether turning the ring makes writers wait: 8
// writers INSERT one row per statement into the ring while a Subscriber
// at its defaults (claims by lock, each holding its lane and the
// partitions it reads until its batch ends) drains them, with and without
// a turner that moves writers on every ringTurnAge and empties the
// partitions every lane has read past (TRUNCATE, which gives up at once
// when a reader holds the partition). Reported: each INSERT's latency,
// the writers' throughput, and what the turns did; every row must be
// handled, and the ring drained, before a run ends.
func runRingTurn(ctx context.Context, env *benchEnv, o options) error {
	return ringTurn(ctx, env, o, false)
}

// runRingTurnKeyed is runRingTurn with writers of keyed rows (1,000
// keys): a claim of a keyed lane reads every partition not yet emptied,
// so a turn can empty one only between such claims.
func runRingTurnKeyed(ctx context.Context, env *benchEnv, o options) error {
	return ringTurn(ctx, env, o, true)
}

// ringTurn runs the ringturn suite, its writers' rows keyed or not.
func ringTurn(ctx context.Context, env *benchEnv, o options, keyed bool) error {
	n := max(int(40000*o.scale), 8)
	queries := ringQueries()
	type result struct {
		lat     []time.Duration
		took    time.Duration
		turns   ring.Turned
		handled int
	}
	run := func(turning bool) (result, error) {
		var res result
		if err := env.reset(ctx); err != nil {
			return res, err
		}
		var seen sync.Map
		var handled atomic.Int64
		sub, err := outbox.NewSubscriber(env.ring, []string{topic}, func(_ context.Context, m *outbox.Message[order]) error {
			if _, dup := seen.LoadOrStore(m.ID, true); !dup {
				handled.Add(1)
			}
			return nil
		}, defaultConfig[order]())
		if err != nil {
			return res, err
		}
		rctx, stop := context.WithCancel(ctx)
		defer stop()
		subDone := make(chan error, 1)
		go func() { subDone <- sub.Run(rctx) }()
		turnerDone := make(chan error, 1)
		go func() {
			if !turning {
				turnerDone <- nil
				return
			}
			t := time.NewTicker(ringTurnEvery)
			defer t.Stop()
			for {
				select {
				case <-rctx.Done():
					turnerDone <- nil
					return
				case <-t.C:
				}
				tu, err := ring.Turn(rctx, env.pool, queries, 5*time.Second, ringTurnAge)
				if err != nil && rctx.Err() == nil {
					turnerDone <- err
					return
				}
				res.turns.Moved = res.turns.Moved || tu.Moved
				res.turns.Truncated += tu.Truncated
				res.turns.Busy += tu.Busy
			}
		}()
		payload, err := jsonOrder(0)
		if err != nil {
			return res, err
		}
		insert := "INSERT INTO " + ringTable.Sanitize() + " (queue, payload, headers, ordering_key) VALUES ($1, $2, $3, $4)"
		var next atomic.Int64
		var mu sync.Mutex
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		start := time.Now()
		for range 8 {
			wg.Go(func() {
				lat := make([]time.Duration, 0, n/8+1)
				defer func() {
					mu.Lock()
					res.lat = append(res.lat, lat...)
					mu.Unlock()
				}()
				for i := next.Add(1); i <= int64(n); i = next.Add(1) {
					var key *string
					if keyed {
						k := fmt.Sprint("k", i%1000)
						key = &k
					}
					t0 := time.Now()
					if _, err := env.pool.Exec(ctx, insert, topic, payload, benchHeaders, key); err != nil {
						errs <- err
						return
					}
					lat = append(lat, time.Since(t0))
				}
			})
		}
		wg.Wait()
		res.took = time.Since(start)
		close(errs)
		if err := <-errs; err != nil {
			return res, err
		}
		werr := waitFor(ctx, &handled, n)
		if werr != nil {
			werr = fmt.Errorf("%w; %s", werr, unhandled(ctx, env, topic, &seen))
		}
		if werr == nil {
			werr = waitRingDrained(ctx, env, 5*time.Millisecond)
		}
		stop()
		res.handled = int(handled.Load())
		return res, errors.Join(werr, <-subDone, <-turnerDone)
	}
	contenders := []string{"turning every " + ringTurnAge.String(), "not turning"}
	lat := map[string][]time.Duration{}
	took := map[string][]time.Duration{}
	turns := ring.Turned{}
	for r := range o.rounds {
		for i := range contenders {
			name := contenders[(i+r)%len(contenders)]
			res, err := run(name != "not turning")
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if res.handled != n {
				return fmt.Errorf("%s: %d of %d rows handled", name, res.handled, n)
			}
			lat[name] = append(lat[name], res.lat...)
			took[name] = append(took[name], res.took)
			if name != "not turning" {
				turns.Moved = turns.Moved || res.turns.Moved
				turns.Truncated += res.turns.Truncated
				turns.Busy += res.turns.Busy
			}
		}
	}
	rows := "one-row INSERTs"
	if keyed {
		rows = "one-row INSERTs of keyed rows (1,000 keys)"
	}
	fmt.Fprintf(o.out, "%d %s into the ring by 8 writers, a Subscriber at its defaults draining; every row handled\n", n, rows)
	tw := tabwriter.NewWriter(o.out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "contender\tINSERT p50\tp99\tp99.9\tmax\tINSERTs/s\t")
	for _, name := range contenders {
		l := lat[name]
		slices.Sort(l)
		q := func(f float64) time.Duration { return l[int(f*float64(len(l)-1))].Round(10 * time.Microsecond) }
		fmt.Fprintf(tw, "%s\t%v\t%v\t%v\t%v\t%.0f\t\n", name, q(0.5), q(0.99), q(0.999), q(1), rate(median(took[name]), n))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(o.out, "turns: writers moved on: %v; partitions emptied: %d; emptyings a reader's lock put off: %d\n",
		turns.Moved, turns.Truncated, turns.Busy)
	return nil
}

// unhandled says where the rows of topic that no handler saw (seen holds
// the ids handlers saw) are: still in the ring (with their partition,
// lane and transaction), in the outbox table (with their state), among
// its dead letters (dead-lettered unhandled, as past MaxDeliveries), or
// in none of them; a failed suite prints it, so that a row that did not
// arrive can be followed.
func unhandled(ctx context.Context, env *benchEnv, topic string, seen *sync.Map) string {
	// Where rows may be, and how a row found there is told: the query's
	// first column is the row's id.
	places := []struct{ sql, format string }{
		{"SELECT id, slot, lane, txid::text FROM " + ringTable.Sanitize() + " WHERE queue = $1 ORDER BY id",
			"ring row %v (slot %v, lane %v, txid %v)"},
		{"SELECT id, acquired_token IS NOT NULL, blocked, next_attempt_at > now(), deliveries_count FROM " +
			pgx.Identifier{schemaRing, "outbox"}.Sanitize() + " WHERE queue = $1 ORDER BY id",
			"table row %v (leased %v, blocked %v, later %v, deliveries %v)"},
		{"SELECT id, failure_reason, deliveries_count FROM " + pgx.Identifier{schemaRing, "outbox_dlq"}.Sanitize() +
			" WHERE queue = $1 ORDER BY id",
			"dead letter %v (%v, deliveries %v)"},
	}
	var out []string
	for _, p := range places {
		rows, err := env.pool.Query(ctx, p.sql, topic)
		if err != nil {
			return "where the rows are: " + err.Error()
		}
		found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
		if err != nil {
			return "where the rows are: " + err.Error()
		}
		for _, r := range found {
			if _, ok := seen.Load(r[0].(int64)); !ok {
				out = append(out, fmt.Sprintf(p.format, r...))
			}
		}
	}
	if len(out) == 0 {
		return "no unhandled row is in the ring, the table or its dead letters (the ring's partitions holding them were emptied)"
	}
	return "unhandled: " + strings.Join(out[:min(len(out), 20)], "; ")
}
