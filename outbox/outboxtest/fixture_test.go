package outboxtest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/msgtype/othertypes"
	"github.com/outboxgen/outboxgen/outbox"
	"github.com/outboxgen/outboxgen/outbox/outboxtest"
)

// fatalTB records a Fatalf and ends the goroutine that called it, as
// testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (f *fatalTB) Helper() {}

// fails runs fn with a fatalTB and returns what it failed with, or "".
func fails(t *testing.T, fn func(tb testing.TB)) string {
	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(tb)
	}()
	<-done
	return tb.msg
}

// schemaExists reports whether schema exists.
func schemaExists(t *testing.T, pool *pgxpool.Pool, schema string) bool {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(context.Background(), "SELECT to_regnamespace($1) IS NOT NULL", `"`+schema+`"`).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// Fixtures on one pool are migrated outboxes that never share rows, and
// each is dropped when its test ends.
func TestNewGivesEachTestItsOwnMigratedOutbox(t *testing.T) {
	t.Parallel()
	pool := outboxtest.Connect(t)
	var schemas []string
	for i := range 2 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			f := outboxtest.New(t, pool, &outbox.Config{Table: "events"})
			schemas = append(schemas, f.Schema)
			if err := f.Outbox.Check(t.Context()); err != nil {
				t.Fatal(err)
			}
			pub, err := outbox.NewPublisher[string](f.Outbox, "q", nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pub.Publish(t.Context(), pool, fmt.Sprint("from ", i), nil); err != nil {
				t.Fatal(err)
			}
			outboxtest.RequirePublished(t, f.Outbox, "q", fmt.Sprint("from ", i))
			if !strings.HasPrefix(f.Schema, "outboxtest_") || f.Outbox.Table() != "events" || !schemaExists(t, pool, f.Schema) {
				t.Errorf("fixture %v", f)
			}
		})
	}
	if len(schemas) != 2 || schemas[0] == schemas[1] {
		t.Fatalf("schemas %v", schemas)
	}
	for _, s := range schemas {
		if schemaExists(t, pool, s) {
			t.Errorf("schema %s outlived its test", s)
		}
	}
}

