// Command shop publishes the orders its first argument counts, as the
// shop service would: its own generated code of shop.v1.OrderPlaced and
// outboxgen bind's publisher of it, one transaction, into the outbox of
// $OUTBOX_SCHEMA in $DATABASE_URL.
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"

	"example.com/shop/gen/shopv1"
	"github.com/outboxgen/outboxgen/outbox"
)

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "shop:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	n, err := strconv.Atoi(os.Args[1])
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	ob, err := outbox.New(pool, &outbox.Config{Schema: os.Getenv("OUTBOX_SCHEMA")})
	if err != nil {
		return err
	}
	pub, err := shopv1.NewOrderPlacedPublisher(ob, nil) // outboxgen bind's, with protocodec
	if err != nil {
		return err
	}
	orders := make([]*shopv1.OrderPlaced, n)
	for i := range orders {
		orders[i] = &shopv1.OrderPlaced{OrderId: fmt.Sprintf("ord_%d", i), CustomerId: "cus_2930",
			Total: &shopv1.Money{MinorUnits: int64(1000 + i), Currency: "EUR"}}
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := pub.PublishBatch(ctx, tx, orders, nil); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
