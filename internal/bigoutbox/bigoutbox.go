// Package bigoutbox fills an outbox with the million rows and hundred
// thousand dead letters the console's quality bars are measured on: the
// plan test and the page benchmark of package console, and
// bench/cmd/consoleload. One copy of the statements serves all three.
package bigoutbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The large outbox the console's quality bars are measured on: 1,000,000
// outbox rows over four queues and 100,000 dead letters.
const (
	rounds        = 10     // rounds of inserts, each a slice of the id range
	plainPerRound = 80_000 // rows without an ordering key, per round
	keysPerRound  = 1_000  // ordering keys per round
	rowsPerKey    = 20     // rows per key: its head and the rows behind it
	// DeadLetters is how many rows the dead-letter table holds.
	DeadLetters = 100_000
	// Rows is how many rows the outbox holds.
	Rows = rounds * (plainPerRound + keysPerRound*rowsPerKey)
	// FirstRow is the outbox's lowest id; ids below it are the dead
	// letters' (and gaps).
	FirstRow = 150_001
)

// Queues are the fixture's queues, by name. Of every ten rows and
// dead letters, four are of orders, three of emails, two of webhooks and
// one of billing.
var Queues = []string{"billing", "emails", "orders", "webhooks"}

// queueOf is the SQL expression of the queue of row n.
func queueOf(n string) string {
	return `(ARRAY['orders','orders','orders','orders','emails','emails','emails','webhooks','webhooks','billing'])[1 + ` + n + ` % 10]`
}

