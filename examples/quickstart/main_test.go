package main

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/outbox/outboxtest"
)

// readme:begin quickstart-test
func TestMain(m *testing.M) { outboxtest.Main(m) } // finds or starts a PostgreSQL

func TestPlaceOrder(t *testing.T) {
	t.Parallel()
	f := outboxtest.New(t, outboxtest.Connect(t), nil) // an outbox of the test's own
	if err := pgx.BeginFunc(t.Context(), f.Pool, func(tx pgx.Tx) error {
		return placeOrder(t.Context(), f.Outbox, tx, OrderPlaced{ID: "o-1"})
	}); err != nil {
		t.Fatal(err)
	}
	outboxtest.RequirePublished(t, f.Outbox, "orders", OrderPlaced{ID: "o-1"})
	if n := outboxtest.Drain(t, f.Outbox, []string{"orders"}, handleOrderPlaced, nil, 0); n != 1 {
		t.Errorf("%d deliveries, want 1", n)
	}
}

// readme:end
