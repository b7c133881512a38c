package outbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/internal/pgtest"
)

// started is a running subscriber and the way to stop it.
type started struct {
	t       *testing.T
	cancel  context.CancelFunc
	done    chan error
	stopped bool // stop was called: its caller checks Run's error
}

// start runs sub until the test ends or stop is called. A subscriber the
// test did not stop is stopped when the test ends, and its Run must
// return nil then; a test that expects an error stops it and checks.
func start[T any](t *testing.T, sub *Subscriber[T]) *started {
	t.Helper()
	return startIn(t, context.Background(), sub)
}

// startIn is start with Run's context derived from parent.
func startIn[T any](t *testing.T, parent context.Context, sub *Subscriber[T]) *started {
	t.Helper()
	ctx, cancel := context.WithCancel(parent)
	s := &started{t: t, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- sub.Run(ctx) }()
	t.Cleanup(func() {
		if s.stopped {
			return
		}
		err := s.stop()
		switch {
		case err == nil:
		case t.Failed():
			// Most likely the failure's consequence (a handler it left
			// blocked), not news.
			t.Logf("Run at the test's end: %v", err)
		default:
			t.Errorf("Run at the test's end: %v, want nil", err)
		}
	})
	return s
}

// stop cancels Run, waits for it to return and returns its error, which
// the caller checks; a second stop returns nil.
func (s *started) stop() error {
	s.t.Helper()
	s.stopped = true
	s.cancel()
	select {
	case err, ok := <-s.done:
		if ok {
			close(s.done)
		}
		return err
	case <-time.After(30 * time.Second):
		s.t.Fatal("Run did not return within 30s of its context ending")
		return nil
	}
}

// stopIsBounded stops s, whose writes cannot land, and checks the bounded
// stop: Run returns within graceful plus StopSlack, with an error wrapping
// ErrGracefulTimeout that counts the unwritten outcomes, and their rows are
// left in the table for lease expiry.
func (e *env) stopIsBounded(s *started, graceful time.Duration, unwritten int) {
	e.t.Helper()
	began := time.Now()
	err := s.stop()
	// The bound, plus what a loaded machine's scheduler adds between the
	// engine's last step (its metrics recorder gets at least 10 ms) and
	// this goroutine's wake-up: a run of the PgBouncer leg beside three
	// others took 1.517 s for a bound of 1.5 s.
	const scheduling = 250 * time.Millisecond
	if took := time.Since(began); took > graceful+StopSlack+scheduling {
		e.t.Errorf("Run took %v after its context ended; want at most %v (and %v for the scheduler)", took, graceful+StopSlack, scheduling)
	}
	want := fmt.Sprintf("0 handler(s) abandoned, %d outcome(s) not written", unwritten)
	if !errors.Is(err, ErrGracefulTimeout) || !strings.Contains(err.Error(), want) {
		e.t.Errorf("Run: %v; want ErrGracefulTimeout counting %d unwritten outcomes", err, unwritten)
	}
	if n := e.count("outbox"); n != unwritten {
		e.t.Errorf("%d rows left, want all %d (left to lease expiry)", n, unwritten)
	}
}

// fastConfig polls often so tests do not wait on intervals. Behind a
// pooler that cannot LISTEN, it LISTENs on the server directly.
func fastConfig[T any](rec MetricsRecorder) *SubscriberConfig[T] {
	return &SubscriberConfig[T]{
		Workers: 4, MinFetchInterval: 10 * time.Millisecond, MaxFetchInterval: 100 * time.Millisecond,
		LeaseTTL: 5 * time.Second, GracefulTimeout: 5 * time.Second, Metrics: rec,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		ListenDSN: pgtest.ListenURL(),
	}
}

// eventually polls cond until it holds or a minute passes: the bound is
// for what never happens, and a drain of thousands of rows takes tens of
// seconds on a loaded machine.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventuallyWithin(t, what, time.Minute, cond)
}

