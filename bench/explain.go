package main

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/outbox"
)

// schemaExplain holds the explain suite's outbox; it is dropped at the end.
const schemaExplain = "outboxbench_explain"

// runExplain builds a large keyed outbox (1,000,000 rows over 10,000 keys
// at scale 1, then one hot key of 100,000 rows) with plain SQL through the
// table's triggers, and prints EXPLAIN (ANALYZE, BUFFERS) of the library's
// claim, of a hand-over (deleting a key's head) and of a keyed insert,
// each in a transaction that is rolled back. Statements run inside the
// triggers are shown through auto_explain (nested statements, sent to the
// client as notices). A table of buffer counts ends the output.
func runExplain(ctx context.Context, env *benchEnv, o options) error {
	keys := max(int(10000*o.scale), 100)
	perKey := 100
	hot := max(int(100000*o.scale), 1000)

	x, err := newExplainer(ctx, o)
	if err != nil {
		return err
	}
	defer x.close()
	if err := x.setup(ctx, env); err != nil {
		return err
	}

	fmt.Fprintf(o.out, "writing %d rows over %d keys...\n", keys*perKey, keys)
	if err := x.fill(ctx, keys, perKey); err != nil {
		return err
	}
	if err := x.analyze(ctx); err != nil {
		return err
	}
	for _, batch := range []int{100, 1000} {
		if err := x.claim(ctx, fmt.Sprintf("claim %d, no hot key", batch), batch, customPlan); err != nil {
			return err
		}
	}

	fmt.Fprintf(o.out, "writing %d rows of one hot key...\n", hot)
	if err := x.fillHot(ctx, hot); err != nil {
		return err
	}
	if err := x.analyze(ctx); err != nil {
		return err
	}
	for _, batch := range []int{100, 1000} {
		if err := x.claim(ctx, fmt.Sprintf("claim %d, hot key", batch), batch, customPlan); err != nil {
			return err
		}
	}
	if err := x.claim(ctx, "claim 100, hot key, generic plan", 100, genericPlan); err != nil {
		return err
	}

	hotIDs, err := x.headIDs(ctx, "hot", 1002)
	if err != nil {
		return err
	}
	keyIDs, err := x.headIDs(ctx, keyName(1), 1)
	if err != nil {
		return err
	}
	// Statements inside the triggers are planned like any prepared
	// statement: custom plans for a session's first five runs, then the
	// generic plan when it is not costlier. Show both.
	for _, p := range []struct {
		name, set string
	}{{"custom plan", customPlan}, {"generic plan", genericPlan}} {
		if err := x.handOver(ctx, "hand-over, key of 100 rows, "+p.name, keyIDs[0], p.set); err != nil {
			return err
		}
		if err := x.handOver(ctx, "hand-over, hot key, "+p.name, hotIDs[0], p.set); err != nil {
			return err
		}
		if err := x.insert(ctx, "keyed insert, hot key, "+p.name, "hot", p.set); err != nil {
			return err
		}
		if err := x.insert(ctx, "keyed insert, new key, "+p.name, "new-key", p.set); err != nil {
			return err
		}
	}

	// A hot key drained for a while: its deleted heads stay in the
	// ordering index until vacuum. Each hand-over's lookup marks the
	// entries it finds dead to every transaction, so the next one skips
	// them; a transaction holding an older snapshot keeps them alive.
	if err := x.deleteHeads(ctx, hotIDs[:1000]); err != nil {
		return err
	}
	if err := x.handOver(ctx, "hand-over, hot key, after 1,000 hand-overs, generic plan", hotIDs[1000], genericPlan); err != nil {
		return err
	}
	for _, batch := range []int{100, 1000} {
		if err := x.claim(ctx, fmt.Sprintf("claim %d, after 1,000 hand-overs", batch), batch, customPlan); err != nil {
			return err
		}
	}
	moreIDs, err := x.headIDs(ctx, "hot", 1001)
	if err != nil {
		return err
	}
	if err := x.withOldSnapshot(ctx, func() error {
		if err := x.deleteHeads(ctx, moreIDs[:1000]); err != nil {
			return err
		}
		return x.handOver(ctx, "hand-over, hot key, 1,000 hand-overs under an old snapshot, generic plan", moreIDs[1000], genericPlan)
	}); err != nil {
		return err
	}

	// Rows of other keys written after the hot key's newest row: a keyed
	// insert looks up its key's newest row.
	fmt.Fprintf(o.out, "writing %d rows of other keys after the hot key...\n", hot)
	if err := x.fillAfter(ctx, keys, hot); err != nil {
		return err
	}
	if err := x.analyze(ctx); err != nil {
		return err
	}
	for _, p := range []struct {
		name, set string
	}{{"custom plan", customPlan}, {"generic plan", genericPlan}} {
		if err := x.insert(ctx, "keyed insert, hot key behind newer rows, "+p.name, "hot", p.set); err != nil {
			return err
		}
	}

	// An outbox whose statistics say one key holds (nearly) every keyed
	// row, as ANALYZE sees a queue drained of all but one busy key: the
	// generic plan of the insert's lookup of the key's newest row.
	fmt.Fprintf(o.out, "emptying the outbox, writing %d rows of one key...\n", hot)
	if _, err := x.conn.Exec(ctx, "TRUNCATE "+x.table); err != nil {
		return err
	}
	if err := x.fillHot(ctx, hot); err != nil {
		return err
	}
	if err := x.analyze(ctx); err != nil {
		return err
	}
	for _, p := range []struct {
		name, set string
	}{{"custom plan", customPlan}, {"generic plan", genericPlan}} {
		if err := x.insert(ctx, "keyed insert, new key, one key in the statistics, "+p.name, "new-key", p.set); err != nil {
			return err
		}
	}
	x.summary()
	return nil
}

