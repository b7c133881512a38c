package outbox

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/pgtest"
)

// holdSnapshot opens a REPEATABLE READ transaction with its snapshot
// taken, on a connection of its own named app (application_name), and
// keeps it open until the test ends or the caller rolls it back: vacuum
// keeps every row version deleted after it, and their index entries
// cannot be marked dead.
func (e *env) holdSnapshot(app string) pgx.Tx {
	e.t.Helper()
	return holdSnapshot(e.t, e.db.URL, app)
}

// holdSnapshot is env.holdSnapshot for a test or benchmark tb on the
// database at url.
func holdSnapshot(tb testing.TB, url, app string) pgx.Tx {
	tb.Helper()
	// The tests that hold a snapshot look for theirs as the oldest.
	pgtest.Exclusive(tb, "oldest snapshot")
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	if app != "" {
		cfg.RuntimeParams["application_name"] = app
	}
	ctx := tb.Context()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close(context.Background()) })
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil { // takes the snapshot
		tb.Fatal(err)
	}
	return tx
}

// pendingScanBuffers runs the statement that call makes under EXPLAIN
// (ANALYZE, BUFFERS) in a transaction it rolls back, and returns the
// rows it left leased and the shared buffers its scans of the pending
// index touched (the index's pages and the row versions its entries
// point to).
func (e *env) pendingScanBuffers(call func(q *db.Queries)) (leased, buffers int) {
	e.t.Helper()
	tx, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	plan := e.analyze(tx, call)
	if err := tx.QueryRow(e.ctx, "SELECT count(*) FROM outbox WHERE acquired_token IS NOT NULL").Scan(&leased); err != nil {
		e.t.Fatal(err)
	}
	return leased, plan.buffersOf("outbox_pending_idx")
}

// analyze runs the statement that call sends, with the arguments it
// sends, under EXPLAIN (ANALYZE, BUFFERS) in tx, and returns its plan.
func (e *env) analyze(tx pgx.Tx, call func(q *db.Queries)) planNode {
	e.t.Helper()
	rec := &recorder{}
	call(e.ob.queries(rec))
	var out []struct{ Plan planNode }
	if err := tx.QueryRow(e.ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+rec.sql, rec.args...).Scan(&out); err != nil || len(out) != 1 {
		e.t.Fatalf("EXPLAIN: %v (%d plans)", err, len(out))
	}
	return out[0].Plan
}

// heldBacklog fills e's queue q with 20,000 rows, due an hour ago, and
// deletes them while a snapshot is held: their entries stay in the
// pending index, and no scan can mark them dead.
func (e *env) heldBacklog() {
	e.t.Helper()
	e.holdSnapshot("")
	e.exec(`INSERT INTO outbox (queue, payload, next_attempt_at)
		SELECT 'q', '\x00', now() - interval '1 hour' + i * interval '1 ms' FROM generate_series(1, 20000) AS i`)
	e.exec(`DELETE FROM outbox`)
	e.exec(`VACUUM outbox`)
}

// buffersOf sums the buffers of the scans of index under n.
func (n *planNode) buffersOf(index string) int {
	sum := 0
	if n.IndexName == index {
		sum += n.Hit + n.Read
	}
	for i := range n.Plans {
		sum += n.Plans[i].buffersOf(index)
	}
	return sum
}

// The idle fetcher's probe for the next due time reads only the entries
// since its last claim, however many a held snapshot keeps before them.
func TestNextDueInStepsOverNoEntryAHeldSnapshotKeeps(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.heldBacklog()
	e.exec(`INSERT INTO outbox (queue, payload, next_attempt_at) VALUES ('q', '\x00', now() + interval '1 minute')`)
	_, buffers := e.pendingScanBuffers(func(q *db.Queries) {
		_, _ = q.NextDueIn(e.ctx, db.NextDueInParams{Queues: []string{"q"}, SinceClaimSeconds: 1})
	})
	t.Logf("next due time behind 20,000 deleted rows: its scan of the pending index touched %d buffers", buffers)
	if buffers > 20 {
		t.Errorf("the probe for the next due time touched %d buffers of the pending index, want at most 20", buffers)
	}
	got, err := e.q.NextDueIn(e.ctx, db.NextDueInParams{Queues: []string{"q"}, SinceClaimSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got < 50 || got > 61 {
		t.Errorf("next row due in %.1f s, want about 60", got)
	}
}
