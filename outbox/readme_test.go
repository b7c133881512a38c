package outbox_test

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/outbox"
)

// The README's Go blocks are the regions of this file and of a few others
// between "readme:begin NAME" and "readme:end" comments, so that what the
// README shows compiles. TestDocsQuoteCompiledCode, at the module's
// root, checks that the README quotes each region as it is.

func readmeNew(ctx context.Context) (*outbox.Outbox, error) {
	// readme:begin new
	// Size the pool for what runs on it: a subscriber's claims, outcome
	// writes and heartbeats take up to 4 connections, a transactional
	// subscriber's handlers one each on top, and your own handlers and
	// publishers theirs. pgxpool's default is the machine's cores, at least 4.
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL")) // or ?pool_max_conns=20 in the URL
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = max(cfg.MaxConns, 20)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	ob, err := outbox.New(pool, &outbox.Config{Schema: "billing", Table: "outbox"})
	if err != nil {
		return nil, err // *outbox.ConfigError names the field and the rule
	}
	if err := ob.Migrate(ctx); err != nil { // embedded goose migrations, idempotent
		return nil, err
	}
	// readme:end
	return ob, nil
}

func readmePublish(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, orders []OrderCreated) error {
	// readme:begin publish
	pub, err := outbox.NewPublisher[OrderCreated](ob, "orders.created", nil) // JSON by default
	if err != nil {
		return err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }() // does nothing after Commit

	// ... write your business rows with tx ...
	id, err := pub.Publish(ctx, tx, OrderCreated{ID: "o-1", Total: 1999}, &outbox.PublishOpts{
		OrderingKey: "customer-42",
		Delay:       5 * time.Minute, // on the server's clock; or At: t
		TimerID:     "reminder-o-1",  // outbox.ErrTimerExists if one is live
	})
	if err != nil {
		return err // an *outbox.InputError leaves tx usable
	}
	ids, err := pub.PublishBatch(ctx, tx, orders, nil) // one statement, one NOTIFY
	if err != nil {
		return err
	}
	log.Printf("published %d, then %d more", id, len(ids))
	return tx.Commit(ctx) // the messages exist if and only if this commits
	// readme:end
}

func readmeCancel(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox) error {
	// readme:begin cancel
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	cancelled, err := ob.CancelTimer(ctx, tx, "orders.created", "reminder-o-1")
	if err != nil {
		return err
	}
	log.Printf("reminder cancelled: %t", cancelled) // false once a subscriber claimed it
	return tx.Commit(ctx)
	// readme:end
}

func readmeSubscribe(ctx context.Context, ob *outbox.Outbox) error {
	// readme:begin subscribe
	sub, err := outbox.NewSubscriber(ob, []string{"orders.created"},
		func(ctx context.Context, m *outbox.Message[OrderCreated]) error {
			return ship(ctx, m.Payload) // nil acks; an error retries with backoff
		},
		&outbox.SubscriberConfig[OrderCreated]{
			Workers: 16,
			Retry:   &outbox.ExponentialRetry{Initial: time.Second, Multiplier: 2, MaxDelay: 5 * time.Minute, MaxAttempts: 10, Jitter: 0.2},
		})
	if err != nil {
		return err // an *outbox.ConfigError names the field and the rule
	}
	return sub.Run(ctx) // blocks; when ctx ends: stop claiming, drain, return
	// readme:end
}

// newInvoicer is ExampleNewTxSubscriber's subscriber.
func newInvoicer(ob *outbox.Outbox) (*outbox.Subscriber[OrderCreated], error) {
	// readme:begin tx-subscriber
	invoiced, err := outbox.NewPublisher[Invoiced](ob, "invoices.created", nil)
	if err != nil {
		return nil, err
	}
	return outbox.NewTxSubscriber(ob, []string{"orders.created"},
		func(ctx context.Context, tx pgx.Tx, m *outbox.Message[OrderCreated]) error {
			if _, err := tx.Exec(ctx, "INSERT INTO invoices VALUES ($1, $2)", m.Payload.ID, m.Payload.Total); err != nil {
				return err // rolls back; the message is retried
			}
			_, err := invoiced.Publish(ctx, tx, Invoiced{OrderID: m.Payload.ID}, nil)
			return err // nil: the invoice, the follow-up and the acknowledgement commit together
		}, nil)
	// readme:end
}

func ship(context.Context, OrderCreated) error { return nil }

var _ = []any{readmeNew, readmePublish, readmeCancel, readmeSubscribe}
