package outboxtest_test

import (
	"context"
	"embed"
	"errors"
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

// migrations stands for the service's own goose migrations, embedded.
//
//go:embed testdata/migrations/*.sql
var migrations embed.FS

// A test of a transactional handler: the service's tables in the test's
// schema beside its outbox, and a drain through the handler, whose writes
// commit with the acknowledgements.
func ExampleDrainTx() {
	var t *testing.T // the test's own
	f := outboxtest.New(t, outboxtest.Connect(t), nil, outboxtest.WithMigrations(migrations, "testdata/migrations"))
	if err := pgx.BeginFunc(t.Context(), f.Pool, func(tx pgx.Tx) error {
		return placeOrder(t.Context(), f.Outbox, tx, OrderPlaced{OrderID: "o-1"})
	}); err != nil {
		t.Fatal(err)
	}

	outboxtest.DrainTx(t, f.Outbox, []string{"orders"}, func(ctx context.Context, tx pgx.Tx, m *outbox.Message[OrderPlaced]) error {
		_, err := tx.Exec(ctx, "INSERT INTO shipments (order_id, attempt) VALUES ($1, $2)", m.Payload.OrderID, m.Deliveries)
		return err // an error rolls the insert back, and the retry runs within DrainTx
	}, nil, 0)
	var shipped int
	if err := f.Pool.QueryRow(t.Context(), "SELECT count(*) FROM shipments").Scan(&shipped); err != nil || shipped != 1 {
		t.Errorf("%d shipments, %v", shipped, err)
	}
	outboxtest.RequirePublished[OrderPlaced](t, f.Outbox, "orders")
}

// An assertion inside the transaction under test, before it commits; the
// transaction then rolls back, and nothing was published.
func ExampleRequirePublishedTx() {
	var t *testing.T // the test's own
	f := outboxtest.New(t, outboxtest.Connect(t), nil)
	errRollback := errors.New("roll back")
	err := pgx.BeginFunc(t.Context(), f.Pool, func(tx pgx.Tx) error {
		if err := placeOrder(t.Context(), f.Outbox, tx, OrderPlaced{OrderID: "o-1"}); err != nil {
			return err
		}
		outboxtest.RequirePublishedTx(t, tx, f.Outbox, "orders", OrderPlaced{OrderID: "o-1"})
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	outboxtest.RequirePublished[OrderPlaced](t, f.Outbox, "orders")
}
