package shop

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/outbox"
	"github.com/outboxgen/outboxgen/outbox/outboxtest"
)

// readme:begin main

// The service's tests run against $TEST_DATABASE_URL, what psql would
// reach, or a throwaway cluster, whichever comes first.
func TestMain(m *testing.M) { outboxtest.Main(m) }

// readme:end

// readme:begin testing

func TestPlaceOrder(t *testing.T) {
	t.Parallel()
	f := outboxtest.New(t, outboxtest.Connect(t), nil) // or on your own pool
	if err := pgx.BeginFunc(t.Context(), f.Pool, func(tx pgx.Tx) error {
		return PlaceOrder(t.Context(), f.Outbox, tx, OrderPlaced{OrderID: "o-1"})
	}); err != nil {
		t.Fatal(err)
	}
	outboxtest.RequirePublished(t, f.Outbox, QueueOrderPlaced, OrderPlaced{OrderID: "o-1"})
	n := outboxtest.Drain(t, f.Outbox, []string{QueueOrderPlaced}, handleOrderPlaced, nil, 0) // retries run to their end
	if n != 1 {
		t.Errorf("%d deliveries, want 1", n)
	}
}

// readme:end

// handleOrderPlaced stands for the service's handler.
func handleOrderPlaced(ctx context.Context, m *outbox.Message[OrderPlaced]) error { return nil }

// The test of a service, as it uses outboxtest: a fresh outbox per test,
// an assertion on what a transaction published, and a drain through the
// service's own subscriber.
func TestPlaceOrderPublishesAndShippingShipsIt(t *testing.T) {
	t.Parallel()
	f := outboxtest.New(t, outboxtest.Connect(t), nil)
	placed := OrderPlaced{OrderID: "o-1", Customer: "c-7", Cents: 1299, Placed: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}

	// A transaction that rolls back publishes nothing.
	if err := pgx.BeginFunc(t.Context(), f.Pool, func(tx pgx.Tx) error {
		if err := PlaceOrder(t.Context(), f.Outbox, tx, placed); err != nil {
			return err
		}
		return errors.New("payment declined")
	}); err == nil {
		t.Fatal("the transaction committed")
	}
	outboxtest.RequirePublished[OrderPlaced](t, f.Outbox, QueueOrderPlaced)

	if err := pgx.BeginFunc(t.Context(), f.Pool, func(tx pgx.Tx) error {
		return PlaceOrder(t.Context(), f.Outbox, tx, placed)
	}); err != nil {
		t.Fatal(err)
	}
	outboxtest.RequirePublished(t, f.Outbox, QueueOrderPlaced, placed)

	// The first attempt fails; Drain runs the retry to its end.
	var shipped []string
	attempts := 0
	n := outboxtest.Drain(t, f.Outbox, []string{QueueOrderPlaced}, func(ctx context.Context, m *outbox.Message[OrderPlaced]) error {
		attempts++
		if attempts == 1 {
			return outbox.RetryAfter(errors.New("carrier busy"), 10*time.Millisecond)
		}
		shipped = append(shipped, m.Payload.OrderID)
		return nil
	}, nil, 0)
	if n != 2 || len(shipped) != 1 || shipped[0] != "o-1" {
		t.Errorf("%d deliveries shipped %v", n, shipped)
	}
	outboxtest.RequirePublished[OrderPlaced](t, f.Outbox, QueueOrderPlaced)
}

// readme:begin txhandler

// The shop's tables are in each test's schema too (WithMigrations), and
// DrainTx runs the transactional handler: its write commits with the
// acknowledgement.
func TestRecordShipment(t *testing.T) {
	t.Parallel()
	f := outboxtest.New(t, outboxtest.Connect(t), nil, outboxtest.WithMigrations(Migrations, "migrations"))
	if err := pgx.BeginFunc(t.Context(), f.Pool, func(tx pgx.Tx) error {
		return PlaceOrder(t.Context(), f.Outbox, tx, OrderPlaced{OrderID: "o-1", Customer: "c-7"})
	}); err != nil {
		t.Fatal(err)
	}
	n := outboxtest.DrainTx(t, f.Outbox, []string{QueueOrderPlaced}, RecordShipment, nil, 0)
	var customer string
	if err := f.Pool.QueryRow(t.Context(), "SELECT customer FROM shipments WHERE order_id = 'o-1'").Scan(&customer); err != nil || n != 1 {
		t.Fatalf("%d deliveries, customer %q, %v", n, customer, err)
	}
	outboxtest.RequirePublished[OrderPlaced](t, f.Outbox, QueueOrderPlaced) // acknowledged
}

// readme:end

// readme:begin publishedtx

// RequirePublishedTx asserts inside the transaction under test, before it
// commits; after a rollback, nothing was published.
func TestPlaceOrderPublishesInTheTransaction(t *testing.T) {
	t.Parallel()
	f := outboxtest.New(t, outboxtest.Connect(t), nil)
	tx, err := f.Pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(t.Context())
	if err := PlaceOrder(t.Context(), f.Outbox, tx, OrderPlaced{OrderID: "o-1"}); err != nil {
		t.Fatal(err)
	}
	outboxtest.RequirePublishedTx(t, tx, f.Outbox, QueueOrderPlaced, OrderPlaced{OrderID: "o-1"})
	outboxtest.RequirePublished[OrderPlaced](t, f.Outbox, QueueOrderPlaced) // not committed yet
	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	outboxtest.RequirePublished[OrderPlaced](t, f.Outbox, QueueOrderPlaced)
}

// readme:end

// A transactional handler that fails rolls its write back; the retry's
// commits. Shipments is the subscriber the service runs with it.
func TestRecordShipmentRollsBackWithAFailure(t *testing.T) {
	t.Parallel()
	f := outboxtest.New(t, outboxtest.Connect(t), nil, outboxtest.WithMigrations(Migrations, "migrations"))
	if _, err := Shipments(f.Outbox); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(t.Context(), f.Pool, func(tx pgx.Tx) error {
		return PlaceOrder(t.Context(), f.Outbox, tx, OrderPlaced{OrderID: "o-1", Customer: "c-7"})
	}); err != nil {
		t.Fatal(err)
	}
	n := outboxtest.DrainTx(t, f.Outbox, []string{QueueOrderPlaced}, func(ctx context.Context, tx pgx.Tx, m *outbox.Message[OrderPlaced]) error {
		if err := RecordShipment(ctx, tx, m); err != nil {
			return err
		}
		if m.Deliveries == 1 {
			return outbox.RetryAfter(errors.New("label printer jammed"), 10*time.Millisecond)
		}
		return nil
	}, nil, 0)
	var rows int
	if err := f.Pool.QueryRow(t.Context(), "SELECT count(*) FROM shipments").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if n != 2 || rows != 1 {
		t.Errorf("%d deliveries left %d shipments; want 2 and 1 (the first rolled back)", n, rows)
	}
}