// explainer runs the explain suite on one connection, which receives the
// auto_explain notices.
type explainer struct {
	o           options
	conn        *pgx.Conn
	autoExplain bool
	ob          *outbox.Outbox
	table       string
	claimQ      string
	mu          sync.Mutex
	notices     []string
	results     []explainResult
}

// explainResult is one statement's buffer counts: the top plan node's, and
// the sum over the statements its triggers ran.
type explainResult struct {
	name                string
	ms                  float64
	hit, read, dirtied  int
	nested              int
	nestedHit, nestedRd int
	indexRows           string
}

func newExplainer(ctx context.Context, o options) (*explainer, error) {
	cfg, err := pgx.ParseConfig(o.dsn)
	if err != nil {
		return nil, err
	}
	x := &explainer{o: o, table: pgx.Identifier{schemaExplain, "outbox"}.Sanitize()}
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		x.mu.Lock()
		x.notices = append(x.notices, n.Message)
		x.mu.Unlock()
	}
	if x.conn, err = pgx.ConnectConfig(ctx, cfg); err != nil {
		return nil, err
	}
	return x, nil
}

func (x *explainer) close() {
	ctx := context.Background()
	_, _ = x.conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schemaExplain}.Sanitize()+" CASCADE")
	_ = x.conn.Close(ctx)
}

func (x *explainer) setup(ctx context.Context, env *benchEnv) error {
	if _, err := x.conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schemaExplain}.Sanitize()+" CASCADE"); err != nil {
		return err
	}
	ob, err := migratedOutbox(ctx, env.pool, schemaExplain)
	if err != nil {
		return err
	}
	x.ob = ob
	x.claimQ, err = librarySQL(schemaExplain, func(q *db.Queries) {
		_, _ = q.ClaimQueue(ctx, db.ClaimQueueParams{})
	})
	if err != nil {
		return err
	}
	if _, err := x.conn.Exec(ctx, "PREPARE claim_queue AS "+x.claimQ); err != nil {
		return err
	}
	// auto_explain shows the statements the triggers run; loading it
	// takes a superuser.
	if _, err := x.conn.Exec(ctx, "LOAD 'auto_explain'"); err != nil {
		fmt.Fprintf(x.o.out, "no plans from inside the triggers: %v\n", err)
		return nil
	}
	x.autoExplain = true
	for _, s := range []string{
		"SET auto_explain.log_analyze = on",
		"SET auto_explain.log_buffers = on",
		"SET auto_explain.log_timing = on",
		"SET auto_explain.log_nested_statements = on",
		"SET auto_explain.log_level = notice",
		"SET client_min_messages = notice",
	} {
		if _, err := x.conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return x.quiet(ctx, false)
}

// quiet turns auto_explain off (for the bulk writes) or on.
func (x *explainer) quiet(ctx context.Context, on bool) error {
	if !x.autoExplain {
		return nil
	}
	v := "-1"
	if on {
		v = "0"
	}
	_, err := x.conn.Exec(ctx, "SET auto_explain.log_min_duration = "+v)
	return err
}

