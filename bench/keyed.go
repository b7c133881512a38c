package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/outbox"
)

// Per-key order (schema 5): rows with the same queue and ordering key are
// delivered one at a time, in commit order. These suites measure what the
// keys cost against the same work without keys.

// rowsPerKey is the rows each key holds in the keyed drain's backlog.
const rowsPerKey = 10

// benchHeaders is the header document Publish writes for an order (its
// correlation id aside), for rows written with plain SQL.
const benchHeaders = `{"content-type": "application/json", "correlation-id": "5f0c6f8e-9a43-4f7e-8d0b-6f2f0c1a2b3c", "message-type": "order"}`

// keyName names key i.
func keyName(i int) string { return "key-" + strconv.Itoa(i) }

// keyIndex inverts keyName.
func keyIndex(k string) (int, error) { return strconv.Atoi(strings.TrimPrefix(k, "key-")) }

// outboxTable is the bench outbox's table.
var outboxTable = pgx.Identifier{schemaOurs, "outbox"}

// insertRowsSQL is PublishBatch's statement with one ordering key per row
// instead of one per call, into table: plain SQL, as any writer may use.
// Keyed rows go through the outbox table's insert trigger, which blocks
// all but a key's head (the ring's takes the key's lock alone).
func insertRowsSQL(table pgx.Identifier) string {
	return "INSERT INTO " + table.Sanitize() + " AS o (queue, payload, headers, ordering_key)" +
		" SELECT $1::text, u.p, $2::jsonb, u.k FROM unnest($3::bytea[], $4::text[]) AS u(p, k) RETURNING o.id"
}

// insertRows writes orders first..first+len(keys)-1 into table in one
// statement, row i with keys[i] (nil: no key).
func insertRows(ctx context.Context, env *benchEnv, table pgx.Identifier, first int, keys []*string) error {
	payloads := make([][]byte, len(keys))
	for i := range keys {
		b, err := jsonOrder(first + i)
		if err != nil {
			return err
		}
		payloads[i] = b
	}
	rows, err := env.pool.Query(ctx, insertRowsSQL(table), topic, benchHeaders, payloads, keys)
	if err != nil {
		return err
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if n != len(keys) {
		return fmt.Errorf("inserted %d rows of %d", n, len(keys))
	}
	return nil
}

// keyedBacklog writes n orders into table; with keys > 0, order i gets key i mod
// keys, so the rows of a key are spread over the backlog. Each statement
// writes drainBatch rows (at most drainBatch keys per transaction: every
// key takes an advisory lock until commit).
func keyedBacklog(ctx context.Context, env *benchEnv, table pgx.Identifier, n, keys int) error {
	ks := make([]*string, drainBatch)
	for first := 0; first < n; first += drainBatch {
		for i := range ks {
			ks[i] = nil
			if keys > 0 {
				k := keyName((first + i) % keys)
				ks[i] = &k
			}
		}
		if err := insertRows(ctx, env, table, first, ks); err != nil {
			return err
		}
	}
	return nil
}

// orderCheck verifies per-key order as a handler sees it: never two
// messages of a key at once, and ids increasing within a key (ids follow
// commit order within a key).
type orderCheck struct {
	busy   []atomic.Bool
	last   []atomic.Int64
	broken atomic.Int64
}

func newOrderCheck(keys int) *orderCheck {
	return &orderCheck{busy: make([]atomic.Bool, keys), last: make([]atomic.Int64, keys)}
}

// enter and leave bracket a handler run of message id of key k.
func (c *orderCheck) enter(k string, id int64) int {
	i, err := keyIndex(k)
	if err != nil || i < 0 || i >= len(c.busy) {
		c.broken.Add(1)
		return -1
	}
	if !c.busy[i].CompareAndSwap(false, true) || c.last[i].Load() >= id {
		c.broken.Add(1)
	}
	c.last[i].Store(id)
	return i
}

func (c *orderCheck) leave(i int) {
	if i >= 0 {
		c.busy[i].Store(false)
	}
}

func (c *orderCheck) err() error {
	if n := c.broken.Load(); n > 0 {
		return fmt.Errorf("per-key order broken %d times", n)
	}
	return nil
}

// runUntilEmpty starts sub and times it until the handler has seen n
// messages and the outbox holds no row (every acknowledgement landed).
func runUntilEmpty(ctx context.Context, env *benchEnv, n int, sub runner, done *atomic.Int64) (time.Duration, error) {
	took, err := timeRun(ctx, sub, func() error {
		if err := waitFor(ctx, done, n); err != nil {
			return err
		}
		return waitEmpty(ctx, env)
	})
	if err == nil && done.Load() != int64(n) {
		err = fmt.Errorf("handled %d messages for %d rows", done.Load(), n)
	}
	return took, err
}

// runKeyedDrain drains the same backlog with and without ordering keys,
// with the drain suite's subscriber. The backlogs are written by the same
// statement; the keyed one spreads its rows over one key per rowsPerKey
// rows (10,000 keys at scale 1). The clock stops when the table is empty.
func runKeyedDrain(ctx context.Context, env *benchEnv, o options) error {
	n := max(int(100000*o.scale)/drainBatch, 1) * drainBatch
	keys := n / rowsPerKey
	drain := func(keys int, cfg func() *outbox.SubscriberConfig[order]) func(int) (time.Duration, error) {
		return func(n int) (time.Duration, error) {
			if err := keyedBacklog(ctx, env, outboxTable, n, keys); err != nil {
				return 0, err
			}
			var done atomic.Int64
			var check *orderCheck
			if keys > 0 {
				check = newOrderCheck(keys)
			}
			sub, err := outbox.NewSubscriber(env.ob, []string{topic}, func(_ context.Context, m *outbox.Message[order]) error {
				if check != nil {
					defer check.leave(check.enter(m.OrderingKey, m.ID))
				}
				done.Add(1)
				return nil
			}, cfg())
			if err != nil {
				return 0, err
			}
			took, err := runUntilEmpty(ctx, env, n, sub, &done)
			if err == nil && check != nil {
				err = check.err()
			}
			return took, err
		}
	}
	// One row per key: every delete runs the hand-over's lookup and finds
	// no next row, so the difference to the keyed drain is the hand-over
	// itself (unblocking the next row).
	unkeyed, keyed, single := "no key", fmt.Sprintf("%d keys", keys), fmt.Sprintf("%d keys, one row each", n)
	unkeyedLeases, keyedLeases := unkeyed+", claims by lease", keyed+", claims by lease"
	leases := func() *outbox.SubscriberConfig[order] { return leasing(drainConfig[order]()) }
	stats := o.statementStats(ctx, env)
	cs := stats.wrap(ctx, []contender{{unkeyed, drain(0, drainConfig[order])}, {keyed, drain(keys, drainConfig[order])},
		{single, drain(n, drainConfig[order])}, {unkeyedLeases, drain(0, leases)}, {keyedLeases, drain(keys, leases)}})
	s, err := measure(o.rounds, n, func() error { return env.reset(ctx) }, cs)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "%d-row backlog, no-op handler, Subscriber[order] (16 workers, batches of 250); clock stops at an empty table\n", n)
	report(o.out, s, []string{unkeyed, keyed, single, unkeyedLeases, keyedLeases}, n, "msg", unkeyed)
	stats.report(o.out, []string{unkeyed, keyed, single, unkeyedLeases, keyedLeases}, o.rounds, n)
	return nil
}

