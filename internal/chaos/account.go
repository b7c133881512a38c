package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// accounting is what the run's tables say happened.
type accounting struct {
	committed, rolledBack, acked, deadLettered int64
	// lost: committed, neither acknowledged nor dead-lettered.
	lost int64
	// both: acknowledged and dead-lettered.
	both int64
	// phantom: delivered but never committed (rolled back, or unknown).
	phantom int64
	// left: rows still in the outbox (the table, and the ring's unread).
	left int64
	// duplicates are deliveries after one that ended the message (or never
	// ended), by explanation; unexplained ones are bugs.
	duplicates map[string]int64
	// duplicateRows names some rows of the unexplained duplicates.
	duplicateRows []int64
	// overlaps: two deliveries of one row whose handlers ran at once,
	// while both could still write an outcome (see live), by how the
	// first one ended; overlapRows names some of their rows.
	overlaps    map[string]int64
	overlapRows []int64
	// countsNotIncreasing: deliveries of a row whose Message.Deliveries
	// was not above the previous delivery's; countsBelow: deliveries whose
	// Message.Deliveries was below the number of the row's recorded
	// deliveries up to and including it. Rows: some of their rows.
	countsNotIncreasing, countsBelow int64
	countsNotIncreasingRows          []int64
	countsBelowRows                  []int64
	// claims: deliveries by the kind of claim that held the row as its
	// handler began (lock, lease, gone: the row was already deleted;
	// unknown: the start was recorded only after the handler failed).
	claims map[string]int64
	// orderViolations: a key's message delivered after a later one of the
	// key had started.
	orderViolations int64
	// keyOverlaps: two messages of one key handled at once, by explanation.
	keyOverlaps map[string]int64
	// recovery: per fault kind, the time from its end to the affected
	// worker's next finished delivery.
	recovery map[string][]time.Duration

	pubAttempted, pubFailed int64
}

// killOf is when the process of delivery d1 was killed, if it was after
// d1 began. The kill event is written after the process died.
const killOf = `(SELECT min(k.at) FROM events AS k
        WHERE k.kind = 'kill' AND k.worker = d1.worker AND k.at >= d1.started)`

// live is when delivery d1 could no longer write an outcome, as far as the
// harness knows: when its handler returned or its context ended,
// whichever came first, on its worker's clock (handler_end); else, when
// its process was killed (its end was never recorded); else never.
// Every process of the harness, and PostgreSQL, share one host and clock.
const live = `coalesce(d1.handler_end, ` + killOf + `, 'infinity')`

// endKind names how delivery d1's live ended.
const endKind = `coalesce(d1.end_kind, CASE WHEN ` + killOf + ` IS NOT NULL THEN 'killed' ELSE 'end unknown' END)`

// explanation of a redelivery: the fault that touched the first
// delivery's worker between its start and the second's start, or the
// first delivery's lease having expired (as its handler began, for a
// claim by lease, or the lease a claim by lock of the ring recorded; for
// a claim by lock, the lease its end wrote, read as the handler ended,
// else LeaseTTL after the handler began, later than the claim's) before
// the second began.
const explain = `
    coalesce((
        SELECT e.kind FROM events AS e
        WHERE (e.worker = d1.worker OR e.worker IS NULL)
          AND e.until >= d1.started AND e.at <= d2.started
        ORDER BY e.at LIMIT 1),
      CASE WHEN d2.started >= coalesce(d1.lease_expires, d1.started + make_interval(secs => d1.lease_ttl_ms / 1000.0))
           THEN 'lease_expiry' END,
      'unexplained')`

