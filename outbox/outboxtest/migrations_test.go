package outboxtest_test

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/outbox/outboxtest"
)

// withShipments makes a fixture whose schema holds the shipments table of
// testdata/migrations beside the outbox.
func withShipments(t *testing.T) *outboxtest.Fixture {
	t.Helper()
	return outboxtest.New(t, outboxtest.Connect(t), nil, outboxtest.WithMigrations(os.DirFS("testdata"), "migrations"))
}

// shipments returns the order ids and attempts of the shipments table
// unqualified names on pool find, by order id.
func shipments(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), "SELECT order_id || '#' || attempt FROM shipments ORDER BY order_id")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Tests running in parallel each get the service's tables, migrated to
// the latest version, in their own schema: a row one writes is not in the
// other's table, and the tables go with the schema.
func TestWithMigrationsGivesEachTestItsOwnTables(t *testing.T) {
	t.Parallel()
	pool := outboxtest.Connect(t)
	var (
		mu      sync.Mutex
		schemas []string
	)
	t.Run("group", func(t *testing.T) {
		for i := range 2 {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				f := withShipments(t)
				mu.Lock()
				schemas = append(schemas, f.Schema)
				mu.Unlock()
				order := fmt.Sprint("o-", i)
				if _, err := f.Pool.Exec(t.Context(), "INSERT INTO shipments (order_id, attempt) VALUES ($1, 1)", order); err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff([]string{order + "#1"}, shipments(t, f.Pool)); diff != "" {
					t.Errorf("shipments (-want +got):\n%s", diff)
				}
				var carrier string
				var inSchema bool
				var versions []int64
				if err := f.Pool.QueryRow(t.Context(), "SELECT carrier, to_regclass('shipments') = to_regclass($1) FROM shipments",
					f.Schema+".shipments").Scan(&carrier, &inSchema); err != nil {
					t.Fatal(err)
				}
				if carrier != "post" || !inSchema {
					t.Errorf("carrier %q, in %s: %v; want post (migration 2), true", carrier, f.Schema, inSchema)
				}
				rows, err := pool.Query(t.Context(), "SELECT version_id FROM "+f.Schema+"."+outboxtest.MigrationsVersionTable+" WHERE version_id > 0 ORDER BY id")
				if err != nil {
					t.Fatal(err)
				}
				for rows.Next() {
					var v int64
					if err := rows.Scan(&v); err != nil {
						t.Fatal(err)
					}
					versions = append(versions, v)
				}
				if diff := cmp.Diff([]int64{1, 2}, versions); diff != "" {
					t.Errorf("the service's goose versions (-want +got):\n%s", diff)
				}
				// The outbox is migrated, with its own version table.
				if err := f.Outbox.Check(t.Context()); err != nil {
					t.Error(err)
				}
			})
		}
	})
	if len(schemas) != 2 || schemas[0] == schemas[1] {
		t.Fatalf("schemas %v", schemas)
	}
	for _, s := range schemas {
		if schemaExists(t, pool, s) {
			t.Errorf("schema %s outlived its test", s)
		}
	}
	// Nothing landed where the shared pool's unqualified names go.
	var leaked bool
	if err := pool.QueryRow(t.Context(), "SELECT to_regclass('shipments') IS NOT NULL").Scan(&leaked); err != nil {
		t.Fatal(err)
	}
	if leaked {
		t.Error("a shipments table outside the fixtures' schemas")
	}
}

// Migrations that are missing or fail fail the test, saying where.
func TestWithMigrationsFailsClearly(t *testing.T) {
	t.Parallel()
	pool := outboxtest.Connect(t)
	for name, tt := range map[string]struct {
		opt  outboxtest.Option
		want string
	}{
		"nil fs":          {outboxtest.WithMigrations(nil, "."), "WithMigrations with a nil fs.FS"},
		"empty directory": {outboxtest.WithMigrations(fstest.MapFS{"x/README": {}}, "x"), `no goose migrations (NNN_name.sql) in directory "x"`},
		"bad directory":   {outboxtest.WithMigrations(os.DirFS("testdata"), "../x"), `directory "../x"`},
		"failing":         {outboxtest.WithMigrations(os.DirFS("testdata"), "bad"), `in directory "bad"`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			msg := fails(t, func(tb testing.TB) { outboxtest.New(tb, pool, nil, tt.opt) })
			if !strings.Contains(msg, tt.want) {
				t.Errorf("failed with %q, want %q", msg, tt.want)
			}
		})
	}
}