// runHotKey measures one key's throughput: each message's successor is
// blocked until its acknowledgement hands the key over, so messages pass
// one at a time (claim, handler, acknowledgement, hand-over, claim...).
// Several subscriber configurations run against a floor: a loop of the
// library's own claim and acknowledgement statements, nothing else.
func runHotKey(ctx context.Context, env *benchEnv, o options) error {
	n := max(int(2000*o.scale), 50)
	pub, err := outbox.NewPublisher[order](env.ob, topic, nil)
	if err != nil {
		return err
	}
	backlog := func(n int) error {
		msgs := make([]order, 0, drainBatch)
		for first := 0; first < n; first += drainBatch {
			msgs = msgs[:0]
			for i := first; i < min(first+drainBatch, n); i++ {
				msgs = append(msgs, sampleOrder(i))
			}
			if _, err := pub.PublishBatch(ctx, env.pool, msgs, &outbox.PublishOpts{OrderingKey: keyName(0)}); err != nil {
				return err
			}
		}
		return nil
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	configs := []struct {
		name string
		cfg  *outbox.SubscriberConfig[order]
	}{
		{"drain config (AckLinger 5ms)", drainConfig[order]()},
		{"drain config, claims by lease", leasing(drainConfig[order]())},
		{"drain config, AckLinger 0.1ms", func() *outbox.SubscriberConfig[order] {
			c := drainConfig[order]()
			c.AckLinger = 100 * time.Microsecond
			return c
		}()},
		{"drain config, AckBatchSize 1", func() *outbox.SubscriberConfig[order] {
			c := drainConfig[order]()
			c.AckBatchSize = 1
			return c
		}()},
		{"1 worker, FetchBatchSize 1, AckBatchSize 1", &outbox.SubscriberConfig[order]{
			Workers: 1, FetchBatchSize: 1, AckBatchSize: 1, Logger: quiet,
		}},
	}
	var cs []contender
	for _, c := range configs {
		cs = append(cs, contender{c.name, func(n int) (time.Duration, error) {
			if err := backlog(n); err != nil {
				return 0, err
			}
			var done atomic.Int64
			check := newOrderCheck(1)
			sub, err := outbox.NewSubscriber(env.ob, []string{topic}, func(_ context.Context, m *outbox.Message[order]) error {
				defer check.leave(check.enter(m.OrderingKey, m.ID))
				done.Add(1)
				return nil
			}, c.cfg)
			if err != nil {
				return 0, err
			}
			took, err := runUntilEmpty(ctx, env, n, sub, &done)
			if err == nil {
				err = check.err()
			}
			return took, err
		}})
	}
	floor, err := newClaimAckLoop()
	if err != nil {
		return err
	}
	const floorName = "floor: claim + ack loop"
	cs = append(cs, contender{floorName, func(n int) (time.Duration, error) {
		if err := backlog(n); err != nil {
			return 0, err
		}
		return floor.run(ctx, env, n)
	}})
	stats := o.statementStats(ctx, env)
	s, err := measure(o.rounds, n, func() error { return env.reset(ctx) }, stats.wrap(ctx, cs))
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "%d messages on one key, no-op handler; clock stops at an empty table\n", n)
	names := []string{floorName}
	for _, c := range configs {
		names = append(names, c.name)
	}
	report(o.out, s, names, n, "msg", floorName)
	fmt.Fprintf(o.out, "floor, mean round trip per message: claim %v, ack (delete and hand-over) %v\n",
		floor.meanClaim().Round(time.Microsecond), floor.meanAck().Round(time.Microsecond))
	stats.report(o.out, names, o.rounds, n)
	return nil
}

