package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/outbox"
)

// exampleOutbox migrates an outbox in schema on the test database and
// returns it with a pool whose search_path is schema, and a function that
// drops the schema.
func exampleOutbox(ctx context.Context, schema string) (*outbox.Outbox, *pgxpool.Pool, func(), error) {
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		return nil, nil, nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	drop := func() {
		_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		pool.Close()
	}
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	if err == nil {
		err = ob.Migrate(ctx)
	}
	if err != nil {
		drop()
		return nil, nil, nil, err
	}
	return ob, pool, drop, nil
}

// Messages can be delayed, named so that they can be cancelled, keyed so
// that a key's messages are handled one at a time in order, and written
// many in one statement.
func ExampleNewPublisher() {
	ctx := context.Background()
	ob, pool, drop, err := exampleOutbox(ctx, "example_publisher")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()

	pub, err := outbox.NewPublisher[OrderCreated](ob, "orders.created", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := pub.Publish(ctx, tx, OrderCreated{ID: "o-1", Total: 1999},
			&outbox.PublishOpts{OrderingKey: "customer-42", Headers: map[string]string{"tenant": "eu"}}); err != nil {
			return err
		}
		if _, err := pub.Publish(ctx, tx, OrderCreated{ID: "o-1"},
			&outbox.PublishOpts{Delay: time.Hour, TimerID: "reminder-o-1"}); err != nil {
			return err
		}
		if _, err := pub.Publish(ctx, tx, OrderCreated{ID: "o-1"},
			&outbox.PublishOpts{TimerID: "reminder-o-1"}); !errors.Is(err, outbox.ErrTimerExists) {
			return fmt.Errorf("a second live timer: %v", err)
		}
		_, err := pub.PublishBatch(ctx, tx, []OrderCreated{{ID: "o-2"}, {ID: "o-3"}}, &outbox.PublishOpts{OrderingKey: "customer-7"})
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	pending, err := ob.Unprocessed(ctx, "orders.created", 10)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, p := range pending {
		var o OrderCreated
		_ = json.Unmarshal(p.Payload, &o)
		fmt.Printf("%s %d cents, tenant %q\n", o.ID, o.Total, p.Headers["tenant"])
	}
	// Output:
	// o-1 1999 cents, tenant "eu"
	// o-1 0 cents, tenant ""
	// o-2 0 cents, tenant ""
	// o-3 0 cents, tenant ""
}

// A handler's error decides what happens next: RetryAfter picks the
// delay, Reject dead-letters the row at once, and any other error is
// retried by the subscriber's RetryStrategy.
func ExampleRetryAfter() {
	errRateLimited := errors.New("carrier: rate limited")
	errNoSuchAddress := errors.New("carrier: no such address")
	handle := func(ctx context.Context, m *outbox.Message[OrderCreated]) error {
		switch err := ship(ctx, m.Payload); {
		case errors.Is(err, errRateLimited):
			return outbox.RetryAfter(err, 30*time.Second)
		case errors.Is(err, errNoSuchAddress):
			return outbox.Reject(err) // to <table>_dlq with reason rejected
		default:
			return err // nil acks; an error retries with backoff
		}
	}
	_ = handle // pass it to outbox.NewSubscriber
}

// A service that leaves migrations to its deployment checks the schema at
// start, and fails with the fix when it is missing or behind.
func ExampleOutbox_Check() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	ob, err := outbox.New(pool, &outbox.Config{Schema: "example_never_migrated"})
	if err != nil {
		fmt.Println(err)
		return
	}
	err = ob.Check(ctx)
	var se *outbox.SchemaError
	fmt.Println(errors.As(err, &se), se.Version, se.Want == ob.LatestSchemaVersion())
	// Output:
	// true 0 true
}