// payloadSQL builds a ~120-byte order like sampleOrder's from g.
const payloadSQL = `convert_to('{"id":"order-' || lpad(g::text, 8, '0') || '","customer":"customer-42","total":' || (1999 + g % 100) || ',"items":["tea","cake","scones"]}', 'UTF8')`

// fill writes keys*perKey rows, row g with key g mod keys.
func (x *explainer) fill(ctx context.Context, keys, perKey int) error {
	return writeKeyedRows(ctx, x.conn, x.table, []byte(benchHeaders), keys, keys*perKey)
}

// writeKeyedRows writes n rows of the bench's topic into table, row g
// with key g mod keys (after every existing row), in statements of at
// most 5,000 keys: each key's advisory lock is held until its statement
// commits.
func writeKeyedRows(ctx context.Context, conn *pgx.Conn, table string, headers []byte, keys, n int) error {
	chunk := min(keys, 5000)
	for first := 0; first < n; first += chunk {
		if _, err := conn.Exec(ctx, "INSERT INTO "+table+" (queue, payload, headers, ordering_key)"+
			" SELECT $1, "+payloadSQL+", $2::jsonb, 'key-' || (g % $3::integer) FROM generate_series($4::integer, $5::integer) AS g",
			topic, headers, keys, first, min(first+chunk, n)-1); err != nil {
			return err
		}
	}
	return nil
}

func (x *explainer) fillHot(ctx context.Context, n int) error {
	for first := 0; first < n; first += 10000 {
		if _, err := x.conn.Exec(ctx, "INSERT INTO "+x.table+" (queue, payload, headers, ordering_key)"+
			" SELECT $1, "+payloadSQL+", $2::jsonb, 'hot' FROM generate_series($3::integer, $4::integer) AS g",
			topic, benchHeaders, first, min(first+10000, n)-1); err != nil {
			return err
		}
	}
	return nil
}

// fillAfter writes n more rows over keys keys, after every existing row.
func (x *explainer) fillAfter(ctx context.Context, keys, n int) error {
	return writeKeyedRows(ctx, x.conn, x.table, []byte(benchHeaders), keys, n)
}

func (x *explainer) analyze(ctx context.Context) error {
	if _, err := x.conn.Exec(ctx, "ANALYZE "+x.table); err != nil {
		return err
	}
	var rows, blocked, pending int
	err := x.conn.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE blocked), count(*) FILTER (WHERE NOT blocked AND acquired_token IS NULL) FROM "+x.table).
		Scan(&rows, &blocked, &pending)
	if err == nil {
		fmt.Fprintf(x.o.out, "outbox: %d rows, %d blocked, %d in the pending index\n", rows, blocked, pending)
	}
	return err
}

// headIDs returns the first n ids of key, read through the primary key
// (a scan of the ordering index would mark its dead entries and change
// what the next hand-over finds).
func (x *explainer) headIDs(ctx context.Context, key string, n int) ([]int64, error) {
	tx, err := x.conn.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SET LOCAL enable_indexscan = off; SET LOCAL enable_indexonlyscan = off; SET LOCAL enable_bitmapscan = off"); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, "SELECT id FROM "+x.table+" WHERE queue = $1 AND ordering_key = $2 ORDER BY id LIMIT $3", topic, key, n)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err == nil && len(ids) < n {
		err = fmt.Errorf("key %s has %d rows, want %d", key, len(ids), n)
	}
	return ids, err
}

// deleteHeads deletes the given heads one transaction each, as
// acknowledgements do; each delete hands its key to the next row.
func (x *explainer) deleteHeads(ctx context.Context, ids []int64) error {
	for _, id := range ids {
		tag, err := x.conn.Exec(ctx, "DELETE FROM "+x.table+" WHERE id = $1 AND NOT blocked", id)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("row %d was not a head", id)
		}
	}
	return nil
}

// withOldSnapshot runs fn while another connection holds a REPEATABLE
// READ snapshot taken before it, as a long transaction would.
func (x *explainer) withOldSnapshot(ctx context.Context, fn func() error) error {
	other, err := pgx.Connect(ctx, x.o.dsn)
	if err != nil {
		return err
	}
	defer other.Close(ctx)
	tx, err := other.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var n int
	if err := tx.QueryRow(ctx, "SELECT 1").Scan(&n); err != nil {
		return err
	}
	return fn()
}

