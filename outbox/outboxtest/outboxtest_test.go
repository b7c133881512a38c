package outboxtest_test

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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

func TestPublishedAndDrain(t *testing.T) {
	t.Parallel()
	d, ob, pub := setup(t)
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
