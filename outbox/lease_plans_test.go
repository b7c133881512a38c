package outbox

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
)

// leasePlanRounds is how many rounds of leaseChurnRound rows
// TestLeaseFilteredStatementsReadTheirRowsByIdWhateverTheStatisticsSay
// passes through the outbox before the outbox is analyzed, and again
// after.
const (
	leasePlanRounds = 150
	leaseChurnRound = 100
	// leasePlanLive is how many rows hold a live lease when the
	// statements are measured (and when the outbox was analyzed).
	leasePlanLive = 10
)

// Every statement filtered by a lease token reads its rows by id, however
// few rows the planner believes hold a lease. Under a held vacuum horizon
// the lease index keeps an entry for every lease written since the hold
// began; when the outbox was last analyzed with a handful of leases live
// (as autovacuum does mid-churn), the planner takes that index for a few
// pages and, for a batch of ids, joined them against the whole of it:
// thousands of blocks for ten rows. Measured as the library sends each
// statement, with the plan the statement's arguments give (custom) and
// the one a prepared statement settles on after its fifth run (generic).
func TestLeaseFilteredStatementsReadTheirRowsByIdWhateverTheStatisticsSay(t *testing.T) {
	t.Parallel()
	h := newHotPathBench(t)
	ctx := h.ctx
	churn := func() {
		for range leasePlanRounds {
			b := &pgx.Batch{}
			b.Queue(`INSERT INTO outbox (queue, payload) SELECT $1, '\x7b7d' FROM generate_series(1, $2)`, hotPathQueue, leaseChurnRound)
			b.Queue(`UPDATE outbox SET acquired_token = gen_random_uuid(), acquired_at = now(), lease_expires_at = now() + interval '1 second'
				WHERE acquired_token IS NULL`)
			b.Queue(`UPDATE outbox SET lease_expires_at = now() + interval '30 seconds' WHERE lease_expires_at < now() + interval '1 minute'`)
			b.Queue(`DELETE FROM outbox WHERE lease_expires_at < now() + interval '1 minute'`)
			h.must(h.d.Pool.SendBatch(ctx, b).Close(), "churn")
		}
	}
	churn()
	// The live leases, of one claim, as ClaimQueue writes them.
	for range leasePlanLive {
		_, err := h.q.Publish(ctx, db.PublishParams{Queue: hotPathQueue, Payload: []byte(`{}`)})
		h.must(err, "Publish")
	}
	tok := newToken()
	rows, err := h.q.ClaimQueue(ctx, db.ClaimQueueParams{Token: tok, Queue: hotPathQueue, MaxRows: leasePlanLive, LeaseTtlSeconds: 3600})
	h.must(err, "ClaimQueue")
	if len(rows) != leasePlanLive {
		t.Fatalf("claimed %d rows, want %d", len(rows), leasePlanLive)
	}
	ids := idsOf(rows, func(r db.ClaimQueueRow) int64 { return r.ID })
	toks := slices.Repeat([]pgtype.UUID{tok}, len(ids))
	_, err = h.d.Pool.Exec(ctx, "ANALYZE outbox")
	h.must(err, "ANALYZE")
	churn()

	statements := []struct {
		name string
		rows int
		call func(q *db.Queries)
	}{
		{"ack-batch", len(ids), func(q *db.Queries) {
			_, _ = q.DeleteBatchWithLease(ctx, db.DeleteBatchWithLeaseParams{Ids: ids, Tokens: toks})
		}},
		{"retry-batch", len(ids), func(q *db.Queries) {
			_, _ = q.MarkPendingBatchWithLease(ctx, db.MarkPendingBatchWithLeaseParams{Ids: ids, Tokens: toks,
				DelaySeconds: make([]float64, len(ids)), LastErrors: slices.Repeat([]string{"failed"}, len(ids))})
		}},
		{"extend-leases", len(ids), func(q *db.Queries) {
			_, _ = q.ExtendLeases(ctx, db.ExtendLeasesParams{LeaseTtlSeconds: 30, Ids: ids, Tokens: toks})
		}},
		{"release", len(ids), func(q *db.Queries) {
			_, _ = q.ReleaseBatchWithLease(ctx, db.ReleaseBatchWithLeaseParams{Ids: ids, Tokens: toks})
		}},
		{"ack-one", 1, func(q *db.Queries) {
			_, _ = q.DeleteWithLease(ctx, db.DeleteWithLeaseParams{ID: ids[0], Token: tok})
		}},
		{"retry-one", 1, func(q *db.Queries) {
			_, _ = q.MarkPendingWithLease(ctx, db.MarkPendingWithLeaseParams{ID: ids[0], Token: tok, DelaySeconds: 1})
		}},
		{"dead-letter", 1, func(q *db.Queries) {
			_, _ = q.DeadLetterWithLease(ctx, db.DeadLetterWithLeaseParams{Attempted: true, Reason: "retry_exhausted", ID: ids[0], Token: tok})
		}},
	}
	conn, err := pgx.Connect(ctx, h.d.URL)
	h.must(err, "connect")
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	h.conn = conn
	for _, s := range statements {
		rec := &recorder{}
		s.call(h.ob.queries(rec))
		// A first run fills the session's catalog caches.
		h.costOf(s.name, rec.sql, rec.args...)
		custom := h.costOf(s.name, rec.sql, rec.args...)
		generic := h.costGeneric(s.name, rec.sql, rec.args...)
		// Per row: the primary key's descent to its id, the row's
		// versions (the one before its lease, kept by the hold), its new
		// version and that version's index entries, and the release
		// trigger's look at the sleep horizon. What reads the lease
		// index's old entries grows with the churn instead: about 1,200
		// blocks for ten rows here.
		bound := 40 + 24*s.rows
		t.Logf("%-14s rows=%2d custom %5d  generic %5d  bound %d  (custom: %s) (generic: %s)",
			s.name, s.rows, custom.all, generic.all, bound, custom.top(), generic.top())
		for _, c := range []struct {
			plan string
			cost hotPathCost
		}{{"custom", custom}, {"generic", generic}} {
			if c.cost.all > bound {
				t.Errorf("%s (%s plan) touched %d blocks for %d rows, want at most %d: %s", s.name, c.plan, c.cost.all, s.rows, bound, c.cost.top())
			}
		}
	}
}

// costGeneric runs sql with args as a prepared statement with its generic
// plan, in a transaction it rolls back, and returns the blocks of the
// outbox's relations it asked for.
func (h *hotPathBench) costGeneric(name, sql string, args ...any) hotPathCost {
	h.tb.Helper()
	tx, err := h.conn.Begin(h.ctx)
	h.must(err, "begin")
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(h.ctx, "SET LOCAL plan_cache_mode = force_generic_plan")
	h.must(err, "plan_cache_mode")
	before := h.blocks(tx)
	_, err = tx.Exec(h.ctx, sql, args...)
	h.must(err, name)
	return blocksBetween(name, before, h.blocks(tx))
}
