package outboxotel_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	outboxotel "github.com/outboxgen/outboxgen/contrib/otel"
	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/outbox"
	"github.com/outboxgen/outboxgen/outbox/outboxtest"
)

func TestMain(m *testing.M) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	pgtest.Main(m)
}

type order struct {
	ID string `json:"id"`
}

// publishInSpan publishes order o-1 to queue orders in a span "place
// order" of tp, through a publisher that carries the trace in the headers
// and records to rec, which it returns.
func publishInSpan(t *testing.T, f *outboxtest.Fixture, tp *sdktrace.TracerProvider, rec outbox.MetricsRecorder) *outbox.Publisher[order] {
	t.Helper()
	pub, err := outbox.NewPublisher(f.Outbox, "orders", &outbox.PublisherConfig[order]{HeadersFrom: outboxotel.HeadersFrom, Metrics: rec})
	if err != nil {
		t.Fatal(err)
	}
	ctx, publish := tp.Tracer("shop").Start(t.Context(), "place order")
	defer publish.End()
	if _, err := pub.Publish(ctx, f.Pool, order{ID: "o-1"}, nil); err != nil {
		t.Fatal(err)
	}
	return pub
}

// eventNames returns the names of s's events, in order.
func eventNames(s sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, e := range s.Events() {
		out = append(out, e.Name)
	}
	return out
}

// sums returns each counter's total and each histogram's count, by
// instrument name, over every attribute set.
func sums(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[m.Name] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[m.Name] += int64(p.Count)
				}
			}
		}
	}
	return out
}