func (c *coordinator) account(ctx context.Context, p *publishers) (*accounting, error) {
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+pgx.Identifier{c.schema}.Sanitize()); err != nil {
		return nil, err
	}
	a := &accounting{duplicates: map[string]int64{}, overlaps: map[string]int64{}, keyOverlaps: map[string]int64{},
		claims: map[string]int64{}, recovery: map[string][]time.Duration{},
		pubAttempted: p.attempted.Load(), pubFailed: p.failed.Load()}
	dlq := pgx.Identifier{c.ob.DeadLetterTable()}.Sanitize()
	dead := `(SELECT (convert_from(x.payload, 'UTF8')::jsonb->>'id')::bigint AS msg_id FROM ` + dlq + ` AS x)`
	err = tx.QueryRow(ctx, `
		WITH ok AS (SELECT DISTINCT msg_id FROM deliveries WHERE outcome = 'ok'), dead AS `+dead+`
		SELECT (SELECT count(*) FROM published),
		       (SELECT count(*) FROM rolled_back),
		       (SELECT count(*) FROM ok),
		       (SELECT count(*) FROM dead),
		       (SELECT count(*) FROM published AS p WHERE p.msg_id NOT IN (SELECT msg_id FROM ok) AND p.msg_id NOT IN (SELECT msg_id FROM dead)),
		       (SELECT count(*) FROM ok WHERE msg_id IN (SELECT msg_id FROM dead)),
		       (SELECT count(DISTINCT d.msg_id) FROM deliveries AS d WHERE d.msg_id NOT IN (SELECT msg_id FROM published)),
		       (SELECT count(*) FROM `+pgx.Identifier{c.ob.Table()}.Sanitize()+`)`).
		Scan(&a.committed, &a.rolledBack, &a.acked, &a.deadLettered, &a.lost, &a.both, &a.phantom, &a.left)
	if err != nil {
		return nil, fmt.Errorf("accounting: %w", err)
	}
	unread, err := c.ringUnread(ctx)
	if err != nil {
		return nil, err
	}
	a.left += unread
	// Redeliveries: a delivery (d2) that follows one (d1) which
	// succeeded, rejected or never ended. One after a failed attempt is a
	// retry.
	const redeliveries = `
		FROM deliveries AS d1
		JOIN LATERAL (SELECT * FROM deliveries AS n WHERE n.msg_id = d1.msg_id AND n.started > d1.started
		              ORDER BY n.started LIMIT 1) AS d2 ON true
		WHERE d1.outcome IS DISTINCT FROM 'fail'`
	if err := collect(ctx, tx, a.duplicates, `SELECT `+explain+`, count(*) `+redeliveries+` GROUP BY 1`); err != nil {
		return nil, err
	}
	if a.duplicateRows, err = ids(ctx, tx, `SELECT DISTINCT d1.row_id `+redeliveries+`
		AND `+explain+` = 'unexplained' ORDER BY 1 LIMIT 10`); err != nil {
		return nil, err
	}
	// Two deliveries of one row whose handlers ran at once while both
	// could still write an outcome: the second began before the first's
	// live ended. Every one breaks the lease-safety promise.
	if err := collect(ctx, tx, a.overlaps, `
		SELECT `+endKind+`, count(*)
		FROM deliveries AS d1 JOIN deliveries AS d2
		  ON d2.row_id = d1.row_id AND (d2.started, d2.id) > (d1.started, d1.id) AND d2.started < `+live+`
		GROUP BY 1`); err != nil {
		return nil, err
	}
	if a.overlapRows, err = ids(ctx, tx, `
		SELECT DISTINCT d1.row_id
		FROM deliveries AS d1 JOIN deliveries AS d2
		  ON d2.row_id = d1.row_id AND (d2.started, d2.id) > (d1.started, d1.id) AND d2.started < `+live+`
		ORDER BY 1 LIMIT 10`); err != nil {
		return nil, err
	}
	// Message.Deliveries against the recorded deliveries of each row, in
	// the order their handlers began: strictly increasing, and never
	// below the count of recorded deliveries so far (deliveries that
	// crashed before they were recorded may make it larger).
	const counted = `
		WITH c AS (
		    SELECT row_id, deliveries, lag(deliveries) OVER w AS previous, row_number() OVER w AS recorded
		    FROM deliveries WINDOW w AS (PARTITION BY row_id ORDER BY started, id))`
	err = tx.QueryRow(ctx, counted+`
		SELECT count(*) FILTER (WHERE deliveries <= previous), count(*) FILTER (WHERE deliveries < recorded) FROM c`).
		Scan(&a.countsNotIncreasing, &a.countsBelow)
	if err != nil {
		return nil, err
	}
	if a.countsNotIncreasingRows, err = ids(ctx, tx, counted+`
		SELECT DISTINCT row_id FROM c WHERE deliveries <= previous ORDER BY 1 LIMIT 10`); err != nil {
		return nil, err
	}
	if a.countsBelowRows, err = ids(ctx, tx, counted+`
		SELECT DISTINCT row_id FROM c WHERE deliveries < recorded ORDER BY 1 LIMIT 10`); err != nil {
		return nil, err
	}
	if err := collect(ctx, tx, a.claims, `SELECT coalesce(claim, 'unknown'), count(*) FROM deliveries GROUP BY 1`); err != nil {
		return nil, err
	}
	// Two messages of one key running at once.
	if err := collect(ctx, tx, a.keyOverlaps, `
		SELECT `+explain+`, count(*)
		FROM deliveries AS d1 JOIN deliveries AS d2
		  ON d2.ordering_key = d1.ordering_key AND d2.msg_id <> d1.msg_id
		 AND d2.started > d1.started AND d2.started < `+live+`
		GROUP BY 1`); err != nil {
		return nil, err
	}
	err = tx.QueryRow(ctx, `
		SELECT count(*) FROM deliveries AS d1 JOIN deliveries AS d2
		  ON d2.ordering_key = d1.ordering_key AND d2.started > d1.started AND d2.seq < d1.seq`).Scan(&a.orderViolations)
	if err != nil {
		return nil, err
	}
	// Recovery runs from a fault's end; from a half-open fault's start,
	// since the worker's noticing it is the recovery.
	rows, err := tx.Query(ctx, `
		WITH e AS (SELECT id, kind, worker, CASE WHEN kind = 'half_open' THEN at ELSE until END AS over FROM events)
		SELECT e.kind, extract(epoch FROM min(d.ended) - e.over)::float8
		FROM e
		JOIN deliveries AS d ON (d.worker = e.worker OR e.worker IS NULL) AND d.ended > e.over
		GROUP BY e.id, e.kind, e.over`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var kind string
		var secs float64
		if err := rows.Scan(&kind, &secs); err != nil {
			return nil, err
		}
		a.recovery[kind] = append(a.recovery[kind], time.Duration(secs*float64(time.Second)))
	}
	return a, rows.Err()
}

