package outboxtest_test

import (
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/outbox"
	"github.com/outboxgen/outboxgen/outbox/outboxtest"
)

// cliMigrations returns a service's migrations directory as `outboxgen
// migrations -dir migrations -schema schema -table table` leaves it (the
// CLI's golden files) beside the service's own files.
func cliMigrations(t *testing.T, outbox string, own map[string]string) fstest.MapFS {
	t.Helper()
	src := os.DirFS("../../cmd/outboxgen/testdata/migrations/" + outbox)
	names, err := fs.Glob(src, "*.sql")
	if err != nil || len(names) == 0 {
		t.Fatalf("the CLI's golden files for %s: %v", outbox, err)
	}
	out := fstest.MapFS{}
	for _, name := range names {
		b, err := fs.ReadFile(src, name)
		if err != nil {
			t.Fatal(err)
		}
		out["migrations/"+name] = &fstest.MapFile{Data: b}
	}
	for name, text := range own {
		out["migrations/"+name] = &fstest.MapFile{Data: []byte(text)}
	}
	return out
}

// fileVersions returns the versions of the files in fsys's migrations
// directory, in order.
func fileVersions(t *testing.T, fsys fs.FS) []int64 {
	t.Helper()
	names, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	var out []int64
	for _, name := range names {
		v, err := strconv.ParseInt(strings.TrimPrefix(name[:strings.Index(name, "_")], "migrations/"), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

// ordersMigration is a service's own migration.
const ordersMigration = "-- +goose Up\nCREATE TABLE orders (id text PRIMARY KEY);\n\n-- +goose Down\nDROP TABLE orders;\n"

// publicObjects returns the relations and functions in the public schema,
// the schemas beside the fixtures', and the rows of public.outbox.
func publicObjects(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	objects := query[string](t, pool, `
SELECT c.relkind::text || ' ' || c.relname FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace
UNION ALL
SELECT 'f ' || p.proname FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
UNION ALL
SELECT 's ' || n.nspname FROM pg_namespace n WHERE n.nspname NOT LIKE 'pg\_%' AND n.nspname NOT LIKE 'outboxtest\_%'
ORDER BY 1`)
	if slices.Contains(objects, "r outbox") {
		objects = append(objects, query[string](t, pool, "SELECT 'row ' || id || ' ' || convert_from(payload, 'UTF8') FROM public.outbox ORDER BY id")...)
	}
	return objects
}

// The files `outboxgen migrations` writes into a service's migrations
// directory, given to WithMigrations with the service's own, leave public
// alone, whether it already holds an outbox or not: the fixture's outbox
// stands in for them, the service's tables land in the test's schema, and
// so does a second outbox the service has.
func TestWithMigrationsTakesTheFilesOutboxgenMigrationsWrote(t *testing.T) {
	t.Parallel()
	two := cliMigrations(t, "billing.events", map[string]string{"00200_orders.sql": ordersMigration})
	for name, file := range cliMigrations(t, "public.outbox", nil) {
		two[strings.Replace(name, "/000", "/001", 1)] = file
	}
	for name, tt := range map[string]struct {
		existing bool // public.outbox holds a row before the test
		fsys     fs.FS
		cfg      *outbox.Config
		tables   []string // outbox tables the test's schema holds
	}{
		"empty database": {
			fsys:   cliMigrations(t, "public.outbox", map[string]string{"00100_orders.sql": ordersMigration}),
			tables: []string{"outbox", "outbox_dlq"},
		},
		"public.outbox holding a row": {
			existing: true,
			fsys:     cliMigrations(t, "public.outbox", map[string]string{"00100_orders.sql": ordersMigration}),
			tables:   []string{"outbox", "outbox_dlq"},
		},
		"two outboxes": {
			fsys:   two,
			cfg:    &outbox.Config{Table: "events"},
			tables: []string{"events", "events_dlq", "outbox", "outbox_dlq"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool := freshDatabase(t)
			if tt.existing {
				ob, err := outbox.New(pool, nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := ob.Migrate(t.Context()); err != nil {
					t.Fatal(err)
				}
				pub, err := outbox.NewPublisher[Order](ob, "orders", nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := pub.Publish(t.Context(), pool, Order{"production"}, nil); err != nil {
					t.Fatal(err)
				}
			}
			before := publicObjects(t, pool)
			t.Run("test", func(t *testing.T) {
				f := outboxtest.New(t, pool, tt.cfg, outboxtest.WithMigrations(tt.fsys, "migrations"))
				pub, err := outbox.NewPublisher[Order](f.Outbox, "orders", nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := pgx.BeginFunc(t.Context(), f.Pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(t.Context(), "INSERT INTO orders (id) VALUES ('o-1')"); err != nil {
						return err
					}
					_, err := pub.Publish(t.Context(), tx, Order{"o-1"}, nil)
					return err
				}); err != nil {
					t.Fatal(err)
				}
				outboxtest.RequirePublished(t, f.Outbox, "orders", Order{"o-1"})
				var missing []string
				for _, table := range append(slices.Clone(tt.tables), "orders") {
					var there bool
					if err := f.Pool.QueryRow(t.Context(), "SELECT to_regclass($1) IS NOT NULL",
						pgx.Identifier{f.Schema, table}.Sanitize()).Scan(&there); err != nil {
						t.Fatal(err)
					}
					if !there {
						missing = append(missing, table)
					}
				}
				if len(missing) > 0 {
					t.Errorf("the test's schema %s lacks %v", f.Schema, missing)
				}
				versions := query[int64](t, f.Pool, "SELECT version_id FROM "+outboxtest.MigrationsVersionTable+" WHERE version_id > 0 ORDER BY id")
				if diff := cmp.Diff(fileVersions(t, tt.fsys), versions); diff != "" {
					t.Errorf("the service's goose versions (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(before, publicObjects(t, pool)); diff != "" {
					t.Errorf("public and the schemas during the test (-before +during):\n%s", diff)
				}
			})
			if diff := cmp.Diff(before, publicObjects(t, pool)); diff != "" {
				t.Errorf("public and the schemas after the test (-before +after):\n%s", diff)
			}
		})
	}
}

// Outbox files for another table than the fixture's, for one table in two
// schemas, or of a newer release are refused with the fix.
func TestWithMigrationsRefusesOutboxFilesItCannotMap(t *testing.T) {
	t.Parallel()
	pool := freshDatabase(t) // what they would create lands nowhere shared
	events := cliMigrations(t, "billing.events", map[string]string{"00100_orders.sql": ordersMigration})
	both := cliMigrations(t, "billing.events", nil)
	for name, file := range cliMigrations(t, "public.outbox", nil) {
		both[strings.Replace(name, "/000", "/001", 1)] = file
	}
	twice := cliMigrations(t, "public.outbox", nil)
	for name, file := range twice {
		twice[strings.Replace(name, "/000", "/001", 1)] = &fstest.MapFile{Data: []byte(strings.ReplaceAll(
			strings.Replace(string(file.Data), "public.outbox", "billing.outbox", 1), `"public"`, `"billing"`))}
	}
	newer := cliMigrations(t, "public.outbox", map[string]string{
		"00011_public_outbox_later.sql": "-- outboxgen: public.outbox 00099_later.sql\n-- +goose Up\nSELECT 1;\n",
	})
	for name, tt := range map[string]struct {
		cfg  *outbox.Config
		fsys fs.FS
		want string
	}{
		"a newer release's migration":   {nil, newer, `00011_public_outbox_later.sql holds the outbox's migration 00099_later.sql, which this release of outboxgen does not have: upgrade`},
		"another table":                 {nil, events, `the outbox billing.events (00001_billing_events_create.sql), not for the fixture's table "outbox": pass New a cfg with Table: "events"`},
		"one table in two schemas":      {&outbox.Config{Table: "outbox"}, twice, `both public.outbox and billing.outbox`},
		"the fixture's table among two": {&outbox.Config{Table: "nothere"}, both, `billing.events, public.outbox`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			msg := fails(t, func(tb testing.TB) {
				outboxtest.New(tb, pool, tt.cfg, outboxtest.WithMigrations(tt.fsys, "migrations"))
			})
			if !strings.Contains(msg, tt.want) {
				t.Errorf("failed with %q, want %q", msg, tt.want)
			}
		})
	}
}

// freshDatabase returns a pool on a database of the test's own, dropped
// when the test ends, for a test that looks at what lands in public.
func freshDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, _ := pgtest.Database(t, outboxtest.Connect(t), "outboxtest_db")
	return pool
}