// explain runs stmt under EXPLAIN (ANALYZE, BUFFERS) in a transaction it
// rolls back, after a first rolled-back run that sets the hint bits the
// statement's reads would otherwise set, and prints the plan and the
// nested plans of its triggers.
func (x *explainer) explain(ctx context.Context, name, stmt string, prelude ...string) error {
	run := func(record bool) error {
		tx, err := x.conn.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		for _, p := range prelude {
			if _, err := tx.Exec(ctx, p); err != nil {
				return err
			}
		}
		if err := x.quiet(ctx, record); err != nil {
			return err
		}
		x.mu.Lock()
		x.notices = nil
		x.mu.Unlock()
		rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+stmt)
		if err != nil {
			return err
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		if err := x.quiet(ctx, false); err != nil {
			return err
		}
		if !record {
			return nil
		}
		x.mu.Lock()
		notices := x.notices
		x.mu.Unlock()
		x.record(name, lines, notices)
		return nil
	}
	if err := run(false); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if err := run(true); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

var (
	buffersRE = regexp.MustCompile(`Buffers: shared(?: hit=(\d+))?(?: read=(\d+))?(?: dirtied=(\d+))?`)
	execRE    = regexp.MustCompile(`Execution Time: ([0-9.]+) ms`)
	pendingRE = regexp.MustCompile(`Index Scan using outbox_pending_idx .*actual time=[0-9.]+\.\.[0-9.]+ rows=(\d+)`)
)

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

func (x *explainer) record(name string, lines, notices []string) {
	out := x.o.out
	fmt.Fprintf(out, "\n-- %s\n", name)
	r := explainResult{name: name}
	top := true
	for _, l := range lines {
		fmt.Fprintln(out, l)
		if m := buffersRE.FindStringSubmatch(l); m != nil && top {
			r.hit, r.read, r.dirtied = atoi(m[1]), atoi(m[2]), atoi(m[3])
			top = false
		}
		if m := execRE.FindStringSubmatch(l); m != nil {
			r.ms, _ = strconv.ParseFloat(m[1], 64)
		}
		if m := pendingRE.FindStringSubmatch(l); m != nil && r.indexRows == "" {
			r.indexRows = m[1]
		}
	}
	// auto_explain also reports the top-level statement; keep only the
	// statements the triggers ran.
	for _, n := range notices {
		text := strings.TrimSpace(n)
		if strings.Contains(text, "Query Text: EXPLAIN") || strings.Contains(text, "Query Text: PREPARE") {
			continue
		}
		fmt.Fprintf(out, "  [in trigger] %s\n", strings.ReplaceAll(text, "\n", "\n  "))
		r.nested++
		for _, m := range buffersRE.FindAllStringSubmatch(text, 1) {
			r.nestedHit += atoi(m[1])
			r.nestedRd += atoi(m[2])
		}
	}
	x.results = append(x.results, r)
}

// Plan choices for prepared statements, the library's claim and the
// statements in the triggers alike.
const (
	customPlan  = "SET LOCAL plan_cache_mode = force_custom_plan"
	genericPlan = "SET LOCAL plan_cache_mode = force_generic_plan"
)

func (x *explainer) claim(ctx context.Context, name string, batch int, plan string) error {
	return x.explain(ctx, name, fmt.Sprintf("EXECUTE claim_queue(gen_random_uuid(), 30, '%s', NULL, %d, NULL)", topic, batch), plan)
}

func (x *explainer) handOver(ctx context.Context, name string, id int64, plan string) error {
	return x.explain(ctx, name, fmt.Sprintf("DELETE FROM %s WHERE id = %d", x.table, id), plan)
}

func (x *explainer) insert(ctx context.Context, name, key, plan string) error {
	return x.explain(ctx, name, fmt.Sprintf("INSERT INTO %s (queue, payload, headers, ordering_key) SELECT '%s', %s, '%s'::jsonb, '%s' FROM (VALUES (0)) AS v(g)",
		x.table, topic, payloadSQL, benchHeaders, key), plan)
}

func (x *explainer) summary() {
	fmt.Fprintln(x.o.out, "\nbuffers: the top plan node's shared hits+reads (dirtied); in triggers: the sum over the statements the triggers ran")
	tw := tabwriter.NewWriter(x.o.out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "statement\texecution\tpending-index rows\tbuffers\tdirtied\tin triggers\ttrigger statements\t")
	for _, r := range x.results {
		idx := r.indexRows
		if idx == "" {
			idx = "-"
		}
		fmt.Fprintf(tw, "%s\t%.3f ms\t%s\t%d\t%d\t%d\t%d\t\n", r.name, r.ms, idx, r.hit+r.read, r.dirtied, r.nestedHit+r.nestedRd, r.nested)
	}
	_ = tw.Flush()
}
