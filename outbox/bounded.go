package outbox

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgen/outboxgen/db"
)

// boundedDBTX runs every statement under a timeout, including reading its
// rows. When the timeout passes, pgx abandons the statement and closes its
// connection, so a socket that stalls (accepts bytes and answers none)
// costs at most the timeout instead of blocking its caller for good.
type boundedDBTX struct {
	inner   db.DBTX
	timeout time.Duration
}

var _ db.DBTX = boundedDBTX{}

func (b boundedDBTX) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.inner.Exec(ctx, sql, args...)
}

func (b boundedDBTX) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	rows, err := b.inner.Query(ctx, sql, args...)
	if err != nil {
		cancel()
		return nil, err
	}
	return &boundedRows{Rows: rows, cancel: cancel}, nil
}

func (b boundedDBTX) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	return boundedRow{row: b.inner.QueryRow(ctx, sql, args...), cancel: cancel}
}

func (b boundedDBTX) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	return b.inner.CopyFrom(ctx, table, cols, src)
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
