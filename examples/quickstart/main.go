// Command quickstart is the smallest complete outboxgen service: it
// migrates the outbox, places an order (publishing its message in the
// order's transaction), and handles the message until SIGINT or SIGTERM,
// then drains; a second signal ends it at once.
//
//	DATABASE_URL=postgres://postgres@127.0.0.1:5432/test go run ./examples/quickstart
package main

import (
	"context"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/outboxgen/outboxgen/outbox"
)

// readme:begin quickstart
type OrderPlaced struct {
	ID string `json:"id"`
}

func main() {
	// The first SIGINT or SIGTERM ends ctx: Run stops claiming and logs that it
	// waits for running handlers. A second one ends the process at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-signals
		slog.Error("a second signal: exiting without waiting for running handlers", "signal", <-signals)
		os.Exit(1)
	}()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL")) // "": the PG* variables
	if err != nil {
		log.Fatal(err)
	}
	cfg.MaxConns = 20 // the subscriber's 16 handlers and its claims (docs/operations.md#pool-size)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(pool, nil) // the table public.outbox
	if err != nil {
		log.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	sub, err := outbox.NewSubscriber(ob, []string{"orders"}, handleOrderPlaced, nil)
	if err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return placeOrder(ctx, ob, tx, OrderPlaced{ID: "o-1"}) })
	if err != nil {
		log.Fatal(err)
	}
	if err := sub.Run(ctx); err != nil { // until SIGINT or SIGTERM, then drains
		log.Fatal(err)
	}
}

func placeOrder(ctx context.Context, ob *outbox.Outbox, tx pgx.Tx, o OrderPlaced) error {
	pub, err := outbox.NewPublisher[OrderPlaced](ob, "orders", nil) // JSON
	if err != nil {
		return err
	}
	_, err = pub.Publish(ctx, tx, o, nil) // exists if and only if tx commits
	return err
}

func handleOrderPlaced(ctx context.Context, m *outbox.Message[OrderPlaced]) error {
	log.Printf("order %s placed", m.Payload.ID)
	return nil // acknowledged; an error retries it with backoff
}

// readme:end
