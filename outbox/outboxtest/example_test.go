package outboxtest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/outbox"
	"github.com/outboxgen/outboxgen/outbox/outboxtest"
)

type OrderPlaced struct {
	OrderID string `json:"order_id"`
}

// placeOrder stands for the code under test: it publishes in the caller's
// transaction.
func placeOrder(ctx context.Context, ob *outbox.Outbox, tx pgx.Tx, o OrderPlaced) error {
	pub, err := outbox.NewPublisher[OrderPlaced](ob, "orders", nil)
	if err != nil {
		return err
	}
	_, err = pub.Publish(ctx, tx, o, nil)
	return err
}

// A test of a service: a fresh outbox of its own (on $TEST_DATABASE_URL, or
// what psql would reach), the transaction under test, an assertion on what
// it published, and a drain through the service's handler.
func ExampleNew() {
	var t *testing.T // the test's own
	f := outboxtest.New(t, outboxtest.Connect(t), nil)

	if err := pgx.BeginFunc(t.Context(), f.Pool, func(tx pgx.Tx) error {
		return placeOrder(t.Context(), f.Outbox, tx, OrderPlaced{OrderID: "o-1"})
	}); err != nil {
		t.Fatal(err)
	}
	outboxtest.RequirePublished(t, f.Outbox, "orders", OrderPlaced{OrderID: "o-1"})

	n := outboxtest.Drain(t, f.Outbox, []string{"orders"}, func(ctx context.Context, m *outbox.Message[OrderPlaced]) error {
		return nil // the service's handler
	}, nil, 0)
	if n != 1 {
		t.Errorf("%d deliveries", n)
	}
}
