package outbox_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/outbox"
)

// readme:begin order-created

type OrderCreated struct {
	ID    string `json:"id"`
	Total int    `json:"total_cents"`
}

// readme:end

// A service publishes in its own transaction; a subscriber handles the
// message once the transaction commits.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
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

// At least once means a handler may see a message again: after a crash
// between its effect and the acknowledgement, or a lease that ran out.
// Recording each message's id in an inbox table, in the transaction of the
// handler's effect, makes the effect happen once: a second delivery finds
// the id and does nothing.
func ExampleNewSubscriber_inbox() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	defer func() { _, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS example_billing CASCADE") }()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA example_billing;
		CREATE TABLE example_billing.inbox (queue text, message_id bigint, PRIMARY KEY (queue, message_id));
		CREATE TABLE example_billing.invoices (order_id text PRIMARY KEY, cents int NOT NULL)`); err != nil {
		fmt.Println(err)
		return
	}

	invoice := func(ctx context.Context, m *outbox.Message[OrderCreated]) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, "INSERT INTO example_billing.inbox VALUES ($1, $2) ON CONFLICT DO NOTHING", m.Queue, m.ID)
			if err != nil || tag.RowsAffected() == 0 {
				return err // seen before: done already
			}
			_, err = tx.Exec(ctx, "INSERT INTO example_billing.invoices VALUES ($1, $2)", m.Payload.ID, m.Payload.Total)
			return err
		})
	}
	// Pass invoice to outbox.NewSubscriber; here it is called as two
	// deliveries of one message would call it.
	m := &outbox.Message[OrderCreated]{ID: 42, Queue: "orders.created", Payload: OrderCreated{ID: "o-1", Total: 1999}}
	for delivery := 1; delivery <= 2; delivery++ {
		m.Deliveries = delivery
		if err := invoice(ctx, m); err != nil {
			fmt.Println(err)
			return
		}
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM example_billing.invoices").Scan(&n); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("invoices:", n)
	// Output:
	// invoices: 1
}
