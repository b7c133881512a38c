package dbx

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgen/outboxgen/db"
)

// OneShot runs every statement of Inner as the extended protocol's
// unnamed statement (pgx.QueryExecModeExec), which PostgreSQL plans for
// its parameters at every execution (unless plan_cache_mode is
// force_generic_plan): a statement on a partitioned table then locks only
// the partitions its parameters leave, where a cached generic plan locks
// every partition, for as long as its transaction runs.
type OneShot struct {
	Inner db.DBTX
}

var _ db.DBTX = OneShot{}

// Exec runs Inner.Exec as a one-shot statement.
func (o OneShot) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return o.Inner.Exec(ctx, sql, oneShot(args)...)
}

// Query runs Inner.Query as a one-shot statement.
func (o OneShot) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return o.Inner.Query(ctx, sql, oneShot(args)...)
}

// QueryRow runs Inner.QueryRow as a one-shot statement.
func (o OneShot) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return o.Inner.QueryRow(ctx, sql, oneShot(args)...)
}

func oneShot(args []any) []any {
	return append([]any{pgx.QueryExecModeExec}, args...)
}

// CopyFrom runs Inner.CopyFrom (COPY plans nothing).
func (o OneShot) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return o.Inner.CopyFrom(ctx, table, columns, src)
}
