// Command billing reads the orders the shop publishes, as the billing
// service would: its own generated code of the same contract, under its
// own Go package path and name, and outboxgen bind's subscriber of it, from the outbox of $OUTBOX_SCHEMA in
// $DATABASE_URL. It prints each order it handles as "id total currency
// message-type" and exits once it has handled as many as its first
// argument says.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"example.com/billing/contracts/orderspb"
	"github.com/outboxgen/outboxgen/outbox"
)

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "billing:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	n, err := strconv.Atoi(os.Args[1])
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	ob, err := outbox.New(pool, &outbox.Config{Schema: os.Getenv("OUTBOX_SCHEMA")})
	if err != nil {
		return err
	}
	handled := make(chan string)
	sub, err := orderspb.NewOrderPlacedSubscriber(ob, func(ctx context.Context, m *outbox.Message[*orderspb.OrderPlaced]) error {
		line := fmt.Sprintf("%s %d %s %s", m.Payload.GetOrderId(), m.Payload.GetTotal().GetMinorUnits(), m.Payload.GetTotal().GetCurrency(), m.MessageType())
		select {
		case handled <- line:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, &outbox.SubscriberConfig[*orderspb.OrderPlaced]{Workers: 1}) // outboxgen bind's, with protocodec
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- sub.Run(runCtx) }()
	for range n {
		select {
		case line := <-handled:
			fmt.Println(line)
		case err := <-done:
			return fmt.Errorf("the subscriber stopped: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
