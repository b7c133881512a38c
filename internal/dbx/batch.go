package dbx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgen/outboxgen/db"
)

// Batcher sends statements together, each batch on a connection of its
// own: a pgxpool.Pool.
type Batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// BeginBatch begins a transaction at READ COMMITTED on a connection of
// pool with the statements of calls, each one statement of the generated
// queries made through the DBTX it is given: BEGIN and the statements go
// in one round trip (pgx.Batch.BeginTx, in calls' order; the first time a
// connection sends a statement by name, pgx describes it first), within
// timeout, where BeginReadCommitted and a statement take two. Each
// statement still takes a snapshot of its own as it starts, so a
// statement sees what the ones before it locked.
//
// Each call runs twice: first on a DBTX that records its statement and
// fails it, then, once every statement has been sent, on one that reads
// that statement's results. A call must make exactly one statement, the
// same both times, and keep only what its second run reads: its
// arguments are those of its first run, so they cannot depend on what the
// calls before it read.
//
// BeginBatch returns the transaction and what rolls it back (within
// timeout, and even once ctx has ended), or the first error of BEGIN, a
// call's second run, or the batch: a statement that fails makes the ones
// after it fail too, and the transaction is then rolled back, its
// connection back in pool.
func BeginBatch(ctx context.Context, pool Batcher, timeout time.Duration, calls ...func(db.DBTX) error) (tx pgx.Tx, rollback func(), err error) {
	tx, err = send(ctx, pool, timeout, calls)
	if tx == nil {
		return nil, nil, err
	}
	rollback = func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		defer cancel()
		_ = tx.Rollback(rctx)
	}
	if err != nil {
		rollback()
		return nil, nil, err
	}
	return tx, rollback, nil
}

// send sends BEGIN and the statements of calls in one batch, and returns
// the transaction that began, if any.
func send(ctx context.Context, b Batcher, timeout time.Duration, calls []func(db.DBTX) error) (pgx.Tx, error) {
	qs := make([]*recorder, len(calls))
	var batch pgx.Batch
	batch.BeginTx(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	for i, call := range calls {
		r := &recorder{}
		if err := call(r); !errors.Is(err, errRecorded) {
			if err == nil {
				err = errors.New("it made no statement")
			}
			return nil, fmt.Errorf("dbx.BeginBatch: call %d: %w", i, err)
		}
		if r.n != 1 {
			return nil, fmt.Errorf("dbx.BeginBatch: call %d made %d statements; want 1", i, r.n)
		}
		qs[i] = r
		batch.Queue(r.sql, r.args...)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	br := b.SendBatch(ctx, &batch)
	_, first := br.Exec()
	for i, call := range calls {
		if first != nil {
			break
		}
		rp := &replay{br: br, sql: qs[i].sql}
		first = call(rp)
		if first == nil && !rp.read {
			// The results of the calls after it would be misread.
			first = fmt.Errorf("dbx.BeginBatch: call %d read no result", i)
		}
	}
	if err := br.Close(); first == nil {
		first = err
	}
	return br.Tx(), first
}

// errRecorded fails a statement that a recorder recorded.
var errRecorded = errors.New("dbx.BeginBatch: statement recorded")

// recorder records the statements made through it, and fails them.
type recorder struct {
	sql  string
	args []any
	n    int
}

var _ db.DBTX = (*recorder)(nil)

func (r *recorder) record(sql string, args []any) error {
	r.n++
	r.sql, r.args = sql, args
	for _, a := range args {
		if _, ok := a.(pgx.QueryExecMode); ok {
			// A batch's statements all run in the connection's mode.
			return errors.New("dbx.BeginBatch: a statement of a batch cannot choose its own execution mode")
		}
	}
	return errRecorded
}

func (r *recorder) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, r.record(sql, args)
}

func (r *recorder) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	return nil, r.record(sql, args)
}

func (r *recorder) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	return errRow{r.record(sql, args)}
}

func (r *recorder) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	r.n++
	return 0, errors.New("dbx.BeginBatch: COPY cannot be batched")
}

// errRow is a row whose Scan fails with err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// replay reads, for the statement a call recorded, its results of the
// batch.
type replay struct {
	br   pgx.BatchResults
	sql  string
	read bool
}

var _ db.DBTX = (*replay)(nil)

func (r *replay) check(sql string) error {
	if r.read || sql != r.sql {
		return errors.New("dbx.BeginBatch: a call made another statement when its results were read")
	}
	r.read = true
	return nil
}

func (r *replay) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	if err := r.check(sql); err != nil {
		return pgconn.CommandTag{}, err
	}
	return r.br.Exec()
}

func (r *replay) Query(_ context.Context, sql string, _ ...any) (pgx.Rows, error) {
	if err := r.check(sql); err != nil {
		return nil, err
	}
	return r.br.Query()
}

func (r *replay) QueryRow(_ context.Context, sql string, _ ...any) pgx.Row {
	if err := r.check(sql); err != nil {
		return errRow{err}
	}
	return r.br.QueryRow()
}

func (r *replay) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, errors.New("dbx.BeginBatch: COPY cannot be batched")
}