// Health makes a readiness endpoint: 503 with the problems (each names its
// fix) when the outbox is missing, behind, unheard or holding back vacuum.
func ExampleOutbox_Health() {
	pool, err := pgxpool.New(context.Background(), "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	http.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		h, err := ob.Health(ctx, &outbox.HealthOptions{ListenDSN: "postgres://db-direct/app"})
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if len(h.Problems) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(h)
	})
	log.Fatal(http.ListenAndServe(":8080", nil))
}

// Migrations gives the goose files of an outbox for a repository's own
// migration tool, rendered for its schema and table (the outboxgen
// command's migrations writes them).
func ExampleMigrations() {
	files, err := outbox.Migrations(&outbox.Config{Schema: "billing", Table: "events"})
	if err != nil {
		fmt.Println(err)
		return
	}
	names, err := fs.Glob(files, "*.sql")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(names[0])
	fmt.Println(len(names) > 1)
	// Output:
	// 00001_create_outbox.sql
	// true
}

// Rows that failed for good wait in the dead-letter table with their
// reason; after the fix, replay them into the outbox.
func ExampleOutbox_ReplayDeadLetters() {
	ctx := context.Background()
	ob, _, drop, err := exampleOutbox(ctx, "example_replay")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()

	dead, err := ob.DeadLetters(ctx, outbox.DeadLetterFilter{Queue: "orders.created", Reason: outbox.ReasonDecodeError}, 0, 100)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("dead letters:", len(dead))
	res, err := ob.ReplayDeadLetters(ctx, outbox.DeadLetterFilter{Queue: "orders.created"}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("replayed:", res.Replayed)
	// Output:
	// dead letters: 0
	// replayed: 0
}

type Invoiced struct {
	OrderID string `json:"order_id"`
}

// A transactional handler's writes, the messages it publishes and the
// acknowledgement of its message commit together: the effect happens
// exactly once in the database, though the message may be delivered again.
func ExampleNewTxSubscriber() {
	ctx := context.Background()
	ob, pool, drop, err := exampleOutbox(ctx, "example_tx")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()
	if _, err := pool.Exec(ctx, `CREATE TABLE invoices (order_id text PRIMARY KEY, cents int NOT NULL)`); err != nil {
		fmt.Println(err)
		return
	}
	orders, err := outbox.NewPublisher[OrderCreated](ob, "orders.created", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := orders.Publish(ctx, pool, OrderCreated{ID: "o-1", Total: 1999}, nil); err != nil {
		fmt.Println(err)
		return
	}

	sub, err := newInvoicer(ob)
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sub.Run(runCtx) }()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if left, err := ob.Unprocessed(ctx, "orders.created", 1); err == nil && len(left) == 0 {
			break
		}
	}
	stop()
	fmt.Println("Run:", <-done)
	var cents int
	if err := pool.QueryRow(ctx, "SELECT cents FROM invoices WHERE order_id = 'o-1'").Scan(&cents); err != nil {
		fmt.Println(err)
		return
	}
	follow, err := ob.Unprocessed(ctx, "invoices.created", 10)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("invoice o-1: %d cents; follow-ups: %d\n", cents, len(follow))
	// Output:
	// Run: <nil>
	// invoice o-1: 1999 cents; follow-ups: 1
}

// A subscriber whose pool goes through PgBouncer in transaction mode,
// where LISTEN never hears, listens on a direct connection to the server
// (docs/poolers.md).
func ExampleSubscriberConfig_listenDSN() {
	type Order struct{ ID string }
	var ob *outbox.Outbox // on a pool through PgBouncer
	queues := []string{"orders"}
	handle := func(ctx context.Context, m *outbox.Message[Order]) error { return nil }
	// readme:begin listen-dsn
	sub, err := outbox.NewSubscriber(ob, queues, handle, &outbox.SubscriberConfig[Order]{
		ListenDSN: "postgres://app@db:5432/app", // the server itself, not PgBouncer
	})
	// readme:end
	if err != nil {
		log.Print(err)
		return
	}
	_ = sub
}
