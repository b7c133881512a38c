package outbox

import (
	"context"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgen/outboxgen/db"
)

// recorder captures the SQL and arguments a generated query sends,
// without running it.
type recorder struct {
	sql  string
	args []any
}

func (r *recorder) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	r.sql, r.args = sql, args
	return pgconn.CommandTag{}, nil
}

func (r *recorder) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	r.sql, r.args = sql, args
	return nil, errRecorded
}

func (r *recorder) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	r.sql, r.args = sql, args
	return errRow{errRecorded}
}

func (r *recorder) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, errRecorded
}

var errRecorded = pgconn.NewParseConfigError("", "recorded, not run", nil)

// explain returns the plan of the statement that call sends, with the
// arguments it sends.
func (e *env) explain(call func(*db.Queries)) string {
	e.t.Helper()
	rec := &recorder{}
	call(e.ob.queries(rec))
	if rec.sql == "" {
		e.t.Fatal("no SQL recorded")
	}
	rows, err := e.db.Pool.Query(e.ctx, "EXPLAIN "+rec.sql, rec.args...)
	if err != nil {
		e.t.Fatalf("EXPLAIN: %v", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.t.Fatalf("EXPLAIN: %v", err)
	}
	return strings.Join(lines, "\n")
}

// scansOutbox reports whether plan reads the outbox table (not its lock
// records or dead letters) sequentially.
func scansOutbox(plan string) bool {
	return regexp.MustCompile(`Seq Scan on outbox( |$)`).MatchString(plan)
}

// The claim must stay cheap however deep the backlog: on 100k rows its plan
// reads the outbox only through the partial indexes.
func TestClaimPlanUsesPartialIndexes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.exec(`INSERT INTO outbox (queue, payload, next_attempt_at)
		SELECT 'q' || (i % 4), '\x00', now() - (i || ' ms')::interval FROM generate_series(1, 100000) AS i`)
	e.exec(`UPDATE outbox SET acquired_token = gen_random_uuid(), acquired_at = now(),
		lease_expires_at = now() + interval '30 seconds' WHERE id % 100 = 0`)
	e.exec("ANALYZE outbox")

	params := db.ClaimParams{Token: newToken(), Queues: []string{"q1", "q2"}, MaxRows: 100, LeaseTtlSeconds: 30}
	plan := e.explain(func(q *db.Queries) { _, _ = q.Claim(e.ctx, params) })
	t.Log(plan)
	if scansOutbox(plan) {
		t.Errorf("claim plan scans the outbox table sequentially:\n%s", plan)
	}
	for _, idx := range []string{"outbox_pending_idx", "outbox_lease_expiry_idx"} {
		if !strings.Contains(plan, idx) {
			t.Errorf("claim plan does not use %s:\n%s", idx, plan)
		}
	}

	plan = e.explain(func(q *db.Queries) {
		_, _ = q.ClaimQueue(e.ctx, db.ClaimQueueParams{Token: newToken(), Queue: "q1", MaxRows: 100, LeaseTtlSeconds: 30})
	})
	for _, idx := range []string{"outbox_pending_idx", "outbox_lease_expiry_idx"} {
		if scansOutbox(plan) || !strings.Contains(plan, idx) {
			t.Errorf("one-queue claim plan does not use %s:\n%s", idx, plan)
		}
	}

	// The claims by lock a default subscriber makes for any backlog of
	// minLockedClaimDefault rows or more: one queue, and several.
	plan = e.explain(func(q *db.Queries) {
		_, _ = q.LockQueue(e.ctx, db.LockQueueParams{Queue: "q1", MaxRows: 100, IdleTimeoutMs: 30000})
	})
	if scansOutbox(plan) || !strings.Contains(plan, "outbox_pending_idx") {
		t.Errorf("LockQueue plan does not use outbox_pending_idx:\n%s", plan)
	}
	plan = e.explain(func(q *db.Queries) {
		_, _ = q.Lock(e.ctx, db.LockParams{Queues: params.Queues, PerQueue: 50, MaxRows: 100, IdleTimeoutMs: 30000,
			AfterAt: make([]time.Time, 2), AfterID: []int64{math.MinInt64, math.MinInt64}})
	})
	if scansOutbox(plan) || !strings.Contains(plan, "outbox_pending_idx") {
		t.Errorf("Lock plan does not use outbox_pending_idx:\n%s", plan)
	}

	plan = e.explain(func(q *db.Queries) { _, _ = q.NextDueIn(e.ctx, db.NextDueInParams{Queues: params.Queues}) })
	if scansOutbox(plan) || !strings.Contains(plan, "outbox_pending_idx") {
		t.Errorf("next-due plan does not use outbox_pending_idx:\n%s", plan)
	}
}

// claimBuffers runs a one-queue claim of n rows under EXPLAIN (ANALYZE,
// BUFFERS) in a transaction it rolls back, and returns the rows it claimed
// and the shared buffers it touched.
func (e *env) claimBuffers(n int32) (rows, buffers int) {
	e.t.Helper()
	rec := &recorder{}
	_, _ = e.ob.queries(rec).ClaimQueue(e.ctx, db.ClaimQueueParams{Token: newToken(), Queue: "q", MaxRows: n, LeaseTtlSeconds: 30})
	tx, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer tx.Rollback(e.ctx)
	var plan []struct{ Plan planNode }
	if err := tx.QueryRow(e.ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+rec.sql, rec.args...).Scan(&plan); err != nil {
		e.t.Fatalf("EXPLAIN: %v", err)
	}
	var claimed int
	if err := tx.QueryRow(e.ctx, "SELECT count(*) FROM outbox WHERE acquired_token IS NOT NULL").Scan(&claimed); err != nil {
		e.t.Fatal(err)
	}
	return claimed, plan[0].Plan.Hit + plan[0].Plan.Read
}

// A claim's cost does not grow with the backlog of keyed rows: rows
// waiting behind their key's head are not in the pending index, so a
// claim of 100 rows touches about as many buffers over a one-key backlog
// of 20,000 rows and 20,000 rows spread over 2,000 keys as over 2,000
// rows of 2,000 keys.
func TestClaimCostDoesNotGrowWithKeyBacklogs(t *testing.T) {
	t.Parallel()
	small, large := setup(t), setup(t)
	small.exec(`INSERT INTO outbox (queue, payload, ordering_key)
		SELECT 'q', '\x00', 'k' || i FROM generate_series(1, 2000) AS i`)
	large.exec(`INSERT INTO outbox (queue, payload, ordering_key)
		SELECT 'q', '\x00', CASE WHEN i % 2 = 0 THEN 'hot' ELSE 'k' || (i % 2000) END
		FROM generate_series(1, 40000) AS i`)
	for _, e := range []*env{small, large} {
		e.exec("VACUUM ANALYZE outbox")
	}
	smallRows, smallBuf := small.claimBuffers(100)
	largeRows, largeBuf := large.claimBuffers(100)
	t.Logf("claim of 100: %d buffers over 2,000 keyed rows, %d over 40,000 (a hot key of 20,000)", smallBuf, largeBuf)
	if smallRows != 100 || largeRows != 100 {
		t.Fatalf("claimed %d and %d rows, want 100", smallRows, largeRows)
	}
	if largeBuf > smallBuf*3/2+20 {
		t.Errorf("claim of 100 touched %d buffers over the large backlog, %d over the small one", largeBuf, smallBuf)
	}
}

// errRow is a row whose Scan fails with err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