// RequirePublished fails with the difference when the queue holds other
// messages, in another order, or more.
func TestRequirePublishedShowsTheDifference(t *testing.T) {
	t.Parallel()
	f := outboxtest.New(t, outboxtest.Connect(t), nil)
	type order struct {
		ID    string `json:"id"`
		Total int    `json:"total"`
	}
	pub, err := outbox.NewPublisher[order](f.Outbox, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.PublishBatch(t.Context(), f.Pool, []order{{"a", 1}, {"b", 2}}, nil); err != nil {
		t.Fatal(err)
	}
	outboxtest.RequirePublished(t, f.Outbox, "orders", order{"a", 1}, order{"b", 2})
	outboxtest.RequirePublished[order](t, f.Outbox, "empty")
	for name, want := range map[string][]order{
		"another total": {{"a", 1}, {"b", 3}},
		"another order": {{"b", 2}, {"a", 1}},
		"one missing":   {{"a", 1}},
		"none":          nil,
	} {
		msg := fails(t, func(tb testing.TB) { outboxtest.RequirePublished(tb, f.Outbox, "orders", want...) })
		if !strings.Contains(msg, `queue "orders" (-want +got)`) {
			t.Errorf("%s: failed with %q", name, msg)
		}
	}
}

// Published and RequirePublished read the rows a subscriber of their type
// reads, and fail on another message type instead of decoding it.
func TestPublishedChecksTheMessageType(t *testing.T) {
	t.Parallel()
	f := outboxtest.New(t, outboxtest.Connect(t), nil)
	type Order struct {
		ID string `json:"id"`
	}
	type Shipment struct {
		ID string `json:"id"`
	}
	pub, err := outbox.NewPublisher[Order](f.Outbox, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(t.Context(), f.Pool, Order{"a"}, nil); err != nil {
		t.Fatal(err)
	}
	// A row an earlier release published from othertypes, with its package
	// path.
	if _, err := f.Pool.Exec(t.Context(), `INSERT INTO `+pgx.Identifier{f.Schema, f.Outbox.Table()}.Sanitize()+
		` (queue, payload, headers) VALUES ('orders', '{"id": "b"}', '{"message-type": "github.com/outboxgen/outboxgen/internal/msgtype/othertypes.Order"}')`); err != nil {
		t.Fatal(err)
	}
	// A copy of Order elsewhere reads the first by its bare name, and the
	// second as a type of the package it names; raw bytes read both.
	outboxtest.RequirePublished(t, f.Outbox, "orders", othertypes.Order{ID: "a"}, othertypes.Order{ID: "b"})
	if got := outboxtest.Published[json.RawMessage](t, f.Outbox, "orders", nil); len(got) != 2 {
		t.Errorf("Published[json.RawMessage]: %d rows, want 2", len(got))
	}
	msg := fails(t, func(tb testing.TB) { outboxtest.Published[Shipment](tb, f.Outbox, "orders", nil) })
	if want := `is of message type "Order"; a subscriber of outboxtest_test.Shipment reads "Shipment"`; !strings.Contains(msg, want) {
		t.Errorf("Published[Shipment] of orders failed with %q, want %q", msg, want)
	}
}

// Connect reaches the database TEST_DATABASE_URL names, and says what to
// set when it cannot.
//
// Not parallel: it points TEST_DATABASE_URL elsewhere (t.Setenv).
func TestConnect(t *testing.T) {
	if err := outboxtest.Connect(t).Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Setenv(outboxtest.EnvURL, "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	msg := fails(t, func(tb testing.TB) { outboxtest.Connect(tb) })
	if !strings.Contains(msg, "no test database through $TEST_DATABASE_URL") || !strings.Contains(msg, "set TEST_DATABASE_URL") {
		t.Errorf("failed with %q", msg)
	}
}

// withShipments makes a fixture whose schema holds the shipments table of
// testdata/migrations beside the outbox.
func withShipments(t *testing.T) *outboxtest.Fixture {
	t.Helper()
	return outboxtest.New(t, outboxtest.Connect(t), nil, outboxtest.WithMigrations(os.DirFS("testdata"), "migrations"))
}

// query returns the first column of sql's rows on pool.
func query[V any](t *testing.T, pool *pgxpool.Pool, sql string) []V {
	t.Helper()
	rows, _ := pool.Query(t.Context(), sql) // an error comes back from CollectRows
	out, err := pgx.CollectRows(rows, pgx.RowTo[V])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// shipments returns the order ids and attempts of the shipments table
// unqualified names on pool find, by order id.
func shipments(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	return query[string](t, pool, "SELECT order_id || '#' || attempt FROM shipments ORDER BY order_id")
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
		// The two tests run at once from goroutines, not as parallel
		// subtests: those would queue for a slot behind every other test
		// of the package waiting for one.
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Go(func() {
				t.Run(fmt.Sprint(i), func(t *testing.T) {
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
					if err := f.Pool.QueryRow(t.Context(), "SELECT carrier, to_regclass('shipments') = to_regclass($1) FROM shipments",
						f.Schema+".shipments").Scan(&carrier, &inSchema); err != nil {
						t.Fatal(err)
					}
					if carrier != "post" || !inSchema {
						t.Errorf("carrier %q, in %s: %v; want post (migration 2), true", carrier, f.Schema, inSchema)
					}
					versions := query[int64](t, pool, "SELECT version_id FROM "+f.Schema+"."+outboxtest.MigrationsVersionTable+" WHERE version_id > 0 ORDER BY id")
					if diff := cmp.Diff([]int64{1, 2}, versions); diff != "" {
						t.Errorf("the service's goose versions (-want +got):\n%s", diff)
					}
					// The outbox is migrated, with its own version table.
					if err := f.Outbox.Check(t.Context()); err != nil {
						t.Error(err)
					}
				})
			})
		}
		wg.Wait()
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
