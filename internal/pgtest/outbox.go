package pgtest

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/outboxgen/outboxgen"
	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/naming"
)

// Outbox is a test's outbox for the packages below outbox (which cannot
// import it): the shipped migrations, rendered for a table named outbox
// in the test's schema, applied with goose.
type Outbox struct {
	*DB
	Names naming.Names
	// Queries runs the outbox's statements on a connection, a
	// transaction or a pool; Q runs them on the DB's pool.
	Queries func(db.DBTX) *db.Queries
	Q       *db.Queries
}

// NewOutbox creates a fresh schema for tb (see New) and migrates an
// outbox into it.
func NewOutbox(tb testing.TB) *Outbox {
	tb.Helper()
	d := New(tb)
	names := naming.Names{Schema: d.Schema, Table: naming.DefaultTable}
	dir, _, err := names.RenderMigrations(outboxgen.Migrations, outboxgen.MigrationsDir)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	sqlDB := stdlib.OpenDBFromPool(d.Pool)
	defer sqlDB.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, dir)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := p.Up(tb.Context()); err != nil {
		tb.Fatalf("pgtest: migrate: %v", err)
	}
	o := &Outbox{DB: d, Names: names, Queries: naming.Queries(names)}
	o.Q = o.Queries(d.Pool)
	return o
}

// Publish inserts a row of queue and returns its id.
func (o *Outbox) Publish(tb testing.TB, queue string) int64 {
	tb.Helper()
	id, err := o.Q.Publish(tb.Context(), db.PublishParams{Queue: queue, Payload: []byte(`{}`)})
	if err != nil {
		tb.Fatalf("Publish: %v", err)
	}
	return id
}

// IDs runs sql, an INSERT ... RETURNING id with args, on conn (a pool,
// a connection or a transaction) and returns the ids it returned, in
// order.
func IDs(tb testing.TB, conn interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, sql string, args ...any) []int64 {
	tb.Helper()
	rows, err := conn.Query(context.Background(), sql, args...)
	if err != nil {
		tb.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		tb.Fatal(err)
	}
	slices.Sort(ids)
	return ids
}

// RunUntilEnd runs run (a subscriber's Run, say) in a goroutine until tb
// ends, then cancels its context, waits for it and fails tb when it
// returned an error.
func RunUntilEnd(tb testing.TB, run func(ctx context.Context) error) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("run: %v", err)
		}
	})
}
