package outbox

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/pgtest"
)

// seedStates writes n rows of queue in each state a row can be in
// (leased, expired, due, scheduled, retrying, a key's head and the row
// blocked behind it) and n dead letters.
func (e *env) seedStates(queue string, n int) {
	e.t.Helper()
	e.exec(`INSERT INTO outbox (queue, payload, ordering_key, next_attempt_at, attempts_count, deliveries_count,
			first_attempt_at, acquired_at, acquired_token, lease_expires_at)
		SELECT $1, convert_to(s.payload, 'UTF8'), s.key || i, s.due, s.attempts, s.deliveries, s.first, s.acquired, s.token, s.expires
		FROM generate_series(1, $2::int) AS i CROSS JOIN LATERAL (VALUES
			('leased',    NULL, now(), 0, 1, NULL::timestamptz, now(), gen_random_uuid(), now() + interval '1 minute'),
			('expired',   NULL, now(), 0, 1, NULL, now() - interval '2 minutes', gen_random_uuid(), now() - interval '1 minute'),
			('due',       NULL, now() - interval '1 hour', 0, 0, NULL, NULL, NULL, NULL),
			('scheduled', NULL, now() + interval '1 hour', 0, 0, NULL, NULL, NULL, NULL),
			('retrying',  NULL, now() - interval '1 second', 2, 2, now() - interval '1 minute', NULL, NULL, NULL),
			('k head',    'k', now(), 0, 0, NULL, NULL, NULL, NULL)
		) AS s(payload, key, due, attempts, deliveries, first, acquired, token, expires)
		ORDER BY i, s.payload`, queue, n)
	// Behind each key's head, due long before it: a blocked row is never
	// ready, whatever its due time.
	e.exec(`INSERT INTO outbox (queue, payload, ordering_key, next_attempt_at)
		SELECT $1, 'k next', 'k' || i, now() - interval '1 day' FROM generate_series(1, $2::int) AS i`, queue, n)
	e.exec(`INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason)
		SELECT coalesce((SELECT max(id) FROM outbox_dlq), 0) + i, $1, 'dead', 3, 3, now(), 'rejected'
		FROM generate_series(1, $2::int) AS i`, queue, n)
}

// depthsOf is what QueueDepths reports for stats, but the wait.
func depthsOf(stats []QueueStats) []QueueDepth {
	out := make([]QueueDepth, len(stats))
	for i, s := range stats {
		out[i] = QueueDepth{Queue: s.Queue, Ready: s.Ready, Scheduled: s.Scheduled, Leased: s.Leased,
			Expired: s.Expired, DeadLettered: s.DeadLettered}
	}
	return out
}

