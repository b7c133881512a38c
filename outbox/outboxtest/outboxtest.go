// Package outboxtest helps the tests of services that use an outbox: a
// test database found or started for the package's tests ([Main]), a
// fresh, migrated outbox per test ([New], on the database [Connect]
// reaches), assertions on what a test published ([RequirePublished],
// [Published]), and a run of the subscriber until the queues are empty,
// retries included ([Drain]).
//
// It uses only the outbox package's public API against a real database;
// there is no fake outbox. A package's tests start with
//
//	func TestMain(m *testing.M) { outboxtest.Main(m) }
//
// and then need nothing set on a machine where PostgreSQL is installed
// (running or not); $TEST_DATABASE_URL picks a database. To fall back to a
// container where Docker runs, a test binary imports the pgcontainer
// package as well; only then does it link testcontainers.
package outboxtest

import (
	"context"
	"io"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/internal/msgtype"
	"github.com/outboxgen/outboxgen/outbox"
)

// Published returns the messages of queue still in the outbox, oldest
// first, decoded with codec (nil for outbox.DefaultCodec). It claims
// nothing. A row that does not decode fails tb, and so does a row whose
// message type a subscriber of T would refuse (see outbox.MessageTyper).
func Published[T any](tb testing.TB, ob *outbox.Outbox, queue string, codec outbox.Codec[T]) []T {
	tb.Helper()
	if codec == nil {
		codec = outbox.DefaultCodec[T]()
	}
	typ, err := msgtype.Of(reflect.TypeFor[T]())
	if err != nil {
		tb.Fatalf("outboxtest: Published(%q): %v", queue, err)
	}
	rows, err := ob.Unprocessed(context.Background(), queue, 100000)
	if err != nil {
		tb.Fatalf("outboxtest: Published(%q): %v", queue, err)
	}
	out := make([]T, 0, len(rows))
	for _, r := range rows {
		if mt := r.Headers[outbox.HeaderMessageType]; !typ.Reads(mt) {
			tb.Fatalf("outboxtest: Published(%q): row %d is of message type %q; a subscriber of %v reads %q",
				queue, r.ID, mt, reflect.TypeFor[T](), typ.Name)
		}
		v, err := codec.Decode(r.Payload)
		if err != nil {
			tb.Fatalf("outboxtest: Published(%q): row %d: %v", queue, r.ID, err)
		}
		out = append(out, v)
	}
	return out
}

// Drain runs a subscriber of queues with handler until none of their rows
// is due, leased, or waiting for a retry that falls due within timeout,
// then stops it, and returns how many deliveries the handler saw. Rows
// scheduled at publish for later stay, and so do rows whose retry falls due
// after timeout, and the rows of an ordering key waiting behind such a
// row. cfg may be nil; Drain polls every few milliseconds
// whatever cfg says, and fails tb if the queues are not drained within
// timeout (0 means 30 s).
func Drain[T any](tb testing.TB, ob *outbox.Outbox, queues []string, handler outbox.Handler[T], cfg *outbox.SubscriberConfig[T], timeout time.Duration) (count int) {
	tb.Helper()
	var c outbox.SubscriberConfig[T]
	if cfg != nil {
		c = *cfg
	}
	c.MinFetchInterval, c.MaxFetchInterval = 5*time.Millisecond, 20*time.Millisecond
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	deliveries := make(chan struct{}, 1024)
	sub, err := outbox.NewSubscriber(ob, queues, func(ctx context.Context, m *outbox.Message[T]) error {
		deliveries <- struct{}{}
		return handler(ctx, m)
	}, &c)
	if err != nil {
		tb.Fatalf("outboxtest: Drain: %v", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	defer func() {
		stop()
		for {
			select {
			case <-deliveries:
				count++
				continue
			case err := <-done:
				if err != nil {
					tb.Errorf("outboxtest: Drain: Run: %v", err)
				}
			}
			break
		}
	}()

	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	deadline := time.Now().Add(timeout)
	for {
		for drained := false; !drained; {
			select {
			case <-deliveries:
				count++
			default:
				drained = true
			}
		}
		// In this order: a row that was idle (scheduled) at the first read
		// and is due or leased at the second still counts in the backlog
		// once it was handled.
		if idle(tb, ob, queues) && !retryDue(tb, ob, queues, time.Until(deadline)) {
			return count
		}
		if time.Now().After(deadline) {
			tb.Fatalf("outboxtest: Drain: %v still hold due, leased or retrying rows after %v", queues, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// idle reports whether queues hold no due or leased row.
func idle(tb testing.TB, ob *outbox.Outbox, queues []string) bool {
	tb.Helper()
	stats, err := ob.QueueStats(context.Background())
	if err != nil {
		tb.Fatalf("outboxtest: %v", err)
	}
	for _, s := range stats {
		for _, q := range queues {
			if s.Queue == q && s.Ready+s.Leased+s.Expired+s.HandOffs > 0 {
				return false
			}
		}
	}
	return true
}

// retryDue reports whether a row of queues waits for a retry due within
// left.
func retryDue(tb testing.TB, ob *outbox.Outbox, queues []string, left time.Duration) bool {
	tb.Helper()
	b, err := ob.RetryBacklog(context.Background(), queues)
	if err != nil {
		tb.Fatalf("outboxtest: %v", err)
	}
	return b.Rows > 0 && b.NextDueIn < left
}
