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
// reach, a throwaway cluster or a container, whichever comes first.
func TestMain(m *testing.M) { outboxtest.Main(m) }

// readme:end

// readme:begin testing

func TestPlaceOrder(t *testing.T) {
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