// ids returns the ids sql selects.
func ids(ctx context.Context, tx pgx.Tx, sql string) ([]int64, error) {
	rows, err := tx.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// collect adds the (explanation, count) rows of sql to m.
func collect(ctx context.Context, tx pgx.Tx, m map[string]int64, sql string) error {
	rows, err := tx.Query(ctx, sql)
	if err != nil {
		return err
	}
	for rows.Next() {
		var why string
		var n int64
		if err := rows.Scan(&why, &n); err != nil {
			return err
		}
		m[why] += n
	}
	return rows.Err()
}

func total(m map[string]int64) (n int64) {
	for _, v := range m {
		n += v
	}
	return n
}

func breakdown(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// line is the run's one accounting line.
func (a *accounting) line(c *coordinator) string {
	return fmt.Sprintf("chaos: committed %d = acked %d + dead-lettered %d; lost %d; rolled back %d (delivered %d); "+
		"duplicates %d (%s); overlapping deliveries %d (%s); deliveries counts: %d not increasing, %d below the recorded; "+
		"key overlaps %d (%s); order violations %d; left %d; deliveries by claim: %s; "+
		"faults: kills %d, backend terminations %d, stalls %d, cuts %d, half-opens %d (%d connections), pg restarts %d, queue pauses %d; "+
		"publish transactions %d (%d failed by faults)",
		a.committed, a.acked, a.deadLettered, a.lost, a.rolledBack, a.phantom,
		total(a.duplicates), breakdown(a.duplicates), total(a.overlaps), breakdown(a.overlaps),
		a.countsNotIncreasing, a.countsBelow,
		total(a.keyOverlaps), breakdown(a.keyOverlaps), a.orderViolations, a.left, breakdown(a.claims),
		c.kills.Load(), c.terminations.Load(), c.stalls.Load(), c.cuts.Load(), c.halfOpens.Load(), c.halfOpened.Load(),
		c.restarts.Load(), c.pauses.Load(), a.pubAttempted, a.pubFailed)
}

// halfOpenLine says how long the worker took to close the connections
// each half-open fault left, or that it had not within halfOpenLimit.
func (c *coordinator) halfOpenLine() string {
	c.halfOpenMu.Lock()
	ds := slices.Clone(c.halfOpenLasted)
	c.halfOpenMu.Unlock()
	open := c.halfOpens.Load() - int64(len(ds))
	if len(ds) == 0 {
		return fmt.Sprintf("chaos: half-open: %d faults, none closed by the worker within %v", open, halfOpenLimit)
	}
	slices.Sort(ds)
	return fmt.Sprintf("chaos: half-open: worker closed every half-open connection after p50 %v, max %v (%d faults); not within %v: %d faults",
		ds[len(ds)/2].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond), len(ds), halfOpenLimit, open)
}

// recoveries summarises the recovery times per fault kind.
func (a *accounting) recoveries() []string {
	var out []string
	for kind, ds := range a.recovery {
		slices.Sort(ds)
		out = append(out, fmt.Sprintf("%-10s n=%-3d p50 %v  max %v", kind, len(ds),
			ds[len(ds)/2].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond)))
	}
	slices.Sort(out)
	return out
}

