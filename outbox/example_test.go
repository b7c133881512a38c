package outbox_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/outbox"
)

type OrderCreated struct {
	ID    string `json:"id"`
	Total int    `json:"total_cents"`
}

// A service publishes in its own transaction; a subscriber handles the
// message once the transaction commits.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.BaseURL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	defer func() { _, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS example_shop CASCADE") }()

	ob, err := outbox.New(pool, &outbox.Config{Schema: "example_shop"})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := ob.Migrate(ctx); err != nil {
		fmt.Println(err)
		return
	}

	pub, err := outbox.NewPublisher[OrderCreated](ob, "orders.created", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... the order's own rows are written with tx here ...
		_, err := pub.Publish(ctx, tx, OrderCreated{ID: "o-1", Total: 1999}, nil)
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	handled := make(chan struct{})
	sub, err := outbox.NewSubscriber(ob, []string{"orders.created"},
		func(ctx context.Context, m *outbox.Message[OrderCreated]) error {
			fmt.Printf("order %s, %d cents, delivery %d\n", m.Payload.ID, m.Payload.Total, m.Deliveries)
			close(handled)
			return nil
		}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sub.Run(runCtx) }()
	select {
	case <-handled:
	case <-time.After(10 * time.Second):
		fmt.Println("not handled")
	}
	stop()
	fmt.Println("Run:", <-done)
	// Output:
	// order o-1, 1999 cents, delivery 1
	// Run: <nil>
}

// Bad configuration is reported before anything touches the database.
func ExampleConfigError() {
	pool, err := pgxpool.New(context.Background(), "postgres://localhost/app") // connects lazily
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	_, err = outbox.New(pool, &outbox.Config{Table: "Orders"})
	fmt.Println(err)
	// Output:
	// outbox: Config.Table "Orders": must be lower-case letters, digits and underscores, not starting with a digit
}
