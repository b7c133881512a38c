package outboxtest

import (
	"context"
	"errors"
	"io/fs"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/outboxgen/outboxgen/db"
)

// An Option changes what [New] sets up beside the outbox.
type Option func(*options)

// options are what the Options given to New set.
type options struct {
	migrate    bool // WithMigrations was given
	migrations fs.FS
	dir        string
}

// MigrationsVersionTable is the goose version table [WithMigrations] keeps
// the service's migrations in, in the fixture's schema: goose's default
// name, apart from the outbox's own (the outbox table's name and
// "_goose_version").
const MigrationsVersionTable = "goose_db_version"

// WithMigrations makes [New] apply the service's own goose SQL migrations,
// the files in dir of fsys ("." or "" for its root), to the test's schema after
// the outbox's, so each test gets its own copy of the service's tables
// beside its own outbox, dropped with it. The fixture's Pool is then a
// pool of its own on the same database, whose search_path puts the
// fixture's schema first (before the pool's own, or "$user", public):
// the service's unqualified table names, in the test's code, in
// migrations and in a transactional handler's transaction, find the
// test's copies. goose records the versions in MigrationsVersionTable.
// Go migrations (goose.AddMigration) are not run.
//
// The outbox's own migrations, which `outboxgen migrations` wrote into
// the directory beside the service's, are known by their first line
// ("-- outboxgen: <schema>.<table> <migration>") and never run as
// written, since they name their schema: those of the fixture's table
// (cfg.Table of New) run as empty migrations, the fixture's outbox,
// migrated to the latest version, standing in for them; those of the
// service's other outboxes are rendered for the test's schema. goose
// records every version, as in the service, and nothing is created
// outside the test's schema. Files for a table other than the fixture's
// and no file for it, one table in two schemas, or a migration this
// release does not have fail the test with the fix.
//
// The search_path is given when connecting, as a startup parameter; a
// pooler that drops it (PgBouncer's ignore_startup_parameters) fails the
// test saying so. Connect the tests to PostgreSQL itself.
func WithMigrations(fsys fs.FS, dir string) Option {
	return func(o *options) { o.migrate, o.migrations, o.dir = true, fsys, dir }
}

// searchPathPool returns a pool on pool's database whose search_path puts
// schema first, closed when tb ends.
func searchPathPool(tb testing.TB, pool *pgxpool.Pool, schema string) *pgxpool.Pool {
	tb.Helper()
	cfg := pool.Config()
	rest, ok := cfg.ConnConfig.RuntimeParams["search_path"]
	if !ok || rest == "" {
		rest = `"$user", public`
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize() + ", " + rest
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	own, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("outboxtest: WithMigrations: a pool with search_path %s: %v", schema, err)
	}
	tb.Cleanup(own.Close)
	return own
}

// applyMigrations runs goose up with o's migrations on pool, whose
// search_path starts with schema, which exists and holds the fixture's
// outbox table.
func applyMigrations(tb testing.TB, pool *pgxpool.Pool, schema, table string, o options) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, err := db.New(pool).CurrentSchema(ctx)
	if err != nil {
		tb.Fatalf("outboxtest: WithMigrations: %v", err)
	}
	if got != schema {
		tb.Fatalf("outboxtest: WithMigrations: the database dropped the search_path given at connect "+
			"(unqualified names go to schema %q, not %q): a pooler? Connect the tests to PostgreSQL itself", got, schema)
	}
	fsys := o.migrations
	if o.dir != "." && o.dir != "" {
		if fsys, err = fs.Sub(fsys, o.dir); err != nil {
			tb.Fatalf("outboxtest: WithMigrations: directory %q: %v", o.dir, err)
		}
	}
	if fsys, err = mapOutboxFiles(fsys, schema, table); err != nil {
		tb.Fatalf("outboxtest: WithMigrations: directory %q: %v", o.dir, err)
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer func() { _ = sqlDB.Close() }()
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, fsys,
		goose.WithTableName(schema+"."+MigrationsVersionTable),
		goose.WithDisableGlobalRegistry(true))
	if errors.Is(err, goose.ErrNoMigrations) {
		tb.Fatalf("outboxtest: WithMigrations: no goose migrations (NNN_name.sql) in directory %q", o.dir)
	}
	if err != nil {
		tb.Fatalf("outboxtest: WithMigrations: %v", err)
	}
	if _, err := p.Up(ctx); err != nil {
		tb.Fatalf("outboxtest: WithMigrations: in directory %q: %v", o.dir, err)
	}
}
