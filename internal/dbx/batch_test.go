package dbx_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
	"github.com/outboxgen/outboxgen/internal/pgtest"
)

// tracer counts the batches and the single statements a connection
// sends.
type tracer struct{ batches, queries atomic.Int32 }

func (t *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	t.queries.Add(1)
	return ctx
}
func (t *tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (t *tracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	t.batches.Add(1)
	return ctx
}
func (t *tracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (t *tracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// batchPool returns a pool of its own whose statements tr counts, on a
// database of the test's with an empty table b (n int), and that
// database's own pool.
func batchPool(t *testing.T, tr *tracer) (pool, other *pgxpool.Pool) {
	t.Helper()
	d := pgtest.New(t)
	cfg := d.Pool.Config().Copy()
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(t.Context(), "CREATE TABLE b (n int)"); err != nil {
		t.Fatal(err)
	}
	tr.batches.Store(0)
	tr.queries.Store(0)
	return pool, d.Pool
}

// BeginBatch sends its calls' statements with BEGIN as one batch, in
// order, each reading what the ones before it wrote, and hands each call
// its own results.
func TestBeginBatchRunsItsCallsStatementsInOneBatch(t *testing.T) {
	t.Parallel()
	tr := &tracer{}
	pool, _ := batchPool(t, tr)
	ctx := t.Context()
	var (
		inserted int64
		seen     []int
		above    int
	)
	_, rollback, err := dbx.BeginBatch(ctx, pool, time.Minute,
		func(q db.DBTX) error {
			tag, err := q.Exec(ctx, "INSERT INTO b SELECT generate_series(1, $1)", 3)
			inserted = tag.RowsAffected()
			return err
		},
		func(q db.DBTX) error {
			rows, err := q.Query(ctx, "SELECT n FROM b ORDER BY n")
			if err != nil {
				return err
			}
			seen, err = pgx.CollectRows(rows, pgx.RowTo[int])
			return err
		},
		func(q db.DBTX) error { return q.QueryRow(ctx, "SELECT count(*) FROM b WHERE n > $1", 1).Scan(&above) })
	if err != nil {
		t.Fatal(err)
	}
	defer rollback()
	type results struct {
		Inserted int64
		Seen     []int
		Above    int
	}
	if diff := cmp.Diff(results{3, []int{1, 2, 3}, 2}, results{inserted, seen, above}); diff != "" {
		t.Errorf("results (-want +got):\n%s", diff)
	}
	if b, q := tr.batches.Load(), tr.queries.Load(); b != 1 || q != 0 {
		t.Errorf("%d batches and %d single statements sent; want 1 batch", b, q)
	}
}

// A statement that fails fails the batch with its error; the calls after
// it read nothing.
func TestBeginBatchFailsWithTheFirstStatementsError(t *testing.T) {
	t.Parallel()
	pool, _ := batchPool(t, &tracer{})
	ctx := t.Context()
	var n int
	read := false
	_, _, err := dbx.BeginBatch(ctx, pool, time.Minute,
		func(q db.DBTX) error { return q.QueryRow(ctx, "SELECT 1 / $1::int", 0).Scan(&n) },
		func(q db.DBTX) error {
			rows, err := q.Query(ctx, "SELECT n FROM b")
			if err != nil {
				return err
			}
			defer rows.Close()
			read = rows.Next()
			return rows.Err()
		})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22012" {
		t.Fatalf("error %v; want division_by_zero (22012)", err)
	}
	if read {
		t.Error("the call after the failed statement read a row")
	}
}

// A call that makes no statement, two, or one in an execution mode of
// its own is refused before anything is sent.
func TestBeginBatchRefusesCallsItCannotBatch(t *testing.T) {
	t.Parallel()
	tr := &tracer{}
	pool, _ := batchPool(t, tr)
	ctx := t.Context()
	for _, c := range []struct {
		name, want string
		call       func(q db.DBTX) error
	}{
		{"no statement", "made no statement", func(db.DBTX) error { return nil }},
		{"two statements", "made 2 statements", func(q db.DBTX) error {
			_, _ = q.Exec(ctx, "SELECT 1")
			_, err := q.Exec(ctx, "SELECT 2")
			return err
		}},
		{"its own mode", "execution mode", func(q db.DBTX) error {
			_, err := q.Exec(ctx, "SELECT $1::int", pgx.QueryExecModeExec, 1)
			return err
		}},
		{"COPY", "COPY cannot be batched", func(q db.DBTX) error {
			_, err := q.CopyFrom(ctx, pgx.Identifier{"b"}, []string{"n"}, pgx.CopyFromRows([][]any{{1}}))
			return err
		}},
	} {
		_, _, err := dbx.BeginBatch(ctx, pool, time.Minute, func(q db.DBTX) error { _, err := q.Exec(ctx, "SELECT 0"); return err }, c.call)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v; want one that says %q", c.name, err, c.want)
		}
	}
	if b, q := tr.batches.Load(), tr.queries.Load(); b != 0 || q != 0 {
		t.Errorf("%d batches and %d statements sent; want none", b, q)
	}
}

// A call that makes another statement when its results are read fails
// the batch, and the calls after it read nothing.
func TestBeginBatchFailsACallThatChangesItsStatement(t *testing.T) {
	t.Parallel()
	pool, _ := batchPool(t, &tracer{})
	ctx := t.Context()
	runs := 0
	called := false
	_, _, err := dbx.BeginBatch(ctx, pool, time.Minute,
		func(q db.DBTX) error {
			runs++
			_, err := q.Exec(ctx, "SELECT "+strings.Repeat("1", runs))
			return err
		},
		func(q db.DBTX) error {
			_, err := q.Exec(ctx, "SELECT 2")
			called = err == nil
			return err
		})
	if err == nil || !strings.Contains(err.Error(), "another statement") {
		t.Errorf("error %v; want one that says the call made another statement", err)
	}
	if called {
		t.Error("the call after it read its result")
	}
}

// BeginBatch sends BEGIN with its calls' statements, as one batch, and
// returns the transaction they ran in, open: what they wrote commits with
// it, and its connection goes back to the pool at its end.
func TestBeginBatchBeginsTheTransactionWithItsStatements(t *testing.T) {
	t.Parallel()
	tr := &tracer{}
	pool, other := batchPool(t, tr)
	ctx := t.Context()
	var xid, seen int64
	tx, rollback, err := dbx.BeginBatch(ctx, pool, time.Minute,
		func(q db.DBTX) error {
			return q.QueryRow(ctx, "INSERT INTO b VALUES (1) RETURNING pg_current_xact_id()::text::bigint").Scan(&xid)
		},
		func(q db.DBTX) error {
			return q.QueryRow(ctx, "SELECT count(*) FROM b").Scan(&seen)
		})
	if err != nil {
		t.Fatal(err)
	}
	defer rollback()
	if b, q := tr.batches.Load(), tr.queries.Load(); b != 1 || q != 0 {
		t.Errorf("%d batches and %d single statements sent; want 1 batch", b, q)
	}
	// Another session sees nothing until the commit.
	var others int64
	if err := other.QueryRow(ctx, "SELECT count(*) FROM b").Scan(&others); err != nil {
		t.Fatal(err)
	}
	var same int64
	if err := tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&same); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var after int64
	if err := other.QueryRow(ctx, "SELECT count(*) FROM b").Scan(&after); err != nil {
		t.Fatal(err)
	}
	type state struct{ Seen, Others, After, SameXid int64 }
	if diff := cmp.Diff(state{1, 0, 1, xid}, state{seen, others, after, same}); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d connections still acquired after the commit", n)
	}
}

// A statement of BeginBatch that fails rolls the transaction back: it
// returns the statement's error, nothing it wrote stays, and its
// connection is back in the pool.
func TestBeginBatchRollsBackWhenAStatementFails(t *testing.T) {
	t.Parallel()
	pool, _ := batchPool(t, &tracer{})
	ctx := t.Context()
	tx, _, err := dbx.BeginBatch(ctx, pool, time.Minute,
		func(q db.DBTX) error { _, err := q.Exec(ctx, "INSERT INTO b VALUES (1)"); return err },
		func(q db.DBTX) error { _, err := q.Exec(ctx, "SELECT 1 / $1::int", 0); return err })
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22012" || tx != nil {
		t.Fatalf("transaction %v, error %v; want no transaction and division_by_zero (22012)", tx, err)
	}
	var n int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM b").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d rows of the failed transaction stayed", n)
	}
	if a := pool.Stat().AcquiredConns(); a != 0 {
		t.Errorf("%d connections still acquired", a)
	}
}
