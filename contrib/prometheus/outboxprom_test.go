package outboxprom_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	outboxprom "github.com/outboxgen/outboxgen/contrib/prometheus"
	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/outbox"
	"github.com/outboxgen/outboxgen/outbox/outboxtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newOutbox returns a migrated outbox of the test's own.
func newOutbox(t *testing.T) *outboxtest.Fixture {
	t.Helper()
	return outboxtest.New(t, outboxtest.Connect(t), nil)
}

// exec runs sql on f's pool with its outbox's schema first on the
// search_path, so that "outbox" is the fixture's table.
func exec(t *testing.T, f *outboxtest.Fixture, sql string) {
	t.Helper()
	tx, err := f.Pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(t.Context()) }()
	if _, err := tx.Exec(t.Context(), "SET LOCAL search_path = "+pgx.Identifier{f.Schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(t.Context(), sql); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// series returns the value of every sample of family name in reg, by its
// labels written as k=v pairs; a histogram's value is its sample count.
func series(t *testing.T, reg prometheus.Gatherer, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			out[strings.Join(labels, ",")] = value(mf.GetType(), m)
		}
	}
	return out
}

func value(typ dto.MetricType, m *dto.Metric) float64 {
	switch typ {
	case dto.MetricType_COUNTER:
		return m.GetCounter().GetValue()
	case dto.MetricType_GAUGE:
		return m.GetGauge().GetValue()
	case dto.MetricType_HISTOGRAM:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return -1
}

// One message published, failed once and acknowledged on its second
// delivery produces the series of each step.
func TestRecorderCountsAPublishRetryAckCycle(t *testing.T) {
	t.Parallel()
	f := newOutbox(t)
	ob := f.Outbox
	rec := outboxprom.NewRecorder(nil)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(rec)

	pub, err := outbox.NewPublisher[string](ob, "orders", &outbox.PublisherConfig[string]{Metrics: rec})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(t.Context(), f.Pool, "order 1", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(t.Context(), f.Pool, "", &outbox.PublishOpts{OrderingKey: strings.Repeat("k", 1<<20)}); err == nil {
		t.Fatal("a 1 MiB ordering key was published")
	}

	var calls atomic.Int32
	acked := make(chan struct{})
	sub, err := outbox.NewSubscriber(ob, []string{"orders"}, func(context.Context, *outbox.Message[string]) error {
		if calls.Add(1) == 1 {
			return outbox.RetryAfter(errors.New("not yet"), 10*time.Millisecond)
		}
		close(acked)
		return nil
	}, &outbox.SubscriberConfig[string]{
		Name: "billing", Metrics: rec, MinFetchInterval: 5 * time.Millisecond, MaxFetchInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	select {
	case <-acked:
	case <-time.After(30 * time.Second):
		t.Fatal("the retry was not handled")
	}
	// The acknowledgement's event follows its delete; the subscriber's
	// stop flushes both.
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}

	sub1 := "queue=orders,subscriber=billing"
	for name, want := range map[string]map[string]float64{
		"outbox_published_messages_total":  {"queue=orders": 1},
		"outbox_publish_errors_total":      {"error_type=input,queue=orders": 1},
		"outbox_dispatched_messages_total": {sub1: 2},
		"outbox_retried_messages_total":    {sub1: 1},
		"outbox_acked_messages_total":      {sub1: 1},
		"outbox_handler_duration_seconds":  {"outcome=acked," + sub1: 1, "outcome=retried," + sub1: 1},
		"outbox_message_age_seconds":       {sub1: 2},
	} {
		if diff := cmp.Diff(want, series(t, reg, name)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}
	if got := series(t, reg, "outbox_fetched_messages_total")[sub1]; got != 2 {
		t.Errorf("fetched %v messages, want 2 (two claims of one row)", got)
	}
	for _, name := range []string{"outbox_dead_lettered_messages_total", "outbox_lease_lost_total", "outbox_write_refused_total"} {
		if got := series(t, reg, name); len(got) != 0 {
			t.Errorf("%s: %v, want no series", name, got)
		}
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) != 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// Rejected and undecodable messages count as dead letters by reason; only
// the rejected one's handler ran.
func TestRecorderCountsDeadLettersByReason(t *testing.T) {
	t.Parallel()
	f := newOutbox(t)
	ob := f.Outbox
	rec := outboxprom.NewRecorder(&outboxprom.Options{Namespace: "shop"})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(rec)
	pub, err := outbox.NewPublisher[string](ob, "q", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(t.Context(), f.Pool, "reject me", nil); err != nil {
		t.Fatal(err)
	}
	exec(t, f, `INSERT INTO outbox (queue, payload, headers) VALUES ('q', 'x', '{"content-type": "application/x-unknown"}')`)
	sub, err := outbox.NewSubscriber(ob, []string{"q"}, func(context.Context, *outbox.Message[string]) error {
		return outbox.Reject(errors.New("no"))
	}, &outbox.SubscriberConfig[string]{Metrics: rec, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for len(series(t, reg, "shop_dead_lettered_messages_total")) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	want := map[string]float64{
		"queue=q,reason=" + outbox.ReasonRejected + ",subscriber=q":    1,
		"queue=q,reason=" + outbox.ReasonDecodeError + ",subscriber=q": 1,
	}
	if diff := cmp.Diff(want, series(t, reg, "shop_dead_lettered_messages_total")); diff != "" {
		t.Errorf("dead letters (-want +got):\n%s", diff)
	}
	// The handler ran for the rejected row only.
	if diff := cmp.Diff(map[string]float64{"outcome=ended,queue=q,subscriber=q": 1}, series(t, reg, "shop_handler_duration_seconds")); diff != "" {
		t.Errorf("handler durations (-want +got):\n%s", diff)
	}
}

// The queue collector reports what QueueDepths reads, per queue, at each
// scrape, and which counts stopped at the cap.
func TestQueueCollectorReportsEachQueue(t *testing.T) {
	t.Parallel()
	f := newOutbox(t)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(outboxprom.NewQueueCollector(f.Outbox, nil))
	capped := prometheus.NewPedanticRegistry()
	capped.MustRegister(outboxprom.NewQueueCollector(f.Outbox, &outboxprom.QueueOptions{Namespace: "capped", Cap: 2}))
	if got := series(t, reg, "outbox_queue_ready_messages"); len(got) != 0 {
		t.Errorf("an empty outbox: %v", got)
	}
	exec(t, f, `INSERT INTO outbox (queue, payload, next_attempt_at) VALUES
		('a', 'x', now() - interval '90 seconds'), ('a', 'x', now()), ('a', 'x', now()), ('a', 'x', now() + interval '1 hour'),
		('b', 'x', now())`)
	exec(t, f, `INSERT INTO outbox (queue, payload, acquired_at, acquired_token, lease_expires_at) VALUES
		('b', 'x', now(), gen_random_uuid(), now() + interval '1 minute'),
		('b', 'x', now() - interval '2 minutes', gen_random_uuid(), now() - interval '1 minute')`)
	exec(t, f, `INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason)
		VALUES (1, 'c', 'x', 3, 3, now(), 'rejected')`)
	for name, want := range map[string]map[string]float64{
		"outbox_queue_ready_messages":     {"queue=a": 3, "queue=b": 1, "queue=c": 0},
		"outbox_queue_scheduled_messages": {"queue=a": 1, "queue=b": 0, "queue=c": 0},
		"outbox_queue_leased_messages":    {"queue=a": 0, "queue=b": 1, "queue=c": 0},
		"outbox_queue_expired_messages":   {"queue=a": 0, "queue=b": 1, "queue=c": 0},
		"outbox_queue_dead_letters":       {"queue=a": 0, "queue=b": 0, "queue=c": 1},
		"outbox_queue_depth_capped":       {"queue=a": 0, "queue=b": 0, "queue=c": 0},
		"capped_queue_ready_messages":     {"queue=a": 2, "queue=b": 1, "queue=c": 0},
		"capped_queue_depth_capped":       {"queue=a": 1, "queue=b": 0, "queue=c": 0},
	} {
		r := reg
		if strings.HasPrefix(name, "capped_") {
			r = capped
		}
		if diff := cmp.Diff(want, series(t, r, name)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}
	if wait := series(t, reg, "outbox_queue_oldest_ready_wait_seconds")["queue=a"]; wait < 90 || wait > 3600 {
		t.Errorf("queue a's oldest ready message has waited %v s, want about 90", wait)
	}
}

// A scrape whose query fails reports the error instead of values: for a
// missing outbox, the error that names the fix.
func TestQueueCollectorReportsAFailedScrape(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	ob, err := outbox.New(d.Pool, &outbox.Config{Schema: d.Schema}) // an empty schema, never migrated
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	// The scrape's timeout bounds the failed read and the schema check
	// that names the fix after it: on a loaded server, a second ran out
	// before the check did.
	reg.MustRegister(outboxprom.NewQueueCollector(ob, &outboxprom.QueueOptions{Timeout: 10 * time.Second}))
	if _, err := reg.Gather(); err == nil || !strings.Contains(err.Error(), "does not exist: run `outboxgen migrate up`") {
		t.Errorf("scrape of a missing outbox: %v, want the SchemaError", err)
	}
}

// The health collector reports a healthy outbox as such, and a missing one
// as a problem with schema version 0.
func TestHealthCollector(t *testing.T) {
	t.Parallel()
	ob := newOutbox(t).Outbox
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(outboxprom.NewHealthCollector(ob, nil, ""))
	for name, want := range map[string]float64{
		"outbox_health_problems":       0,
		"outbox_health_schema_version": float64(ob.LatestSchemaVersion()),
		"outbox_health_notify_heard":   1,
	} {
		if diff := cmp.Diff(map[string]float64{"": want}, series(t, reg, name)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}

	d := pgtest.New(t)
	missing, err := outbox.New(d.Pool, &outbox.Config{Schema: d.Schema})
	if err != nil {
		t.Fatal(err)
	}
	reg = prometheus.NewPedanticRegistry()
	reg.MustRegister(outboxprom.NewHealthCollector(missing, &outbox.HealthOptions{NotifyTimeout: time.Second}, "shop"))
	if got := series(t, reg, "shop_health_problems")[""]; got != 1 {
		t.Errorf("a missing outbox: %v problems, want 1", got)
	}
	if got := series(t, reg, "shop_health_schema_version")[""]; got != 0 {
		t.Errorf("a missing outbox: schema version %v", got)
	}
}