// One message published in a span, failed once and handled on its second
// delivery: one trace holds the publishing span and a consumer span per
// delivery, children of it, the first with its error; the metrics count
// each step.
func TestOneTraceSpansPublishAndEveryDelivery(t *testing.T) {
	t.Parallel()
	f := outboxtest.New(t, outboxtest.Connect(t), nil)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	rec, err := outboxotel.NewRecorder(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}

	publishInSpan(t, f, tp, rec)

	attempts := 0
	handle := func(ctx context.Context, m *outbox.Message[order]) error {
		attempts++
		if attempts == 1 {
			return outbox.RetryAfter(errors.New("carrier busy"), 10*time.Millisecond)
		}
		return nil
	}
	cfg := &outbox.SubscriberConfig[order]{Name: "shipping", Metrics: rec, Observer: outboxotel.NewObserver(&outboxotel.Options{TracerProvider: tp})}
	if n := outboxtest.Drain(t, f.Outbox, []string{"orders"}, handle, cfg, 0); n != 2 {
		t.Fatalf("%d deliveries, want 2", n)
	}

	ended := spans.Ended()
	if len(ended) != 3 {
		t.Fatalf("%d spans, want 3", len(ended))
	}
	parent := ended[0].SpanContext()
	type summary struct {
		Name, Queue  string
		Deliveries   int64
		Status       codes.Code
		Events       []string
		ChildOfOrder bool
	}
	var got []summary
	for _, s := range ended[1:] {
		attrs := map[string]any{}
		for _, kv := range s.Attributes() {
			attrs[string(kv.Key)] = kv.Value.AsInterface()
		}
		got = append(got, summary{
			Name: s.Name(), Queue: attrs["messaging.destination.name"].(string), Deliveries: attrs["messaging.outboxgen.deliveries"].(int64),
			Status: s.Status().Code, Events: eventNames(s),
			ChildOfOrder: s.Parent().SpanID() == parent.SpanID() && s.SpanContext().TraceID() == parent.TraceID(),
		})
	}
	want := []summary{
		{Name: "process orders", Queue: "orders", Deliveries: 1, Status: codes.Error, Events: []string{"outbox.retry_scheduled", "exception"}, ChildOfOrder: true},
		{Name: "process orders", Queue: "orders", Deliveries: 2, Status: codes.Unset, ChildOfOrder: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("delivery spans (-want +got):\n%s", diff)
	}

	m := sums(t, reader)
	for name, want := range map[string]int64{
		"outbox.published_messages": 1, "outbox.dispatched_messages": 2, "outbox.retried_messages": 1,
		"outbox.acked_messages": 1, "outbox.handler.duration": 2, "outbox.message.age": 2, "outbox.fetched_messages": 2,
	} {
		if m[name] != want {
			t.Errorf("%s = %d, want %d (all: %v)", name, m[name], want, m)
		}
	}
}

// With Link, a delivery's span starts a trace of its own, linked to the
// publishing span; a message published outside any span gets a root span.
func TestLinkedDeliveriesStartTracesOfTheirOwn(t *testing.T) {
	t.Parallel()
	f := outboxtest.New(t, outboxtest.Connect(t), nil)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	pub := publishInSpan(t, f, tp, nil)
	ok := func(context.Context, *outbox.Message[order]) error { return nil }
	outboxtest.Drain(t, f.Outbox, []string{"orders"}, ok,
		&outbox.SubscriberConfig[order]{Observer: outboxotel.NewObserver(&outboxotel.Options{TracerProvider: tp, Link: true})}, 0)
	if _, err := pub.Publish(t.Context(), f.Pool, order{ID: "o-2"}, nil); err != nil {
		t.Fatal(err)
	}
	outboxtest.Drain(t, f.Outbox, []string{"orders"}, ok,
		&outbox.SubscriberConfig[order]{Observer: outboxotel.NewObserver(&outboxotel.Options{TracerProvider: tp})}, 0)

	ended := spans.Ended()
	if len(ended) != 3 {
		t.Fatalf("%d spans, want 3", len(ended))
	}
	linked, root := ended[1], ended[2]
	if linked.Parent().IsValid() || linked.SpanContext().TraceID() == ended[0].SpanContext().TraceID() ||
		len(linked.Links()) != 1 || linked.Links()[0].SpanContext.SpanID() != ended[0].SpanContext().SpanID() {
		t.Errorf("linked span: parent %v, links %v", linked.Parent(), linked.Links())
	}
	if root.Parent().IsValid() {
		t.Errorf("a message published outside a span: parent %v", root.Parent())
	}
}

// A rejected message's span records the dead letter and its reason.
func TestDeadLetterIsASpanEvent(t *testing.T) {
	t.Parallel()
	f := outboxtest.New(t, outboxtest.Connect(t), nil)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	publishInSpan(t, f, tp, nil)
	reject := func(context.Context, *outbox.Message[order]) error {
		return outbox.Reject(errors.New("no such customer"))
	}
	outboxtest.Drain(t, f.Outbox, []string{"orders"}, reject,
		&outbox.SubscriberConfig[order]{Observer: outboxotel.NewObserver(&outboxotel.Options{TracerProvider: tp})}, 0)
	ended := spans.Ended()
	if len(ended) != 2 {
		t.Fatalf("%d spans, want 2", len(ended))
	}
	s := ended[1]
	if diff := cmp.Diff([]string{"outbox.dead_lettered", "exception"}, eventNames(s)); diff != "" || s.Status().Code != codes.Error {
		t.Errorf("status %v; events (-want +got):\n%s", s.Status(), diff)
	}
	if reason := s.Events()[0].Attributes[0]; string(reason.Key) != "outbox.reason" || reason.Value.AsString() != outbox.ReasonRejected {
		t.Errorf("dead letter event attribute %v", reason)
	}
}

// The health gauges report a healthy outbox as such, at each collection.
func TestHealthGauges(t *testing.T) {
	t.Parallel()
	f := outboxtest.New(t, outboxtest.Connect(t), nil)
	reader := sdkmetric.NewManualReader()
	reg, err := outboxotel.RegisterHealthGauges(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), f.Outbox, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reg.Unregister() }()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[float64]); ok && len(g.DataPoints) == 1 {
				got[m.Name] = g.DataPoints[0].Value
			}
		}
	}
	if len(got) != 10 {
		t.Errorf("%d gauges: %v", len(got), got)
	}
	want := map[string]float64{
		"outbox.health.problems": 0, "outbox.health.schema_version": float64(f.Outbox.LatestSchemaVersion()), "outbox.health.notify_heard": 1,
	}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s = %v, want %v", name, got[name], v)
		}
	}
	if got["outbox.health.table.xid_age"] <= 0 {
		t.Errorf("xid age %v", got["outbox.health.table.xid_age"])
	}
}