// problems lists every broken promise.
func (a *accounting) problems() []string {
	var out []string
	check := func(bad bool, format string, args ...any) {
		if bad {
			out = append(out, fmt.Sprintf(format, args...))
		}
	}
	check(a.lost != 0, "%d committed messages lost", a.lost)
	check(a.acked+a.deadLettered != a.committed+a.both, "committed %d != acked %d + dead-lettered %d", a.committed, a.acked, a.deadLettered)
	check(a.both != 0, "%d messages both acknowledged and dead-lettered", a.both)
	check(a.phantom != 0, "%d messages delivered that were never committed", a.phantom)
	check(a.left != 0, "%d rows left in the outbox", a.left)
	check(a.duplicates["unexplained"] != 0, "%d unexplained duplicates, rows %v", a.duplicates["unexplained"], a.duplicateRows)
	check(total(a.overlaps) != 0, "%d overlapping deliveries of one row (%s), rows %v",
		total(a.overlaps), breakdown(a.overlaps), a.overlapRows)
	check(a.countsNotIncreasing != 0, "%d deliveries whose Message.Deliveries did not exceed the previous delivery's, rows %v",
		a.countsNotIncreasing, a.countsNotIncreasingRows)
	check(a.countsBelow != 0, "%d deliveries whose Message.Deliveries was below the row's recorded deliveries, rows %v",
		a.countsBelow, a.countsBelowRows)
	check(a.claims["lock"] == 0, "no delivery of a claim by lock: the run did not test the claim paths' mixture")
	check(a.claims["lease"] == 0, "no delivery of a claim by lease: the run did not test the claim paths' mixture")
	check(a.keyOverlaps["unexplained"] != 0, "%d unexplained overlapping deliveries of one key", a.keyOverlaps["unexplained"])
	check(a.orderViolations != 0, "%d per-key order violations", a.orderViolations)
	check(a.committed == 0, "nothing was published")
	return out
}

// suspects returns up to n rows that the failed checks name, first of
// each check's.
func (a *accounting) suspects(n int) []int64 {
	var out []int64
	for _, rows := range [][]int64{a.duplicateRows, a.overlapRows, a.countsNotIncreasingRows, a.countsBelowRows} {
		for _, id := range rows {
			if len(out) < n && !slices.Contains(out, id) {
				out = append(out, id)
			}
		}
	}
	return out
}

// history prints every recorded delivery of rows, and every fault, with
// times in milliseconds from the run's start: what CI keeps of a failed
// run, whose scratch schema goes with its machine.
func (c *coordinator) history(ctx context.Context, began time.Time, rows []int64) error {
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+pgx.Identifier{c.schema}.Sanitize()); err != nil {
		return err
	}
	ms := func(col string) string {
		return `coalesce(round(extract(epoch FROM ` + col + ` - $1::timestamptz) * 1000)::text, '-')`
	}
	out, err := tx.Query(ctx, `
		SELECT format('chaos: row %s (msg %s, key %s, seq %s): worker %s %s claim %s deliveries %s attempt %s started %s lease_expires %s handler_end %s (%s) ended %s outcome %s',
		              d.row_id, d.msg_id, coalesce(d.ordering_key, '-'), coalesce(d.seq::text, '-'), d.worker, d.sub,
		              coalesce(d.claim, '-'), d.deliveries, d.attempt, `+ms("d.started")+`, `+ms("d.lease_expires")+`,
		              `+ms("d.handler_end")+`, coalesce(d.end_kind, '-'), `+ms("d.ended")+`, coalesce(d.outcome, '-')) AS line,
		       0 AS part, d.row_id AS row_id, d.started AS at
		FROM deliveries AS d WHERE d.row_id = ANY ($2)
		UNION ALL
		SELECT format('chaos: fault %s worker %s from %s to %s', e.kind, coalesce(e.worker::text, 'all'), `+ms("e.at")+`, `+ms("e.until")+`),
		       1, 0, e.at
		FROM events AS e
		ORDER BY part, row_id, at`, began, rows)
	if err != nil {
		return err
	}
	defer out.Close()
	for out.Next() {
		var (
			line string
			skip any
		)
		if err := out.Scan(&line, &skip, &skip, &skip); err != nil {
			return err
		}
		fmt.Println(line)
	}
	return out.Err()
}
