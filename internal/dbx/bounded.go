// Package dbx holds what every statement the library runs needs, whoever
// runs it: a bound on each statement's time (Bounded), statements planned
// for their parameters at every execution (OneShot), statements sent
// together with the BEGIN of their transaction (BeginBatch), the class of a
// failed statement's error (Classify), error text the database always
// stores (ErrorText), and the backoff between tries (Backoff). It imports
// only pgx and the generated queries' DBTX; every other package may
// import it.
package dbx

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgen/outboxgen/db"
)

// Bounded runs every statement under a timeout, including reading its
// rows. When the timeout passes, pgx abandons the statement and closes its
// connection, so a socket that stalls (accepts bytes and answers none)
// costs at most the timeout instead of blocking its caller for good.
type Bounded struct {
	Inner   db.DBTX
	Timeout time.Duration
}

var _ db.DBTX = Bounded{}

// Exec runs Inner.Exec within Timeout.
func (b Bounded) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	ctx, cancel := context.WithTimeout(ctx, b.Timeout)
	defer cancel()
	return b.Inner.Exec(ctx, sql, args...)
}

// Query runs Inner.Query; Timeout bounds it until its rows are closed.
func (b Bounded) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	ctx, cancel := context.WithTimeout(ctx, b.Timeout)
	rows, err := b.Inner.Query(ctx, sql, args...)
	if err != nil {
		cancel()
		return nil, err
	}
	return &boundedRows{Rows: rows, cancel: cancel}, nil
}

// QueryRow runs Inner.QueryRow; Timeout bounds it until its row is scanned.
func (b Bounded) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	ctx, cancel := context.WithTimeout(ctx, b.Timeout)
	return boundedRow{row: b.Inner.QueryRow(ctx, sql, args...), cancel: cancel}
}

// CopyFrom runs Inner.CopyFrom within Timeout.
func (b Bounded) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, b.Timeout)
	defer cancel()
	return b.Inner.CopyFrom(ctx, table, cols, src)
}

// boundedRows ends its statement's timeout when the rows are closed.
type boundedRows struct {
	pgx.Rows
	cancel context.CancelFunc
}

func (r *boundedRows) Close() {
	r.Rows.Close()
	r.cancel()
}

type boundedRow struct {
	row    pgx.Row
	cancel context.CancelFunc
}

func (r boundedRow) Scan(dest ...any) error {
	defer r.cancel()
	return r.row.Scan(dest...)
}

// Beginner begins transactions: a pgxpool.Pool, a pgx.Conn.
type Beginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// BeginReadCommitted begins, within timeout, a transaction at READ
// COMMITTED whatever the default isolation of b's sessions, and returns it
// with what rolls it back: within timeout, and even once ctx has ended.
func BeginReadCommitted(ctx context.Context, b Beginner, timeout time.Duration) (tx pgx.Tx, rollback func(), err error) {
	bctx, cancel := context.WithTimeout(ctx, timeout)
	tx, err = b.BeginTx(bctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	cancel()
	if err != nil {
		return nil, nil, err
	}
	return tx, func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		defer cancel()
		_ = tx.Rollback(rctx)
	}, nil
}
