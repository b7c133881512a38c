package browser_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/outbox"
	"github.com/outboxgen/outboxgen/outbox/outboxtest"
)

// TestMain runs the tests against $TEST_DATABASE_URL (else what
// outboxtest.Main finds or starts).
func TestMain(m *testing.M) { outboxtest.Main(m) }

// quiet is the logger of the subscribers and the console: their logs
// would drown the test's.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// newOutbox returns a migrated outbox in a schema of the test's own,
// console_browser_ and random hex, dropped when the test ends. The name
// sorts before the schemas other tests make (outboxtest_...), so the
// console's overview, which lists the first outboxes by name, lists it
// however many outboxes the test database holds.
func newOutbox(t *testing.T) *outboxtest.Fixture {
	t.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:])
	return newOutboxIn(t, outboxtest.Connect(t), "console_browser_"+hex.EncodeToString(b[:]))
}

// browserTests is how many of the package's tests run at once: each
// drives a Chromium, serves a console and runs subscribers, so that more
// of them at once starve the machine's two cores and the test database's
// connections, and pages time out for want of either.
const browserTests = 3

var (
	browserSlots = make(chan struct{}, browserTests)
	// browserHeld holds the top-level tests that hold a slot.
	browserHeld   = map[string]bool{}
	browserHeldMu sync.Mutex
)

// admitBrowserTest waits until fewer than browserTests of the package's
// tests run, unless t's top-level test already runs, and gives the slot
// back when t ends.
func admitBrowserTest(t *testing.T) {
	top, _, _ := strings.Cut(t.Name(), "/")
	browserHeldMu.Lock()
	held := browserHeld[top]
	browserHeldMu.Unlock()
	if held {
		return
	}
	browserSlots <- struct{}{}
	browserHeldMu.Lock()
	browserHeld[top] = true
	browserHeldMu.Unlock()
	t.Cleanup(func() {
		browserHeldMu.Lock()
		delete(browserHeld, top)
		browserHeldMu.Unlock()
		<-browserSlots
	})
}

// newOutboxIn returns a migrated outbox in schema on pool, dropping the
// schema when the test ends.
func newOutboxIn(t *testing.T, pool *pgxpool.Pool, schema string) *outboxtest.Fixture {
	t.Helper()
	admitBrowserTest(t)
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	f := &outboxtest.Fixture{Outbox: ob, Pool: pool, Schema: schema}
	t.Logf("%s", f)
	return f
}

// jsonBytes is a codec of raw JSON: the payload is published byte for
// byte (encoding/json would escape <, > and & to \u003c...) with content
// type application/json.
type jsonBytes struct{ outbox.BytesCodec }

func (jsonBytes) ContentType() string { return outbox.ContentTypeJSON }

// publish writes payload to queue with opts and returns the row's id.
func publish(t *testing.T, f *outboxtest.Fixture, codec outbox.Codec[[]byte], queue string, payload []byte, opts *outbox.PublishOpts) int64 {
	t.Helper()
	pub, err := outbox.NewPublisher(f.Outbox, queue, &outbox.PublisherConfig[[]byte]{Codec: codec, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, err := pub.Publish(ctx, f.Pool, payload, opts)
	if err != nil {
		t.Fatalf("publishing to %q: %v", queue, err)
	}
	return id
}

// consumer is a handler whose verdicts a test sets: before acceptAll is
// set it returns what verdict says, after it accepts every message. It
// records the payloads it accepted.
type consumer struct {
	verdict   func(m *outbox.Message[[]byte]) error
	acceptAll atomic.Bool

	mu      sync.Mutex
	handled []string
}

func (c *consumer) handle(_ context.Context, m *outbox.Message[[]byte]) error {
	if !c.acceptAll.Load() && c.verdict != nil {
		if err := c.verdict(m); err != nil {
			return err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handled = append(c.handled, string(m.Payload))
	return nil
}

// accepted reports whether the consumer accepted payload.
func (c *consumer) accepted(payload string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.handled, payload)
}

// subscribe runs a subscriber of queues with c's handler until the test
// ends. A failure is retried never: it dead-letters at once.
func subscribe(t *testing.T, ob *outbox.Outbox, queues []string, c *consumer) {
	t.Helper()
	subscribeAs(t, ob, "", queues, c)
}

// subscribeAs is subscribe with the subscriber's name (its presence
// record's; "" for the default).
func subscribeAs(t *testing.T, ob *outbox.Outbox, name string, queues []string, c *consumer) {
	t.Helper()
	sub, err := outbox.NewSubscriber(ob, queues, c.handle, &outbox.SubscriberConfig[[]byte]{
		Name:             name,
		Workers:          2,
		Retry:            outbox.NoRetry{},
		MinFetchInterval: 20 * time.Millisecond,
		MaxFetchInterval: 250 * time.Millisecond,
		GracefulTimeout:  5 * time.Second,
		Logger:           quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("subscriber of %q: %v", queues, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("subscriber of %q did not stop within 30s", queues)
		}
	})
}

// eventually polls cond until it holds, failing the test when it does not
// within timeout.
func eventually(t *testing.T, what string, timeout time.Duration, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ok, err := cond(ctx)
		cancel()
		if ok && err == nil {
			return
		}
		last = err
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v (last error: %v)", what, timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// deadLetters returns the dead letters f selects.
func deadLetters(t *testing.T, ob *outbox.Outbox, f outbox.DeadLetterFilter) []outbox.DeadLetter {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dls, err := ob.DeadLetters(ctx, f, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return dls
}

// countDeadLetters counts the dead letters f selects.
func countDeadLetters(t *testing.T, ob *outbox.Outbox, f outbox.DeadLetterFilter) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := ob.CountDeadLetters(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitDeadLetters waits until exactly n dead letters exist.
func waitDeadLetters(t *testing.T, ob *outbox.Outbox, n int64) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d dead letters", n), 30*time.Second, func(ctx context.Context) (bool, error) {
		got, err := ob.CountDeadLetters(ctx, outbox.DeadLetterFilter{})
		return got == n, err
	})
}