// eventuallyWithin is eventually, waiting up to d.
func eventuallyWithin(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// named returns the events called name, in order.
func (r *events) named(name string) []MetricEvent {
	var out []MetricEvent
	for _, ev := range r.all() {
		if ev.Name == name {
			out = append(out, ev)
		}
	}
	return out
}

func TestSubscribersDeliverEveryRowExactlyOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 10000
	pub := newPublisher[int](t, e, "work", nil)
	msgs := make([]int, n)
	for i := range msgs {
		msgs[i] = i
	}
	if _, err := pub.PublishBatch(e.ctx, e.pubPool, msgs, nil); err != nil {
		t.Fatal(err)
	}

	var (
		mu      sync.Mutex
		handled = map[int]int{}
		rec     = &events{}
	)
	for i := range 3 {
		cfg := fastConfig[int](rec)
		cfg.Name = fmt.Sprintf("sub-%d", i)
		cfg.FetchBatchSize = 500 // claims small enough for three subscribers to share 10,000 rows
		startSub(t, e.ob, []string{"work"}, func(_ context.Context, m *Message[int]) error {
			mu.Lock()
			handled[m.Payload]++
			mu.Unlock()
			return nil
		}, cfg)
	}
	// Wait on the handler and the table first: reading the recorder while
	// claims and acknowledgements of 1,000 rows burst in would slow it
	// enough to make the subscribers drop events.
	eventually(t, "every row handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(handled) >= n })
	eventually(t, "an empty outbox", func() bool { return e.count("outbox") == 0 })
	eventually(t, "every row acked", func() bool { return len(rec.named(EventAcked)) >= n })

	mu.Lock()
	defer mu.Unlock()
	if len(handled) != n {
		t.Errorf("handled %d distinct messages, want %d", len(handled), n)
	}
	for v, c := range handled {
		if c != 1 {
			t.Errorf("message %d handled %d times", v, c)
		}
	}
	acked := map[int64]int{}
	subs := map[string]bool{}
	for _, ev := range rec.named(EventAcked) {
		acked[ev.ID]++
		subs[ev.Subscriber] = true
	}
	if len(acked) != n {
		t.Errorf("%d distinct rows acked, want %d", len(acked), n)
	}
	for id, c := range acked {
		if c != 1 {
			t.Errorf("row %d acked %d times", id, c)
		}
	}
	if len(subs) != 3 {
		t.Errorf("acks came from %d subscribers, want 3", len(subs))
	}
	if got := rec.named(EventLeaseLost); len(got) != 0 {
		t.Errorf("lease_lost events: %v", got)
	}
}

func TestGracefulStopDrainsInFlight(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher[string](t, e, "slow", nil)
	if _, err := pub.PublishBatch(e.ctx, e.pubPool, []string{"a", "b"}, nil); err != nil {
		t.Fatal(err)
	}
	var inFlight, finished atomic.Int32
	rec := &events{}
	s := startSub(t, e.ob, []string{"slow"}, func(ctx context.Context, m *Message[string]) error {
		inFlight.Add(1)
		time.Sleep(300 * time.Millisecond)
		finished.Add(1)
		return nil
	}, fastConfig[string](rec))
	eventually(t, "both handlers running", func() bool { return inFlight.Load() == 2 })
	if err := s.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if finished.Load() != 2 {
		t.Errorf("Run returned with %d of 2 handlers finished", finished.Load())
	}
	if n := e.count("outbox"); n != 0 {
		t.Errorf("%d rows left after a graceful stop", n)
	}
	if got := len(rec.named(EventAcked)); got != 2 {
		t.Errorf("%d acked events, want 2", got)
	}
}

func TestWedgedHandlerDoesNotHoldRunAndItsRowSurvives(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher[string](t, e, "wedged", nil)
	id, err := pub.Publish(e.ctx, e.pubPool, "x", nil)
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var (
		entered = make(chan struct{})
		cause   atomic.Value
	)
	rec := &events{}
	cfg := fastConfig[string](rec)
	cfg.GracefulTimeout = 200 * time.Millisecond
	s := startSub(t, e.ob, []string{"wedged"}, func(ctx context.Context, m *Message[string]) error {
		close(entered)
		<-ctx.Done()
		cause.Store(context.Cause(ctx))
		<-release // ignores its cancelled context
		return nil
	}, cfg)
	<-entered
	began := time.Now()
	if err := s.stop(); !errors.Is(err, ErrGracefulTimeout) || !strings.Contains(err.Error(), "1 handler(s) abandoned, 0 outcome(s) not written") {
		t.Fatalf("Run: %v, want ErrGracefulTimeout (one handler abandoned)", err)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("Run took %v to return with a wedged handler", took)
	}
	eventually(t, "the handler's context cancelled", func() bool { return cause.Load() != nil })
	if c := cause.Load().(error); !errors.Is(c, ErrSubscriberStopped) {
		t.Errorf("cause %v, want ErrSubscriberStopped", c)
	}
	row, ok := e.row(id)
	if !ok || !row.AcquiredToken.Valid {
		t.Fatalf("wedged row: present %v, lease %v; want still leased", ok, row.AcquiredToken)
	}
	if got := rec.named(EventDrainTimeout); len(got) != 1 || got[0].Count != 1 {
		t.Errorf("drain_timeout events %v, want one with count 1", got)
	}
	if got := rec.named(EventAcked); len(got) != 0 {
		t.Errorf("wedged row counted as acked: %v", got)
	}
}

func sortedIDs(evs []MetricEvent) []int64 {
	var out []int64
	for _, ev := range evs {
		out = append(out, ev.ID)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

var _ = cmp.Diff

func TestNewSubscriberRejectsBadConfig(t *testing.T) {
	t.Parallel()
	ob, err := New(unreachablePool(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	h := func(context.Context, *Message[string]) error { return nil }
	tests := []struct {
		name   string
		queues []string
		h      Handler[string]
		cfg    *SubscriberConfig[string]
		field  string
	}{
		{"no queues", nil, h, nil, "queues"},
		{"empty queue", []string{""}, h, nil, "queues[0]"},
		{"duplicate queue", []string{"a", "a"}, h, nil, "queues[1]"},
		{"nil handler", []string{"a"}, nil, nil, "handler"},
		{"negative workers", []string{"a"}, h, &SubscriberConfig[string]{Workers: -1}, "SubscriberConfig.Workers"},
		{"min above max interval", []string{"a"}, h, &SubscriberConfig[string]{MinFetchInterval: time.Minute, MaxFetchInterval: time.Second}, "SubscriberConfig.MinFetchInterval"},
		{"heartbeat not below the lease", []string{"a"}, h, &SubscriberConfig[string]{LeaseTTL: time.Second, HeartbeatInterval: time.Second}, "SubscriberConfig.HeartbeatInterval"},
		{"tiny lease", []string{"a"}, h, &SubscriberConfig[string]{LeaseTTL: time.Millisecond}, "SubscriberConfig.LeaseTTL"},
		{"probe timeout above interval", []string{"a"}, h, &SubscriberConfig[string]{ListenProbeInterval: time.Second, ListenProbeTimeout: 2 * time.Second}, "SubscriberConfig.ListenProbeTimeout"},
		{"bad listen DSN", []string{"a"}, h, &SubscriberConfig[string]{ListenDSN: "postgres://a b@/"}, "SubscriberConfig.ListenDSN"},
		{"nil retry pointer", []string{"a"}, h, &SubscriberConfig[string]{Retry: (*ExponentialRetry)(nil)}, "SubscriberConfig.Retry"},
		{"huge batch", []string{"a"}, h, &SubscriberConfig[string]{FetchBatchSize: 10001}, "SubscriberConfig.FetchBatchSize"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewSubscriber(ob, tt.queues, tt.h, tt.cfg)
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tt.field {
				t.Fatalf("NewSubscriber: %v; want a *ConfigError for %s", err, tt.field)
			}
		})
	}
	sub, err := NewSubscriber(ob, []string{"a", "b"}, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := sub.Config() // the defaults filled in
	got := []any{c.Name, c.Workers, c.FetchBatchSize, c.LeaseTTL, c.HeartbeatInterval, c.MaxDeliveries, c.GracefulTimeout}
	want := []any{"a,b", WorkersDefault, FetchBatchSizeDefault, LeaseTTLDefault, LeaseTTLDefault / 3, MaxDeliveriesDefault, GracefulTimeoutDefault}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
}

func TestRunTwiceAtOnceFails(t *testing.T) {
	t.Parallel()
	e := setup(t)
	sub, err := NewSubscriber(e.ob, []string{"q"}, func(context.Context, *Message[string]) error { return nil }, fastConfig[string](nil))
	if err != nil {
		t.Fatal(err)
	}
	s := start(t, sub)
	eventually(t, "Run to start", func() bool { return sub.running.Load() })
	if err := sub.Run(e.ctx); !errors.Is(err, ErrAlreadyRunning) {
		t.Errorf("second Run: %v, want ErrAlreadyRunning", err)
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	// Once stopped it can run again.
	if err := start(t, sub).stop(); err != nil {
		t.Errorf("Run again: %v", err)
	}
}

type slowRecorder struct{ calls atomic.Int32 }

func (r *slowRecorder) Record(MetricEvent) {
	if r.calls.Add(1)%2 == 0 {
		panic("recorder bug")
	}
	time.Sleep(time.Second)
}

func TestSlowOrPanickingRecorderDoesNotStallDelivery(t *testing.T) {
	t.Parallel()
	e := setup(t)
	msgs := make([]int, 300)
	if _, err := newPublisher[int](t, e, "q", nil).PublishBatch(e.ctx, e.pubPool, msgs, nil); err != nil {
		t.Fatal(err)
	}
	rec := &slowRecorder{}
	cfg := fastConfig[int](nil)
	cfg.Metrics = rec
	cfg.GracefulTimeout = time.Second
	s := startSub(t, e.ob, []string{"q"}, func(context.Context, *Message[int]) error { return nil }, cfg)
	// Recording synchronously would take minutes.
	eventually(t, "every row delivered", func() bool { return e.count("outbox") == 0 })
	began := time.Now()
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > 5*time.Second {
		t.Errorf("Run took %v to stop behind a slow recorder", took)
	}
}

func TestStopReleasesClaimedButUnstartedRows(t *testing.T) {
	t.Parallel()
	e := setup(t)
	msgs := make([]int, 50)
	if _, err := newPublisher[int](t, e, "q", nil).PublishBatch(e.ctx, e.pubPool, msgs, nil); err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig[int](nil)
	cfg.Workers, cfg.FetchBatchSize = 1, 20
	cfg.LockWindow = -1 // claims write leases: a locked claim's rows are tested in locked_test.go
	entered := make(chan struct{}, 100)
	proceed := make(chan struct{})
	s := startSub(t, e.ob, []string{"q"}, func(context.Context, *Message[int]) error {
		entered <- struct{}{}
		<-proceed
		return nil
	}, cfg)
	<-entered
	leased := func() (n int) {
		if err := e.db.Pool.QueryRow(e.ctx, "SELECT count(*) FROM outbox WHERE acquired_token IS NOT NULL").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	eventually(t, "a claimed batch", func() bool { return leased() == 20 })
	s.cancel() // stop, while the one handler is still running
	eventually(t, "the unstarted rows released", func() bool { return leased() == 1 })
	var redelivered int
	if err := e.db.Pool.QueryRow(e.ctx, "SELECT count(*) FROM outbox WHERE deliveries_count > 0 AND acquired_token IS NULL").Scan(&redelivered); err != nil {
		t.Fatal(err)
	}
	if redelivered != 0 {
		t.Errorf("%d released rows still count a delivery", redelivered)
	}
	close(proceed)
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	if n := e.count("outbox"); n != 49 {
		t.Errorf("%d rows left, want 49 (one handled)", n)
	}
}

// startSub builds a subscriber and runs it until the test ends.
func startSub[T any](t *testing.T, ob *Outbox, queues []string, h Handler[T], cfg *SubscriberConfig[T]) *started {
	t.Helper()
	sub, err := NewSubscriber(ob, queues, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return start(t, sub)
}
