// Command orders is the outboxgen demo: a service that writes orders and
// their OrderCreated messages in one transaction each, and a subscriber
// that handles the messages, failing now and then so some retry and a few
// end in the dead-letter table. It ends with one accounting line and the
// commit-to-handler latency.
//
//	DATABASE_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable go run ./examples/orders
//
// Without DATABASE_URL it uses what PostgreSQL's client defaults reach (as
// psql with no arguments), else a throwaway cluster made with the machine's
// PostgreSQL server binaries, else, built with -tags container, a
// testcontainers container where Docker runs. It works in
// the schema outboxgen_demo, which it recreates, and drops it when it ends
// (-keep keeps it). SIGINT or SIGTERM stops it; a second one ends it at
// once.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/outbox"
)

// OrderCreated is the message the service publishes.
type OrderCreated struct {
	ID       int64  `json:"id"`
	Customer string `json:"customer"`
	Total    int    `json:"total_cents"`
}

const (
	schema = "outboxgen_demo"
	queue  = "orders.created"
)

func main() {
	n := flag.Int("orders", 10000, "orders to publish")
	writers := flag.Int("writers", 8, "concurrent publishing transactions")
	keep := flag.Bool("keep", false, "keep the demo's schema when it ends, to look at it (outboxgen inspect)")
	flag.Parse()
	// The first SIGINT or SIGTERM ends ctx: the demo stops publishing and
	// its subscriber waits for running handlers. A second ends it at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	var started stopOnce
	go exitOnSecondSignal(signals, &started)
	if err := run(ctx, *n, *writers, *keep, &started); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

// exitOnSecondSignal says on the first signal that the demo stops, and
// on the second ends the process at once, without waiting for the
// subscriber's handlers or the demo's cleanup; it stops the database the
// demo started, if it did.
func exitOnSecondSignal(signals <-chan os.Signal, started *stopOnce) {
	fmt.Fprintf(os.Stderr, "orders: %v: stopping; publishing ends and the subscriber waits for its running handlers (a second signal exits at once)\n", <-signals)
	fmt.Fprintf(os.Stderr, "orders: %v again: exiting at once; schema %s is left (DROP SCHEMA %s CASCADE drops it)\n", <-signals, schema, schema)
	started.do()
	os.Exit(1)
}

// stopOnce stops what the demo started (a throwaway cluster or a
// container) once, whether the demo ends or a second signal ends it.
type stopOnce struct {
	mu   sync.Mutex
	stop func()
}

// set records stop.
func (s *stopOnce) set(stop func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stop = stop
}

// do calls the stop recorded, the first time only.
func (s *stopOnce) do() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stop != nil {
		s.stop()
		s.stop = nil
	}
}

func run(ctx context.Context, n, writers int, keep bool, started *stopOnce) error {
	dsn, cleanup, err := database(ctx)
	if err != nil {
		return err
	}
	started.set(cleanup)
	defer started.do()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	// A fresh schema for the demo's business table and its outbox.
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		return fmt.Errorf("reset the demo schema: %w", err)
	}
	defer func() {
		if keep {
			fmt.Printf("kept schema %s: outboxgen inspect -schema %s shows it; DROP SCHEMA %s CASCADE drops it\n", schema, schema, schema)
			return
		}
		if _, err := pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			fmt.Fprintf(os.Stderr, "orders: could not drop schema %s (DROP SCHEMA %s CASCADE drops it): %v\n", schema, schema, err)
			return
		}
		fmt.Printf("dropped schema %s (-keep keeps it)\n", schema)
	}()
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	if err != nil {
		return err
	}
	if err := ob.Migrate(ctx); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".orders (id bigint PRIMARY KEY, customer text NOT NULL, total_cents int NOT NULL)"); err != nil {
		return err
	}

	d := &demo{committed: make(map[int64]time.Time, n)}
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 1}))
	sub, err := outbox.NewSubscriber(ob, []string{queue}, d.handle, &outbox.SubscriberConfig[OrderCreated]{
		Workers: 16, FetchBatchSize: 200,
		Retry:   outbox.ConstantRetry{Delay: 200 * time.Millisecond, MaxAttempts: 3},
		Metrics: d, Logger: quiet,
	})
	if err != nil {
		return err
	}
	pub, err := outbox.NewPublisher[OrderCreated](ob, queue, nil)
	if err != nil {
		return err
	}
	subCtx, stopSub := context.WithCancel(ctx)
	defer stopSub()
	subDone := make(chan error, 1)
	go func() { subDone <- sub.Run(subCtx) }()
	start := time.Now()
	progressDone := make(chan struct{})
	go d.progress(progressDone)
	err = d.publish(ctx, pool, pub, n, writers)
	if err == nil {
		fmt.Printf("published %d orders from %d concurrent writers in %v\n", n, writers, time.Since(start).Round(time.Millisecond))
		deadline := time.Now().Add(2 * time.Minute)
		for d.acked.Load()+d.dead.Load() < int64(n) && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
	}
	close(progressDone)
	elapsed := time.Since(start)
	stopSub()
	if runErr := <-subDone; err == nil {
		err = runErr
	}
	if err != nil {
		return err
	}
	var left, inDLQ int64
	if err := pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+schema+".outbox), (SELECT count(*) FROM "+schema+".outbox_dlq)").Scan(&left, &inDLQ); err != nil {
		return err
	}
	lost := int64(n) - d.acked.Load() - inDLQ - left
	fmt.Printf("published %d, acked %d, retried %d, dead-lettered %d, still queued %d, lost %d in %v (%.0f msgs/s)\n",
		n, d.acked.Load(), d.retried.Load(), inDLQ, left, lost, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds())
	fmt.Println(d.latency())
	if lost != 0 || left != 0 {
		return errors.New("messages unaccounted for")
	}
	return nil
}