// claimAckLoop claims one row at a time with the library's claim
// statement and acknowledges it with the library's delete: the database
// work of one hot key, without a subscriber around it.
type claimAckLoop struct {
	claim, ack       string
	claims, acks     time.Duration
	claimedN, ackedN int
	emptyClaims      int
}

func newClaimAckLoop() (*claimAckLoop, error) {
	claim, err := librarySQL(schemaOurs, func(q *db.Queries) {
		_, _ = q.ClaimQueue(context.Background(), db.ClaimQueueParams{})
	})
	if err != nil {
		return nil, err
	}
	ack, err := librarySQL(schemaOurs, func(q *db.Queries) {
		_, _ = q.DeleteBatchWithLease(context.Background(), db.DeleteBatchWithLeaseParams{})
	})
	if err != nil {
		return nil, err
	}
	return &claimAckLoop{claim: claim, ack: ack}, nil
}

func (l *claimAckLoop) run(ctx context.Context, env *benchEnv, n int) (time.Duration, error) {
	conn, err := env.pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	start := time.Now()
	for handled := 0; handled < n; {
		t0 := time.Now()
		var id int64
		token := pgtype.UUID{Bytes: uuid.New(), Valid: true}
		// From the queue's start, and every expired lease: nothing is
		// held, so the floors would save nothing.
		rows, err := conn.Query(ctx, l.claim, token, 30.0, topic, (*time.Time)(nil), int32(1), (*float64)(nil))
		if err != nil {
			return 0, err
		}
		got := 0
		for rows.Next() {
			var r db.ClaimQueueRow
			if err := rows.Scan(&r.ID, &r.Payload, &r.Headers, &r.OrderingKey, &r.TimerID,
				&r.CreatedAt, &r.AttemptsCount, &r.DeliveriesCount, &r.SinceFirstAttemptSeconds, &r.NextAttemptAt, &r.Recheck); err != nil {
				rows.Close()
				return 0, err
			}
			id = r.ID
			got++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, err
		}
		l.claims += time.Since(t0)
		l.claimedN++
		if got == 0 {
			l.emptyClaims++
			if time.Since(start) > time.Minute {
				return 0, errors.New("no claimable row")
			}
			continue
		}
		t1 := time.Now()
		var deleted []pgtype.UUID
		rows, err = conn.Query(ctx, l.ack, []int64{id}, []pgtype.UUID{token})
		if err != nil {
			return 0, err
		}
		for rows.Next() {
			var (
				deletedID int64
				t         pgtype.UUID
			)
			if err := rows.Scan(&deletedID, &t); err != nil {
				rows.Close()
				return 0, err
			}
			deleted = append(deleted, t)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, err
		}
		if len(deleted) != 1 {
			return 0, fmt.Errorf("ack of row %d deleted %d rows", id, len(deleted))
		}
		l.acks += time.Since(t1)
		l.ackedN++
		handled++
	}
	if err := waitEmpty(ctx, env); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

func (l *claimAckLoop) meanClaim() time.Duration {
	return l.claims / time.Duration(max(l.claimedN, 1))
}

func (l *claimAckLoop) meanAck() time.Duration { return l.acks / time.Duration(max(l.ackedN, 1)) }

// runKeyedPublish compares one Publish per transaction without a key, with
// a key no other row holds, and with one key for every message (all but
// the first blocked behind it).
func runKeyedPublish(ctx context.Context, env *benchEnv, o options) error {
	pub, err := outbox.NewPublisher[order](env.ob, topic, nil)
	if err != nil {
		return err
	}
	publish := func(key func(i int) string) func(int) (time.Duration, error) {
		return func(n int) (time.Duration, error) {
			start := time.Now()
			for i := range n {
				var opts *outbox.PublishOpts
				if key != nil {
					opts = &outbox.PublishOpts{OrderingKey: key(i)}
				}
				tx, err := env.pool.Begin(ctx)
				if err != nil {
					return 0, err
				}
				if _, err := pub.Publish(ctx, tx, sampleOrder(i), opts); err != nil {
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
	const (
		none     = "Publish, no key"
		distinct = "Publish, a new key each"
		one      = "Publish, one key"
	)
	cs := []contender{
		{none, publish(nil)},
		{distinct, publish(keyName)},
		{one, publish(func(int) string { return keyName(0) })},
	}
	n := max(int(2000*o.scale), 10)
	stats := o.statementStats(ctx, env)
	s, err := measure(o.rounds, n, func() error { return env.reset(ctx) }, stats.wrap(ctx, cs))
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "%d transactions of one message each\n", n)
	report(o.out, s, []string{none, distinct, one}, n, "op", none)
	stats.report(o.out, []string{none, distinct, one}, o.rounds, n)
	return nil
}

// runKeyedBatch compares PublishBatch, 500 rows per call, without a key
// and with one key per call (a new key each call, or the same key for all
// calls). PublishBatch gives every row of a call the same key; rows with
// 500 different keys in one statement are written with plain SQL, against
// the same statement without keys.
func runKeyedBatch(ctx context.Context, env *benchEnv, o options) error {
	pub, err := outbox.NewPublisher[order](env.ob, topic, nil)
	if err != nil {
		return err
	}
	orders := func(first int) []order {
		out := make([]order, batchSize)
		for i := range out {
			out[i] = sampleOrder(first + i)
		}
		return out
	}
	batches := func(fn func(call, first int) error) func(int) (time.Duration, error) {
		return func(n int) (time.Duration, error) {
			start := time.Now()
			for first := 0; first < n; first += batchSize {
				if err := fn(first/batchSize, first); err != nil {
					return 0, err
				}
			}
			return time.Since(start), nil
		}
	}
	publishBatch := func(key func(call int) string) func(int) (time.Duration, error) {
		return batches(func(call, first int) error {
			var opts *outbox.PublishOpts
			if key != nil {
				opts = &outbox.PublishOpts{OrderingKey: key(call)}
			}
			_, err := pub.PublishBatch(ctx, env.pool, orders(first), opts)
			return err
		})
	}
	plain := func(keyed bool) func(int) (time.Duration, error) {
		keys := make([]*string, batchSize)
		return batches(func(_, first int) error {
			for i := range keys {
				keys[i] = nil
				if keyed {
					k := keyName(first + i)
					keys[i] = &k
				}
			}
			return insertRows(ctx, env, outboxTable, first, keys)
		})
	}
	const (
		none    = "PublishBatch, no key"
		perCall = "PublishBatch, a new key per call"
		one     = "PublishBatch, one key for all calls"
		sqlNone = "plain SQL, no key"
		sqlKeys = "plain SQL, 500 keys per statement"
	)
	cs := []contender{
		{none, publishBatch(nil)},
		{perCall, publishBatch(keyName)},
		{one, publishBatch(func(int) string { return keyName(0) })},
		{sqlNone, plain(false)},
		{sqlKeys, plain(true)},
	}
	n := max(int(50000*o.scale)/batchSize, 1) * batchSize
	stats := o.statementStats(ctx, env)
	s, err := measure(o.rounds, n, func() error { return env.reset(ctx) }, stats.wrap(ctx, cs))
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "%d rows per round, %d per call\n", n, batchSize)
	report(o.out, s, []string{none, perCall, one}, n, "row", none)
	fmt.Fprintln(o.out)
	report(o.out, s, []string{sqlNone, sqlKeys}, n, "row", sqlNone)
	stats.report(o.out, []string{none, perCall, sqlNone, sqlKeys}, o.rounds, n)
	return nil
}
