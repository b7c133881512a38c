package outboxtest_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/outbox"
	"github.com/outboxgen/outboxgen/outbox/outboxtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(mainChild) != "" {
		outboxtest.Main(m) // as a user's TestMain, for TestMainStartsAClusterWhenNothingAnswers
	}
	pgtest.Main(m)
}

type Order struct {
	ID string `json:"id"`
}

func setup(t *testing.T) (*pgtest.DB, *outbox.Outbox, *outbox.Publisher[Order]) {
	t.Helper()
	d := pgtest.New(t)
	ob, err := outbox.New(d.Pool, &outbox.Config{Schema: d.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	pub, err := outbox.NewPublisher[Order](ob, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	return d, ob, pub
}

// Published and Drain see the rows a publisher wrote into the outbox
// table, or into its ring.
func TestPublishedAndDrain(t *testing.T) {
	t.Parallel()
	for _, tier := range []outbox.Tier{outbox.TierTable, outbox.TierRing} {
		t.Run(tier.String(), func(t *testing.T) {
			t.Parallel()
			publishedAndDrain(t, tier)
		})
	}
}

func publishedAndDrain(t *testing.T, tier outbox.Tier) {
	d, ob, _ := setup(t)
	pub, err := outbox.NewPublisher(ob, "orders", &outbox.PublisherConfig[Order]{Tier: tier})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.PublishBatch(t.Context(), d.Pool, []Order{{"o-1"}, {"o-2"}, {"o-3"}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(t.Context(), d.Pool, Order{"later"}, &outbox.PublishOpts{Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	want := []Order{{"o-1"}, {"o-2"}, {"o-3"}, {"later"}}
	if diff := cmp.Diff(want, outboxtest.Published[Order](t, ob, "orders", nil)); diff != "" {
		t.Errorf("Published (-want +got):\n%s", diff)
	}

	var failedOnce atomic.Bool
	var handled []string
	n := outboxtest.Drain(t, ob, []string{"orders"}, func(_ context.Context, m *outbox.Message[Order]) error {
		if m.Payload.ID == "o-2" && failedOnce.CompareAndSwap(false, true) {
			return outbox.RetryAfter(errors.New("flaky"), 0)
		}
		handled = append(handled, m.Payload.ID)
		return nil
	}, &outbox.SubscriberConfig[Order]{Workers: 1}, 0)
	if n != 4 {
		t.Errorf("Drain saw %d deliveries, want 4 (o-2 twice)", n)
	}
	if diff := cmp.Diff([]string{"o-1", "o-3", "o-2"}, handled); diff != "" {
		t.Errorf("handled (-want +got):\n%s", diff)
	}
	// Only the scheduled row is left.
	if diff := cmp.Diff([]Order{{"later"}}, outboxtest.Published[Order](t, ob, "orders", nil)); diff != "" {
		t.Errorf("left (-want +got):\n%s", diff)
	}
}

func TestUnprocessedRejectsBadInput(t *testing.T) {
	t.Parallel()
	_, ob, _ := setup(t)
	var in *outbox.InputError
	if _, err := ob.Unprocessed(t.Context(), "orders", 0); !errors.As(err, &in) {
		t.Errorf("limit 0: %v, want an *InputError", err)
	}
	var ce *outbox.ConfigError
	if _, err := ob.Unprocessed(t.Context(), "", 10); !errors.As(err, &ce) {
		t.Errorf("empty queue: %v, want a *ConfigError", err)
	}
}

func TestDrainWaitsForRetriesDueWithinItsTimeout(t *testing.T) {
	t.Parallel()
	d, ob, pub := setup(t)
	if _, err := pub.Publish(t.Context(), d.Pool, Order{"o-1"}, nil); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	start := time.Now()
	n := outboxtest.Drain(t, ob, []string{"orders"}, func(context.Context, *outbox.Message[Order]) error {
		if calls.Add(1) <= 2 {
			return outbox.RetryAfter(errors.New("flaky"), 200*time.Millisecond)
		}
		return nil
	}, nil, 10*time.Second)
	if n != 3 {
		t.Errorf("Drain saw %d deliveries, want 3 (two failures, then the success)", n)
	}
	if took := time.Since(start); took < 400*time.Millisecond {
		t.Errorf("Drain returned after %v, before two 200ms retries could fall due", took)
	}
	if left := outboxtest.Published[Order](t, ob, "orders", nil); len(left) != 0 {
		t.Errorf("left in the outbox: %v", left)
	}
}

func TestDrainReturnsAfterADeadLetter(t *testing.T) {
	t.Parallel()
	d, ob, pub := setup(t)
	if _, err := pub.Publish(t.Context(), d.Pool, Order{"o-1"}, nil); err != nil {
		t.Fatal(err)
	}
	n := outboxtest.Drain(t, ob, []string{"orders"}, func(context.Context, *outbox.Message[Order]) error {
		return errors.New("broken")
	}, &outbox.SubscriberConfig[Order]{Retry: outbox.NoRetry{}}, 10*time.Second)
	if n != 1 {
		t.Errorf("Drain saw %d deliveries, want 1", n)
	}
	dead, err := ob.DeadLetters(t.Context(), outbox.DeadLetterFilter{Queue: "orders"}, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || dead[0].Reason != outbox.ReasonRetryExhausted {
		t.Errorf("dead letters %+v; want the row, retry_exhausted", dead)
	}
}

func TestDrainLeavesRetriesDueAfterItsTimeout(t *testing.T) {
	t.Parallel()
	d, ob, pub := setup(t)
	if _, err := pub.Publish(t.Context(), d.Pool, Order{"o-1"}, nil); err != nil {
		t.Fatal(err)
	}
	n := outboxtest.Drain(t, ob, []string{"orders"}, func(context.Context, *outbox.Message[Order]) error {
		return outbox.RetryAfter(errors.New("later"), time.Hour)
	}, nil, 5*time.Second)
	if n != 1 {
		t.Errorf("Drain saw %d deliveries, want 1", n)
	}
	if diff := cmp.Diff([]Order{{"o-1"}}, outboxtest.Published[Order](t, ob, "orders", nil)); diff != "" {
		t.Errorf("left (-want +got):\n%s", diff)
	}
}

// ship is a transactional handler: it writes the shipment in the
// delivery's transaction, which acknowledges the message.
func ship(ctx context.Context, tx pgx.Tx, m *outbox.Message[Order]) error {
	_, err := tx.Exec(ctx, "INSERT INTO shipments (order_id, attempt) VALUES ($1, $2)", m.Payload.ID, m.Deliveries)
	return err
}

// publishOrders publishes orders in one committed transaction.
func publishOrders(t *testing.T, f *outboxtest.Fixture, orders ...Order) {
	t.Helper()
	pub, err := outbox.NewPublisher[Order](f.Outbox, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.PublishBatch(t.Context(), f.Pool, orders, nil); err != nil {
		t.Fatal(err)
	}
}

// DrainTx runs a transactional handler until the queue is empty: its
// writes committed with the acknowledgements.
func TestDrainTxCommitsTheHandlersWrites(t *testing.T) {
	t.Parallel()
	f := withShipments(t)
	publishOrders(t, f, Order{"o-1"}, Order{"o-2"})
	if n := outboxtest.DrainTx(t, f.Outbox, []string{"orders"}, ship, nil, 0); n != 2 {
		t.Errorf("DrainTx saw %d deliveries, want 2", n)
	}
	if diff := cmp.Diff([]string{"o-1#1", "o-2#1"}, shipments(t, f.Pool)); diff != "" {
		t.Errorf("shipments (-want +got):\n%s", diff)
	}
	outboxtest.RequirePublished[Order](t, f.Outbox, "orders")
}

// A delivery whose handler fails rolls back the handler's writes, and
// DrainTx runs its retry, whose writes commit; one that is never
// acknowledged leaves nothing of its attempts.
func TestDrainTxRollsBackAFailingHandler(t *testing.T) {
	t.Parallel()
	f := withShipments(t)
	publishOrders(t, f, Order{"o-1"}, Order{"broken"})
	n := outboxtest.DrainTx(t, f.Outbox, []string{"orders"}, func(ctx context.Context, tx pgx.Tx, m *outbox.Message[Order]) error {
		if err := ship(ctx, tx, m); err != nil {
			return err
		}
		switch {
		case m.Payload.ID == "broken":
			return errors.New("no carrier")
		case m.Deliveries == 1:
			return outbox.RetryAfter(errors.New("carrier busy"), 10*time.Millisecond)
		}
		return nil
	}, &outbox.SubscriberConfig[Order]{Retry: &outbox.ConstantRetry{Delay: 10 * time.Millisecond, MaxAttempts: 2}}, 0)
	if n != 4 {
		t.Errorf("DrainTx saw %d deliveries, want 4 (each row twice)", n)
	}
	// The first attempt's row would clash with the second's primary key
	// had it not rolled back.
	if diff := cmp.Diff([]string{"o-1#2"}, shipments(t, f.Pool)); diff != "" {
		t.Errorf("shipments (-want +got):\n%s", diff)
	}
	dead, err := f.Outbox.DeadLetters(t.Context(), outbox.DeadLetterFilter{Queue: "orders"}, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || dead[0].Reason != outbox.ReasonRetryExhausted {
		t.Errorf("dead letters %+v; want broken, retry_exhausted", dead)
	}
	outboxtest.RequirePublished[Order](t, f.Outbox, "orders")
}

// DrainTx fails the test on what NewTxSubscriber refuses.
func TestDrainTxRefusesBadInput(t *testing.T) {
	t.Parallel()
	f := outboxtest.New(t, outboxtest.Connect(t), nil)
	for name, tt := range map[string]struct {
		handler outbox.TxHandler[Order]
		cfg     *outbox.SubscriberConfig[Order]
		want    string
	}{
		"a lock window": {ship, &outbox.SubscriberConfig[Order]{LockWindow: time.Second}, "outboxtest: DrainTx: outbox: LockWindow"},
		"no handler":    {nil, nil, "outboxtest: DrainTx: outbox: handler"},
	} {
		msg := fails(t, func(tb testing.TB) {
			outboxtest.DrainTx(tb, f.Outbox, []string{"orders"}, tt.handler, tt.cfg, time.Second)
		})
		if !strings.Contains(msg, tt.want) {
			t.Errorf("%s: failed with %q, want %q", name, msg, tt.want)
		}
	}
	msg := fails(t, func(tb testing.TB) { outboxtest.Drain[Order](tb, f.Outbox, []string{"orders"}, nil, nil, time.Second) })
	if want := "outboxtest: Drain: outbox: handler"; !strings.Contains(msg, want) {
		t.Errorf("Drain without a handler: failed with %q, want %q", msg, want)
	}
}

// RequirePublishedTx and PublishedTx see, within the transaction under
// test, the rows it published beside the committed ones, which
// RequirePublished does not until it commits, and never after it rolls
// back.
func TestRequirePublishedTxAssertsWithinTheTransaction(t *testing.T) {
	t.Parallel()
	f := outboxtest.New(t, outboxtest.Connect(t), nil)
	publishOrders(t, f, Order{"committed"})
	pub, err := outbox.NewPublisher[Order](f.Outbox, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := f.Pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := pub.PublishBatch(t.Context(), tx, []Order{{"a"}, {"b"}}, nil); err != nil {
		t.Fatal(err)
	}

	outboxtest.RequirePublishedTx(t, tx, f.Outbox, "orders", Order{"committed"}, Order{"a"}, Order{"b"})
	outboxtest.RequirePublishedTx[Order](t, tx, f.Outbox, "other")
	if diff := cmp.Diff([]Order{{"committed"}, {"a"}, {"b"}}, outboxtest.PublishedTx[Order](t, tx, f.Outbox, "orders", nil)); diff != "" {
		t.Errorf("PublishedTx (-want +got):\n%s", diff)
	}
	outboxtest.RequirePublished(t, f.Outbox, "orders", Order{"committed"})
	for name, want := range map[string][]Order{
		"committed only": {{"committed"}},
		"another order":  {{"committed"}, {"b"}, {"a"}},
		"one more":       {{"committed"}, {"a"}, {"b"}, {"c"}},
		"none":           nil,
	} {
		msg := fails(t, func(tb testing.TB) { outboxtest.RequirePublishedTx(tb, tx, f.Outbox, "orders", want...) })
		if !strings.Contains(msg, `queue "orders" (-want +got)`) {
			t.Errorf("%s: failed with %q", name, msg)
		}
	}
	// The assertions left the transaction usable.
	if _, err := pub.Publish(t.Context(), tx, Order{"c"}, nil); err != nil {
		t.Fatal(err)
	}
	outboxtest.RequirePublishedTx(t, tx, f.Outbox, "orders", Order{"committed"}, Order{"a"}, Order{"b"}, Order{"c"})

	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	outboxtest.RequirePublished(t, f.Outbox, "orders", Order{"committed"})
	msg := fails(t, func(tb testing.TB) { outboxtest.RequirePublishedTx[Order](tb, tx, f.Outbox, "orders") })
	if !strings.Contains(msg, "outboxtest: PublishedTx") || !strings.Contains(msg, "closed") {
		t.Errorf("on a rolled-back transaction: failed with %q", msg)
	}
}

// A subscriber whose Run returns before the queues are drained (here:
// refused, because another transactional subscriber running on the same
// pool already holds the connections its workers' transactions need)
// fails DrainTx with Run's error at once, rather than after the drain's
// timeout with a backlog that hides why.
func TestDrainTxFailsWithRunsErrorWhenRunReturnsEarly(t *testing.T) {
	t.Parallel()
	f := withShipments(t)
	other, err := outbox.NewPublisher[Order](f.Outbox, "other", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Publish(t.Context(), f.Pool, Order{"held"}, nil); err != nil {
		t.Fatal(err)
	}
	// A subscriber of the pool's whole room (one worker needs every
	// connection of the fixture's pool), held inside its handler.
	workers := int(f.Pool.Config().MaxConns) - 3
	handling, release := make(chan struct{}), make(chan struct{})
	sub, err := outbox.NewTxSubscriber(f.Outbox, []string{"other"}, func(ctx context.Context, tx pgx.Tx, m *outbox.Message[Order]) error {
		close(handling)
		<-release
		return nil
	}, &outbox.SubscriberConfig[Order]{Workers: workers})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- sub.Run(ctx) }()
	t.Cleanup(func() { close(release); stop(); <-ran })
	select {
	case <-handling:
	case err := <-ran:
		t.Fatalf("the subscriber holding the pool: %v", err)
	}

	publishOrders(t, f, Order{"o-1"})
	msg := fails(t, func(tb testing.TB) {
		outboxtest.DrainTx(tb, f.Outbox, []string{"orders"}, ship, &outbox.SubscriberConfig[Order]{Workers: 1}, time.Hour)
	})
	for _, want := range []string{"DrainTx: Run returned before", "MaxConns"} {
		if !strings.Contains(msg, want) {
			t.Errorf("DrainTx failed with %q, want it to say %q", msg, want)
		}
	}
}
