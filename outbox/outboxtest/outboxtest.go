// Package outboxtest helps the tests of services that use an outbox: a
// test database found or started for the package's tests ([Main]), a
// fresh, migrated outbox per test ([New], on the database [Connect]
// reaches), with a copy of the service's own tables if asked
// ([WithMigrations]), assertions on what a test published, after the
// transaction commits ([RequirePublished], [Published]) or inside it
// ([RequirePublishedTx], [PublishedTx]), and a run of the subscriber until
// the queues are empty, retries included, with a handler ([Drain]) or a
// transactional handler ([DrainTx]).
//
// It drives the outbox through its public API only, against a real
// database; there is no fake outbox. A package's tests start with
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

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/internal/msgtype"
	"github.com/outboxgen/outboxgen/outbox"
)

// Published returns the messages of queue still in the outbox, oldest
// first, decoded with codec (nil for outbox.DefaultCodec). It claims
// nothing. A row that does not decode fails tb, and so does a row whose
// message type a subscriber of T would refuse (see outbox.MessageTyper).
// It reads through ob's pool, so it sees committed rows only; [PublishedTx]
// reads within a transaction.
func Published[T any](tb testing.TB, ob *outbox.Outbox, queue string, codec outbox.Codec[T]) []T {
	tb.Helper()
	return published(tb, "Published", queue, codec, func(ctx context.Context) ([]outbox.PendingMessage, error) {
		return ob.Unprocessed(ctx, queue, publishedMax)
	})
}

// PublishedTx is [Published] read within tx, the transaction under test
// before it commits (or any outbox.DBTX): it sees the rows tx published
// beside those already committed. It reads without locks and writes
// nothing, so tx goes on as before.
func PublishedTx[T any](tb testing.TB, tx outbox.DBTX, ob *outbox.Outbox, queue string, codec outbox.Codec[T]) []T {
	tb.Helper()
	return published(tb, "PublishedTx", queue, codec, func(ctx context.Context) ([]outbox.PendingMessage, error) {
		return ob.UnprocessedTx(ctx, tx, queue, publishedMax)
	})
}

// publishedMax is the most rows Published reads of a queue.
const publishedMax = 100000

// published decodes the rows read returns, as Published describes; name
// is the caller's, for the failures.
func published[T any](tb testing.TB, name, queue string, codec outbox.Codec[T], read func(context.Context) ([]outbox.PendingMessage, error)) []T {
	tb.Helper()
	if codec == nil {
		codec = outbox.DefaultCodec[T]()
	}
	typ, err := msgtype.OfCodec(reflect.TypeFor[T](), codec)
	if err != nil {
		tb.Fatalf("outboxtest: %s(%q): %v", name, queue, err)
	}
	rows, err := read(context.Background())
	if err != nil {
		tb.Fatalf("outboxtest: %s(%q): %v", name, queue, err)
	}
	out := make([]T, 0, len(rows))
	for _, r := range rows {
		if mt := r.Headers[outbox.HeaderMessageType]; !typ.Reads(mt) {
			tb.Fatalf("outboxtest: %s(%q): row %d is of message type %q; a subscriber of %v reads %q",
				name, queue, r.ID, mt, reflect.TypeFor[T](), typ.Name)
		}
		v, err := codec.Decode(r.Payload)
		if err != nil {
			tb.Fatalf("outboxtest: %s(%q): row %d: %v", name, queue, r.ID, err)
		}
		out = append(out, v)
	}
	return out
}

// RequirePublishedTx is [RequirePublished] asserting within tx, the
// transaction under test before it commits (or any outbox.DBTX): it fails
// tb unless queue holds exactly want, the rows tx published included,
// oldest first, decoded with the default codec of T, and prints the
// difference. tx goes on as before; roll it back afterwards, and
// RequirePublished with no messages shows that nothing was published.
func RequirePublishedTx[T any](tb testing.TB, tx outbox.DBTX, ob *outbox.Outbox, queue string, want ...T) {
	tb.Helper()
	requireEqual(tb, queue, want, PublishedTx[T](tb, tx, ob, queue, nil))
}

