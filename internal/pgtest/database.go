package pgtest

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Database creates a database of the test's own through admin (a pool
// whose role may create databases), for a test that looks at what lands
// in public or runs code that migrates public.outbox, and drops it when
// the test ends. It returns a pool on it, closed when the test ends, and
// its connection string, admin's with the database replaced. It skips tb
// when the database cannot be created (a role without CREATEDB).
func Database(tb testing.TB, admin *pgxpool.Pool, prefix string) (*pgxpool.Pool, string) {
	tb.Helper()
	name := prefix + "_" + randomHex(tb, 6)
	ctx := context.Background()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Skipf("pgtest: a database of the test's own: %v", err)
	}
	tb.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			tb.Errorf("pgtest: dropping database %s: %v", name, err)
		}
	})
	dsn := admin.Config().ConnString()
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		dsn = u.String()
	} else {
		dsn = strings.TrimSpace(dsn + " dbname=" + name)
	}
	cfg := admin.Config()
	cfg.ConnConfig.Database = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool, dsn
}
