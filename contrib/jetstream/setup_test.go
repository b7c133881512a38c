package outboxjs_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	outboxjs "github.com/outboxgen/outboxgen/contrib/jetstream"
	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/outbox"
	"github.com/outboxgen/outboxgen/outbox/outboxtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		// A relay process of the kill test: it runs until it is killed.
		if err := runChild(); err != nil {
			fmt.Fprintln(os.Stderr, "relay child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	pgtest.Main(m)
}

// natsURL is the broker the tests use: $NATS_URL, else 127.0.0.1:4222.
// Without NATS_URL, tests skip when nothing answers there.
func natsURL() string {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// env is one test's outbox, broker connection and stream.
type env struct {
	f  *outboxtest.Fixture
	nc *nats.Conn
	js jetstream.JetStream
	// prefix starts every subject of the test, so tests in parallel
	// never share one.
	prefix string
}

// setup gives the test an outbox of its own and a connection to the
// broker, closed when the test ends.
func setup(t *testing.T) *env {
	t.Helper()
	f := outboxtest.New(t, outboxtest.Connect(t), nil)
	nc, err := nats.Connect(natsURL(), nats.Timeout(2*time.Second))
	switch {
	case err != nil && os.Getenv("NATS_URL") == "":
		// make test needs only Go and PostgreSQL; CI sets NATS_URL, so
		// there a missing broker fails.
		t.Skipf("no NATS server at %s (%v): start one with JetStream (nats-server -a 127.0.0.1 -p 4222 -js) or set NATS_URL to run this test", natsURL(), err)
	case err != nil:
		t.Fatalf("no NATS server at $NATS_URL %s (%v): start one with JetStream, e.g. nats-server -a 127.0.0.1 -p 4222 -js", natsURL(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &env{f: f, nc: nc, js: js, prefix: "outboxjs_" + randomHex(t, 6)}
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// stream creates a stream of the test's own capturing prefix.> with the
// given duplicate window, deleted when the test ends.
func (e *env) stream(t *testing.T, duplicates time.Duration) jetstream.Stream {
	t.Helper()
	return e.streamWith(t, jetstream.StreamConfig{Duplicates: duplicates})
}

// streamWith creates the test's stream with cfg, its name and subjects
// those of stream.
func (e *env) streamWith(t *testing.T, cfg jetstream.StreamConfig) jetstream.Stream {
	t.Helper()
	name := strings.ToUpper(e.prefix)
	cfg.Name, cfg.Subjects, cfg.Storage = name, []string{e.prefix + ".>"}, jetstream.FileStorage
	s, err := e.js.CreateStream(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("delete stream %s: %v", name, err)
		}
	})
	return s
}

// subject is the test's subject mapping: prefix.queue, then the ordering
// key or "none".
func (e *env) subject(m *outbox.Message[[]byte]) (string, error) {
	key := m.OrderingKey
	if key == "" {
		key = "none"
	}
	return e.prefix + "." + m.Queue + "." + key, nil
}

// fastSubscriber polls and retries quickly, and logs nothing.
func fastSubscriber() *outbox.SubscriberConfig[[]byte] {
	return &outbox.SubscriberConfig[[]byte]{
		MinFetchInterval: 5 * time.Millisecond, MaxFetchInterval: 50 * time.Millisecond,
		Retry:  outbox.ConstantRetry{Delay: 50 * time.Millisecond},
		Logger: quiet(),
	}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// run runs relay until the test ends, and fails the test if Run returns
// an error.
// relay returns a relay of the test's queue orders to its prefix's
// subjects, polling fast.
func (e *env) relay(t *testing.T) *outboxjs.Relay {
	t.Helper()
	relay, err := outboxjs.NewRelay(e.f.Outbox, e.nc, []string{"orders"}, &outboxjs.Config{
		Subject: e.subject, Subjects: []string{e.prefix + ".>"}, Subscriber: fastSubscriber(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return relay
}

func run(t *testing.T, relay *outboxjs.Relay) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Relay.Run: %v", err)
		}
	})
}

// waitFor polls cond every few milliseconds until it holds, failing the
// test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitProgress waits until count reaches target, failing when count
// stays the same for stall: a relay that is slow on a loaded machine
// still moves, one that is stuck does not.
func waitProgress(t *testing.T, stall time.Duration, what string, count func() uint64, target uint64) {
	t.Helper()
	last, since := count(), time.Now()
	for last < target {
		time.Sleep(5 * time.Millisecond)
		if n := count(); n != last {
			last, since = n, time.Now()
		} else if time.Since(since) > stall {
			t.Fatalf("%s: %d of %d, and no change for %v", what, last, target, stall)
		}
	}
}

// msgs returns the stream's count of messages.
func msgs(t *testing.T, s jetstream.Stream) uint64 {
	t.Helper()
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// rows counts the rows left in the test's outbox.
func (e *env) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.f.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+pgx.Identifier{e.f.Schema, "outbox"}.Sanitize()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// attempts returns the most failed attempts of a row of the test's
// outbox.
func (e *env) attempts(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.f.Pool.QueryRow(t.Context(), "SELECT coalesce(max(attempts_count), 0) FROM "+pgx.Identifier{e.f.Schema, "outbox"}.Sanitize()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// createdAt returns the creation time of each row of the test's outbox.
func (e *env) createdAt(t *testing.T) map[int64]time.Time {
	t.Helper()
	rs, err := e.f.Pool.Query(t.Context(), "SELECT id, created_at FROM "+pgx.Identifier{e.f.Schema, "outbox"}.Sanitize())
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]time.Time{}
	var id int64
	var at time.Time
	if _, err := pgx.ForEachRow(rs, []any{&id, &at}, func() error { out[id] = at; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// stored returns every message of s in stream order.
func stored(t *testing.T, s jetstream.Stream) []*nats.Msg {
	t.Helper()
	want := msgs(t, s)
	c, err := s.OrderedConsumer(t.Context(), jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []*nats.Msg
	for uint64(len(out)) < want {
		batch, err := c.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := len(out)
		for m := range batch.Messages() {
			out = append(out, &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			t.Fatal(err)
		}
		if len(out) == n {
			t.Fatalf("read %d of the stream's %d messages", len(out), want)
		}
	}
	return out
}