// Statements are the statements that fill a freshly migrated outbox (its
// schema first on the search path), in order, each with its arguments.
//
// Rows without a key, by their number i, of every 1,000 values of i / 10
// (so that every queue, i % 10, has rows in every state): 855 ready (due
// since they were created), 50 scheduled for the next two hours, 20
// scheduled with a timer id for the next day, 60 retrying (an attempt or
// more, a last error, half of them due again), 12 leased with a live lease
// and 3 leased with a lease that expired minutes ago. Rows with a key come
// as 20 per key, inserted head first: the ordering trigger leaves a key's
// lowest id unblocked and blocks every later row of it. Heads, by key k,
// of every 20 values of k / 10: 10 ready, 3 leased, 1 leased past its
// expiry, 3 retrying and 3 scheduled, these due later; the rows behind
// them are due. Rows are created 50 ms apart, the oldest about 14 hours
// ago. Dead letters take the ids below FirstRow (with gaps, the
// rows delivered between them), spread over the four queues and the four
// reasons, one failing every 25 seconds over the last 29 days. The inserts
// fire the triggers (the ordering trigger per keyed row, the wake-up per
// statement) as publishers' inserts do; nothing is dropped to speed them.
func Statements() []Stmt {
	stmts := []Stmt{
		{SQL: `SELECT setval('outbox_id_seq', $1::bigint - 1)`, Args: []any{FirstRow}},
		{SQL: `INSERT INTO outbox_dlq (id, queue, payload, headers, ordering_key, timer_id, deliveries_count,
				attempts_count, created_at, failed_at, failure_reason, last_error)
			SELECT g.j + (g.j - 1) / 2, ` + queueOf("g.j") + `,
			       convert_to(format('{"order":%s,"customer":"customer-%s","total":%s,"items":["tea","cake","scones"]}',
			                         g.j, g.j % 5000, 100 + g.j % 9900), 'UTF8'),
			       '{"content-type":"application/json","source":"checkout"}'::jsonb,
			       CASE WHEN g.j % 5 = 0 THEN 'customer-' || g.j % 10000 END,
			       CASE WHEN g.j % 50 = 0 THEN 'timer-dead-' || g.j END,
			       CASE WHEN r.reason = 'max_deliveries' THEN 10 ELSE 5 END,
			       CASE WHEN r.reason IN ('max_deliveries', 'decode_error') THEN 0 ELSE 5 END,
			       f.failed - interval '10 minutes', f.failed, r.reason,
			       CASE r.reason WHEN 'retry_exhausted' THEN format('handler: POST https://hooks.example.com/%s: 503 Service Unavailable', g.j % 100)
			                     WHEN 'rejected' THEN 'handler: customer ' || g.j % 5000 || ' is closed'
			                     WHEN 'decode_error' THEN 'decode: unexpected end of JSON input' END
			FROM generate_series(1, $1::int) AS g(j)
			CROSS JOIN LATERAL (SELECT now() - ($1::int - g.j) * interval '25 seconds' AS failed) AS f
			CROSS JOIN LATERAL (SELECT (ARRAY['max_deliveries','retry_exhausted','rejected','decode_error'])[1 + (g.j / 10) % 4] AS reason) AS r`,
			Args: []any{DeadLetters}},
	}
	plain := `INSERT INTO outbox (queue, payload, headers, timer_id, created_at, next_attempt_at, attempts_count,
			deliveries_count, first_attempt_at, last_attempt_at, acquired_at, acquired_token, lease_expires_at, last_error)
		SELECT ` + queueOf("g.i") + `,
		       convert_to(format('{"order":%s,"customer":"customer-%s","total":%s,"items":["tea","cake","scones"]}',
		                         g.i, g.i % 5000, 100 + g.i % 9900), 'UTF8'),
		       '{"content-type":"application/json","source":"checkout"}'::jsonb,
		       CASE WHEN s.st = 'timer' THEN 'timer-' || g.i END,
		       c.created,
		       CASE s.st WHEN 'scheduled' THEN now() + (1 + g.i % 7200) * interval '1 second'
		                 WHEN 'timer' THEN now() + (1 + g.i % 86400) * interval '1 second'
		                 WHEN 'retrying' THEN now() + (g.i % 1800 - 900) * interval '1 second'
		                 ELSE c.created END,
		       CASE WHEN s.st = 'retrying' THEN 1 + g.i % 5 ELSE 0 END,
		       CASE WHEN s.st = 'retrying' THEN 1 + g.i % 5 WHEN s.st IN ('leased', 'expired') THEN 1 ELSE 0 END,
		       CASE WHEN s.st = 'retrying' THEN c.created + interval '1 second' ELSE l.acquired END,
		       CASE WHEN s.st = 'retrying' THEN now() - (900 + g.i % 600) * interval '1 second' ELSE l.acquired END,
		       l.acquired,
		       CASE WHEN l.acquired IS NOT NULL THEN md5(g.i::text)::uuid END,
		       l.acquired + interval '30 seconds',
		       CASE WHEN s.st = 'retrying' THEN format('handler: POST https://hooks.example.com/%s: 503 Service Unavailable', g.i % 100) END
		FROM generate_series($1::int, $2::int) AS g(i)
		CROSS JOIN LATERAL (SELECT g.i / 10 % 1000 AS n) AS n
		CROSS JOIN LATERAL (SELECT CASE WHEN n.n < 855 THEN 'ready' WHEN n.n < 905 THEN 'scheduled'
		                                WHEN n.n < 925 THEN 'timer' WHEN n.n < 985 THEN 'retrying'
		                                WHEN n.n < 997 THEN 'leased' ELSE 'expired' END AS st) AS s
		CROSS JOIN LATERAL (SELECT now() - ($3::int - $4::int - g.i) * interval '50 ms' AS created) AS c
		CROSS JOIN LATERAL (SELECT CASE s.st WHEN 'leased' THEN now() - (g.i % 20) * interval '1 second'
		                                     WHEN 'expired' THEN now() - (300 + g.i % 600) * interval '1 second' END AS acquired) AS l
		ORDER BY g.i`
	keyed := `INSERT INTO outbox (queue, payload, headers, ordering_key, created_at, next_attempt_at, attempts_count,
			deliveries_count, first_attempt_at, last_attempt_at, acquired_at, acquired_token, lease_expires_at, last_error)
		SELECT ` + queueOf("k.k") + `,
		       convert_to(format('{"customer":"customer-%s","event":%s,"status":"updated"}', k.k, p.p), 'UTF8'),
		       '{"content-type":"application/json","source":"accounts"}'::jsonb,
		       'customer-' || k.k,
		       c.created,
		       CASE s.st WHEN 'retrying' THEN now() + (60 + k.k % 1800) * interval '1 second'
		                 WHEN 'scheduled' THEN now() + (60 + k.k % 7200) * interval '1 second'
		                 ELSE c.created END,
		       CASE WHEN s.st = 'retrying' THEN 1 + k.k % 5 ELSE 0 END,
		       CASE WHEN s.st = 'retrying' THEN 1 + k.k % 5 WHEN s.st IN ('leased', 'expired') THEN 1 ELSE 0 END,
		       CASE WHEN s.st = 'retrying' THEN c.created + interval '1 second' ELSE l.acquired END,
		       CASE WHEN s.st = 'retrying' THEN now() - (k.k % 600) * interval '1 second' ELSE l.acquired END,
		       l.acquired,
		       CASE WHEN l.acquired IS NOT NULL THEN md5('key' || k.k)::uuid END,
		       l.acquired + interval '30 seconds',
		       CASE WHEN s.st = 'retrying' THEN 'handler: customer ' || k.k || ': account is locked' END
		FROM generate_series(0, $3::int - 1) AS p(p)
		CROSS JOIN generate_series($1::int, $2::int) AS k(k)
		CROSS JOIN LATERAL (SELECT k.k / 10 % 20 AS n) AS n
		CROSS JOIN LATERAL (SELECT CASE WHEN p.p > 0 THEN 'behind' WHEN n.n < 10 THEN 'ready'
		                                WHEN n.n < 13 THEN 'leased' WHEN n.n = 13 THEN 'expired'
		                                WHEN n.n < 17 THEN 'retrying' ELSE 'scheduled' END AS st) AS s
		CROSS JOIN LATERAL (SELECT now() - ($4::int - p.p * $5::int - k.k % $5::int) * interval '50 ms' AS created) AS c
		CROSS JOIN LATERAL (SELECT CASE s.st WHEN 'leased' THEN now() - (k.k % 20) * interval '1 second'
		                                     WHEN 'expired' THEN now() - (300 + k.k % 600) * interval '1 second' END AS acquired) AS l
		ORDER BY p.p, k.k`
	// Each round's keyed rows are created after its plain ones; a key's
	// rows follow one another every keys-of-the-round rows. A round takes
	// one advisory lock per key (the ordering trigger's), held to its end:
	// a thousand keys stay well inside the server's lock table.
	perRound := plainPerRound + keysPerRound*rowsPerKey
	for r := range rounds {
		first := r*plainPerRound + 1
		stmts = append(stmts,
			Stmt{SQL: plain, Args: []any{first, first + plainPerRound - 1, Rows, r * (perRound - plainPerRound)}},
			Stmt{SQL: keyed, Args: []any{r * keysPerRound, (r+1)*keysPerRound - 1, rowsPerKey,
				Rows - r*perRound - plainPerRound, keysPerRound}})
	}
	// Statistics, as autovacuum's analyze would gather them; no vacuum.
	// The tables stay as a burst of inserts leaves them: no page marked
	// all-visible, so every index-only scan checks the table too. That is
	// the harder case for the plans (the test database runs with
	// autovacuum off, so nothing vacuums them during the test either).
	return append(stmts, Stmt{SQL: "ANALYZE outbox, outbox_dlq"})
}

// Stmt is one statement of the fixture.
type Stmt struct {
	SQL  string
	Args []any
}

// Fill runs Statements through pool, whose search path starts with a
// freshly migrated outbox's schema.
func Fill(ctx context.Context, pool *pgxpool.Pool) error {
	for i, s := range Statements() {
		if _, err := pool.Exec(ctx, s.SQL, s.Args...); err != nil {
			return fmt.Errorf("bigoutbox: statement %d: %w", i, err)
		}
	}
	return nil
}
