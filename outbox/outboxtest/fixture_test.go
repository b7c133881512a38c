package outboxtest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"

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
	// A row an earlier release published, with the package path.
	if _, err := f.Pool.Exec(t.Context(), `INSERT INTO `+pgx.Identifier{f.Schema, f.Outbox.Table()}.Sanitize()+
		` (queue, payload, headers) VALUES ('orders', '{"id": "b"}', '{"message-type": "github.com/acme/shop.Order"}')`); err != nil {
		t.Fatal(err)
	}
	// A copy of Order elsewhere reads them, and so do raw bytes.
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