// requireEqual fails tb with the difference unless queue's messages got
// are want, compared with opts; nil want means none.
func requireEqual[T any](tb testing.TB, queue string, want, got []T, opts ...cmp.Option) {
	tb.Helper()
	if want == nil {
		want = []T{}
	}
	if diff := cmp.Diff(want, got, opts...); diff != "" {
		tb.Fatalf("outboxtest: queue %q (-want +got):\n%s", queue, diff)
	}
}

// Drain runs a subscriber of queues with handler until none of their rows
// is due, leased, or waiting for a retry that falls due within timeout,
// then stops it, and returns how many deliveries the handler saw. Rows
// scheduled at publish for later stay, and so do rows whose retry falls due
// after timeout, and the rows of an ordering key waiting behind such a
// row. cfg may be nil; Drain polls every few milliseconds
// whatever cfg says, and fails tb if the queues are not drained within
// timeout (0 means 30 s), or at once with Run's error if Run returns
// before they are (a subscriber refused its pool's room, say). [DrainTx] does the same for a transactional
// handler.
func Drain[T any](tb testing.TB, ob *outbox.Outbox, queues []string, handler outbox.Handler[T], cfg *outbox.SubscriberConfig[T], timeout time.Duration) (count int) {
	tb.Helper()
	return drain(tb, "Drain", ob, queues, cfg, timeout, func(c *outbox.SubscriberConfig[T], delivered func()) (*outbox.Subscriber[T], error) {
		if handler == nil {
			return outbox.NewSubscriber[T](ob, queues, nil, c) // its error names the handler
		}
		return outbox.NewSubscriber(ob, queues, func(ctx context.Context, m *outbox.Message[T]) error {
			delivered()
			return handler(ctx, m)
		}, c)
	})
}

// DrainTx is [Drain] for a transactional handler: it runs a subscriber
// made by outbox.NewTxSubscriber, so each delivery runs handler in a
// transaction that acknowledges the message when handler returns nil, and
// rolls back handler's writes with the delivery when it fails (see
// outbox.TxHandler). cfg is NewTxSubscriber's: its LockWindow must be 0 or
// negative, and its Workers default to what ob's pool has room for.
func DrainTx[T any](tb testing.TB, ob *outbox.Outbox, queues []string, handler outbox.TxHandler[T], cfg *outbox.SubscriberConfig[T], timeout time.Duration) (count int) {
	tb.Helper()
	return drain(tb, "DrainTx", ob, queues, cfg, timeout, func(c *outbox.SubscriberConfig[T], delivered func()) (*outbox.Subscriber[T], error) {
		if handler == nil {
			return outbox.NewTxSubscriber[T](ob, queues, nil, c) // its error names the handler
		}
		return outbox.NewTxSubscriber(ob, queues, func(ctx context.Context, tx pgx.Tx, m *outbox.Message[T]) error {
			delivered()
			return handler(ctx, tx, m)
		}, c)
	})
}

// drain is Drain and DrainTx: newSub makes the subscriber with the
// configuration to run, its handler calling delivered once a delivery;
// name is the caller's, for the failures.
func drain[T any](tb testing.TB, name string, ob *outbox.Outbox, queues []string, cfg *outbox.SubscriberConfig[T], timeout time.Duration,
	newSub func(c *outbox.SubscriberConfig[T], delivered func()) (*outbox.Subscriber[T], error)) (count int) {
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
	sub, err := newSub(&c, func() { deliveries <- struct{}{} })
	if err != nil {
		tb.Fatalf("outboxtest: %s: %v", name, err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	returnedEarly := false
	defer func() {
		stop()
		for {
			select {
			case <-deliveries:
				count++
				continue
			case err := <-done:
				if err != nil && !returnedEarly {
					tb.Errorf("outboxtest: %s: Run: %v", name, err)
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
			tb.Fatalf("outboxtest: %s: %v still hold due, leased or retrying rows after %v", name, queues, timeout)
		}
		select {
		case err := <-done:
			// Run gave up (refused, or its database failed for good):
			// the backlog will not drain. Put its result back for the
			// deferred stop, which waits for it.
			done <- err
			returnedEarly = true
			tb.Fatalf("outboxtest: %s: Run returned before %v were drained: %v", name, queues, err)
		case <-time.After(5 * time.Millisecond):
		}
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