// demo holds the publishing side's commit times and the outcome counts.
type demo struct {
	mu        sync.Mutex
	committed map[int64]time.Time
	latencies []time.Duration

	published, acked, retried, dead atomic.Int64
}

// progress prints a line every half second until done is closed.
func (d *demo) progress(done chan struct{}) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			fmt.Printf("  published %6d  acked %6d  retried %4d  dead-lettered %3d\n",
				d.published.Load(), d.acked.Load(), d.retried.Load(), d.dead.Load())
		}
	}
}

// publish writes n orders, each with its message, in one transaction per
// order, from writers goroutines.
func (d *demo) publish(ctx context.Context, pool *pgxpool.Pool, pub *outbox.Publisher[OrderCreated], n, writers int) error {
	var next atomic.Int64
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for {
				id := next.Add(1)
				if id > int64(n) {
					return
				}
				o := OrderCreated{ID: id, Customer: fmt.Sprintf("customer-%d", id%97), Total: int(id%500) * 100}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, "INSERT INTO "+schema+".orders (id, customer, total_cents) VALUES ($1, $2, $3)", o.ID, o.Customer, o.Total); err != nil {
						return err
					}
					_, err := pub.Publish(ctx, tx, o, &outbox.PublishOpts{OrderingKey: o.Customer})
					return err
				})
				if err != nil {
					errs <- err
					return
				}
				d.mu.Lock()
				d.committed[id] = time.Now()
				d.mu.Unlock()
				d.published.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// handle fails one order in 20 on its first attempt (it retries), and one
// in 1,000 always (it ends in the dead-letter table).
func (d *demo) handle(_ context.Context, m *outbox.Message[OrderCreated]) error {
	if m.Deliveries == 1 {
		d.mu.Lock()
		if at, ok := d.committed[m.Payload.ID]; ok {
			d.latencies = append(d.latencies, time.Since(at))
		}
		d.mu.Unlock()
	}
	switch {
	case m.Payload.ID%1000 == 0:
		return fmt.Errorf("order %d: payment provider says no", m.Payload.ID)
	case m.Payload.ID%20 == 0 && m.Attempts == 0:
		return fmt.Errorf("order %d: inventory service timed out", m.Payload.ID)
	}
	return nil
}

// Record counts outcomes; it implements outbox.MetricsRecorder.
func (d *demo) Record(ev outbox.MetricEvent) {
	switch ev.Name {
	case outbox.EventAcked:
		d.acked.Add(1)
	case outbox.EventRetried:
		d.retried.Add(1)
	case outbox.EventDeadLettered:
		d.dead.Add(1)
	}
}

func (d *demo) latency() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	l := slices.Clone(d.latencies)
	if len(l) == 0 {
		return "no latencies measured"
	}
	slices.Sort(l)
	p := func(q float64) time.Duration { return l[int(q*float64(len(l)-1))].Round(10 * time.Microsecond) }
	return fmt.Sprintf("commit-to-handler latency (first delivery, while publishing flat out): p50 %v, p90 %v, p99 %v, max %v",
		p(0.50), p(0.90), p(0.99), l[len(l)-1].Round(10*time.Microsecond))
}