// QueueDepths counts what QueueStats counts, on rows in every state in
// several queues, a queue with only dead letters and one with only a
// blocked row; the oldest ready wait is measured from the due time of the
// ready row due earliest, blocked rows aside.
func TestQueueDepthsAgreeWithQueueStats(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.seedEveryState()
	e.seedStates("a", 1)
	e.seedStates("b", 3)
	e.exec(`INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason)
		VALUES (5000, 'dead only', 'dead', 3, 3, now(), 'rejected')`)
	// Outside READ COMMITTED a keyed row is inserted blocked, with a
	// hand-over for a subscriber to complete.
	tx, err := e.db.Pool.BeginTx(e.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(e.ctx, `INSERT INTO outbox (queue, payload, ordering_key) VALUES ('blocked only', 'x', 'k')`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.exec(`INSERT INTO outbox (queue, payload) VALUES ('scheduled only', 'x')`)
	e.exec(`UPDATE outbox SET next_attempt_at = now() + interval '1 minute' WHERE queue = 'scheduled only'`)

	stats, err := e.ob.QueueStats(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.ob.QueueDepths(e.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(depthsOf(stats), got, cmpopts.IgnoreFields(QueueDepth{}, "OldestReadyWait")); diff != "" {
		t.Errorf("QueueDepths against QueueStats (-want +got):\n%s", diff)
	}
	if len(got) != 6 {
		t.Fatalf("got %d queues, want 6: %+v", len(got), got)
	}
	waits := map[string]time.Duration{}
	for _, d := range got {
		waits[d.Queue] = d.OldestReadyWait
	}
	for q, want := range map[string]time.Duration{"a": time.Hour, "b": time.Hour, "q": time.Second} {
		if w := waits[q]; w < want || w > want+time.Minute {
			t.Errorf("queue %s: oldest ready wait %v, want %v and a little more", q, w, want)
		}
	}
	for _, q := range []string{"dead only", "blocked only", "scheduled only"} {
		if w := waits[q]; w != 0 {
			t.Errorf("queue %s has no ready row and an oldest ready wait of %v", q, w)
		}
	}
}

// Every count stops at the cap, and the queue says a count reached it.
func TestQueueDepthsStopAtTheCap(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.seedStates("a", 4)
	e.seedStates("b", 2)
	for _, c := range []struct {
		cap  int64
		want []QueueDepth
	}{
		{3, []QueueDepth{
			{Queue: "a", Ready: 3, Scheduled: 3, Leased: 3, Expired: 3, DeadLettered: 3, Capped: true},
			{Queue: "b", Ready: 3, Scheduled: 2, Leased: 2, Expired: 2, DeadLettered: 2, Capped: true},
		}},
		{12, []QueueDepth{
			{Queue: "a", Ready: 12, Scheduled: 4, Leased: 4, Expired: 4, DeadLettered: 4, Capped: true},
			{Queue: "b", Ready: 6, Scheduled: 2, Leased: 2, Expired: 2, DeadLettered: 2},
		}},
		{13, []QueueDepth{
			{Queue: "a", Ready: 12, Scheduled: 4, Leased: 4, Expired: 4, DeadLettered: 4},
			{Queue: "b", Ready: 6, Scheduled: 2, Leased: 2, Expired: 2, DeadLettered: 2},
		}},
	} {
		got, err := e.ob.QueueDepths(e.ctx, &DepthOptions{Cap: c.cap})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(c.want, got, cmpopts.IgnoreFields(QueueDepth{}, "OldestReadyWait")); diff != "" {
			t.Errorf("cap %d (-want +got):\n%s", c.cap, diff)
		}
	}
	var ie *InputError
	if _, err := e.ob.QueueDepths(e.ctx, &DepthOptions{Cap: -1}); !errors.As(err, &ie) || ie.Field != "DepthOptions.Cap" {
		t.Errorf("a negative cap: %v, want an InputError naming DepthOptions.Cap", err)
	}
}

// planNode is a node of EXPLAIN (FORMAT JSON)'s plan; with BUFFERS, Hit
// and Read are the shared buffers it and the nodes under it touched.
type planNode struct {
	NodeType     string     `json:"Node Type"`
	RelationName string     `json:"Relation Name"`
	IndexName    string     `json:"Index Name"`
	HeapFetches  *int64     `json:"Heap Fetches"`
	ActualRows   float64    `json:"Actual Rows"`
	ActualLoops  float64    `json:"Actual Loops"`
	Filtered     float64    `json:"Rows Removed by Filter"`
	Hit          int        `json:"Shared Hit Blocks"`
	Read         int        `json:"Shared Read Blocks"`
	Plans        []planNode `json:"Plans"`
}

// rowsLookedAt sums, over the scans under n of relations whose names
// start with prefix, the rows they returned and those their filters
// removed, in every loop (EXPLAIN ANALYZE's rows are per loop).
func (n *planNode) rowsLookedAt(prefix string) int {
	rows := 0.0
	for _, s := range n.scans() {
		if strings.HasPrefix(s.RelationName, prefix) {
			rows += (s.ActualRows + s.Filtered) * max(s.ActualLoops, 1)
		}
	}
	return int(rows + 0.5)
}

// scans returns every node of the plan that reads a relation.
func (n *planNode) scans() []planNode {
	var out []planNode
	if n.RelationName != "" {
		out = append(out, *n)
	}
	for i := range n.Plans {
		out = append(out, n.Plans[i].scans()...)
	}
	return out
}

// On a vacuumed, analyzed outbox of tens of thousands of rows in every
// state, the depth query reads the outbox and its dead-letter table only
// by index-only scans of the four indexes that hold every row.
func TestQueueDepthsReadOnlyIndexes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for i, q := range []string{"a", "b", "c", "d"} {
		e.seedStates(q, 1000*(i+1))
	}
	e.exec("VACUUM ANALYZE outbox")
	e.exec("VACUUM ANALYZE outbox_dlq")

	plan := e.depthPlan(func(q *db.Queries) { _, _ = q.QueueDepths(e.ctx, DepthCapDefault) })
	scans := plan.scans()
	indexes := map[string]bool{}
	for _, s := range scans {
		fetches := int64(-1)
		if s.HeapFetches != nil {
			fetches = *s.HeapFetches
		}
		t.Logf("%s on %s using %s, heap fetches %d", s.NodeType, s.RelationName, s.IndexName, fetches)
		if s.NodeType != "Index Only Scan" {
			out, _ := json.MarshalIndent(plan, "", "  ")
			t.Errorf("%s on %s, want index-only scans only; plan:\n%s", s.NodeType, s.RelationName, out)
		}
		indexes[s.IndexName] = true
	}
	want := map[string]bool{"outbox_pending_idx": true, "outbox_lease_expiry_idx": true, "outbox_ordering_idx": true, "outbox_dlq_queue_idx": true}
	if diff := cmp.Diff(want, indexes); diff != "" {
		t.Errorf("indexes read (-want +got):\n%s", diff)
	}
}

// depthPlan returns the plan, run with EXPLAIN (ANALYZE, BUFFERS), of the
// statement call sends, in a transaction with the depth query's plan
// settings (DepthPlanSettings), as QueueDepths runs it.
func (e *env) depthPlan(call func(*db.Queries)) planNode {
	e.t.Helper()
	tx, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	if err := e.ob.queries(tx).DepthPlanSettings(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	return e.analyze(tx, call)
}

// A missing outbox, or one at an older schema, gives the SchemaError that
// names the fix, from QueueDepths as from QueueStats.
func TestQueueDepthsOfAMissingOrOldOutbox(t *testing.T) {
	t.Parallel()
	for _, version := range []int64{0, 4} {
		var e *env
		if version == 0 {
			d := pgtest.New(t)
			e = newEnv(t, d, newOutbox(t, d))
		} else {
			e = atVersion(t, version)
		}
		var se *SchemaError
		if _, err := e.ob.QueueDepths(e.ctx, nil); !errors.As(err, &se) || se.Version != version {
			t.Errorf("QueueDepths at version %d: %v, want a SchemaError", version, err)
		}
		if _, err := e.ob.QueueStats(e.ctx); !errors.As(err, &se) || se.Version != version {
			t.Errorf("QueueStats at version %d: %v, want a SchemaError", version, err)
		}
	}
}

// With Estimate, a queue whose counts reach the cap gets an estimate of
// them from a sample of the table's pages (the whole table, when it holds
// fewer rows than the sample: then exact); a queue under the cap gets
// none, and neither does a table the planner has not measured.
func TestQueueDepthsEstimatesCappedCounts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.exec(`INSERT INTO outbox (queue, payload, next_attempt_at)
		SELECT 'big', '\x00', now() + CASE WHEN i <= 50 THEN interval '1 hour' ELSE interval '0' END FROM generate_series(1, 350) AS i`)
	e.exec(`INSERT INTO outbox (queue, payload) SELECT 'small', '\x00' FROM generate_series(1, 3)`)
	opts := &DepthOptions{Cap: 100, Estimate: true}
	// Never vacuumed nor analyzed: the planner does not know the table's
	// size (PostgreSQL 14 on), and nothing is estimated.
	ds, err := e.ob.QueueDepths(e.ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	var reltuples float64
	if err := e.db.Pool.QueryRow(e.ctx, "SELECT reltuples FROM pg_class WHERE oid = 'outbox'::regclass").Scan(&reltuples); err != nil {
		t.Fatal(err)
	}
	if reltuples < 0 && ds[0].Estimate != nil {
		t.Errorf("an estimate of a table the planner has not measured: %+v", ds[0].Estimate)
	}
	e.exec(`ANALYZE outbox`)
	ds, err = e.ob.QueueDepths(e.ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	want := []QueueDepth{
		{Queue: "big", Ready: 100, Scheduled: 50, Capped: true, Estimate: &DepthEstimate{Ready: 300, Scheduled: 50, SampledPercent: 100}},
		{Queue: "small", Ready: 3},
	}
	if diff := cmp.Diff(want, ds, cmpopts.IgnoreFields(QueueDepth{}, "OldestReadyWait")); diff != "" {
		t.Errorf("QueueDepths with Estimate (-want +got):\n%s", diff)
	}
}