// gaugePoints returns every gauge point of rm as "name{queue}" -> value.
func gaugePoints(rm *metricdata.ResourceMetrics) map[string]float64 {
	out := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch g := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, p := range g.DataPoints {
					q, _ := p.Attributes.Value("queue")
					out[m.Name+"{"+q.AsString()+"}"] = float64(p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range g.DataPoints {
					q, _ := p.Attributes.Value("queue")
					out[m.Name+"{"+q.AsString()+"}"] = p.Value
				}
			}
		}
	}
	return out
}

// The queue gauges report what QueueDepths reads, per queue, at each
// collection, with the counts that stopped at the cap; a missing outbox
// fails the collection with the error that names the fix.
func TestQueueGauges(t *testing.T) {
	t.Parallel()
	f := outboxtest.New(t, outboxtest.Connect(t), nil)
	reader := sdkmetric.NewManualReader()
	reg, err := outboxotel.RegisterQueueGauges(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), f.Outbox, &outbox.DepthOptions{Cap: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reg.Unregister() }()
	for _, sql := range []string{
		`INSERT INTO outbox (queue, payload, next_attempt_at) VALUES
			('a', 'x', now() - interval '90 seconds'), ('a', 'x', now()), ('a', 'x', now()), ('a', 'x', now() + interval '1 hour')`,
		`INSERT INTO outbox (queue, payload, acquired_at, acquired_token, lease_expires_at) VALUES
			('b', 'x', now(), gen_random_uuid(), now() + interval '1 minute'),
			('b', 'x', now() - interval '2 minutes', gen_random_uuid(), now() - interval '1 minute')`,
		`INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason)
			VALUES (1, 'b', 'x', 3, 3, now(), 'rejected')`,
	} {
		err := pgx.BeginFunc(t.Context(), f.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(t.Context(), "SET LOCAL search_path = "+pgx.Identifier{f.Schema}.Sanitize()); err != nil {
				return err
			}
			_, err := tx.Exec(t.Context(), sql)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	got := gaugePoints(&rm)
	wait := got["outbox.queue.oldest_ready_wait{a}"]
	if wait < 90 || wait > 3600 {
		t.Errorf("queue a's oldest ready message has waited %v s, want about 90", wait)
	}
	delete(got, "outbox.queue.oldest_ready_wait{a}")
	want := map[string]float64{
		"outbox.queue.ready_messages{a}": 2, "outbox.queue.scheduled_messages{a}": 1, "outbox.queue.leased_messages{a}": 0,
		"outbox.queue.expired_messages{a}": 0, "outbox.queue.dead_letters{a}": 0, "outbox.queue.depth_capped{a}": 1,
		"outbox.queue.ready_messages{b}": 0, "outbox.queue.scheduled_messages{b}": 0, "outbox.queue.leased_messages{b}": 1,
		"outbox.queue.expired_messages{b}": 1, "outbox.queue.dead_letters{b}": 1, "outbox.queue.depth_capped{b}": 0,
		"outbox.queue.oldest_ready_wait{b}": 0,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("gauges (-want +got):\n%s", diff)
	}

	d := pgtest.New(t)
	missing, err := outbox.New(d.Pool, &outbox.Config{Schema: d.Schema}) // never migrated
	if err != nil {
		t.Fatal(err)
	}
	reader = sdkmetric.NewManualReader()
	reg, err = outboxotel.RegisterQueueGauges(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), missing, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reg.Unregister() }()
	rm = metricdata.ResourceMetrics{}
	if err := reader.Collect(t.Context(), &rm); err == nil || !strings.Contains(err.Error(), "does not exist: run `outboxgen migrate up`") {
		t.Errorf("collection of a missing outbox: %v, want the SchemaError", err)
	}
	if got := gaugePoints(&rm); len(got) != 0 {
		t.Errorf("a missing outbox recorded %v", got)
	}
}
