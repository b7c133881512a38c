// Package outboxotel traces and measures an outbox with OpenTelemetry.
//
// Tracing: [HeadersFrom] carries the publishing context's trace (W3C
// traceparent and tracestate, through the global propagator) in each
// message's headers, and an [Observer] runs each delivery in a consumer
// span that is a child of the publishing span, with the outcome as an
// event, so one trace spans the publish and every handling of the message:
//
//	pub, err := outbox.NewPublisher(ob, "orders", &outbox.PublisherConfig[Order]{HeadersFrom: outboxotel.HeadersFrom})
//	sub, err := outbox.NewSubscriber(ob, []string{"orders"}, handle,
//		&outbox.SubscriberConfig[Order]{Observer: outboxotel.NewObserver(nil)})
//
// Metrics: [Recorder] is an [outbox.MetricsRecorder] that records the same
// series as contrib/prometheus's, as OpenTelemetry instruments,
// [RegisterQueueGauges] reports each queue's depth as gauges (read from the
// outbox's indexes at each collection), and [RegisterHealthGauges] the
// outbox's health report.
//
// It is a module of its own, so that the outbox package does not depend on
// OpenTelemetry.
package outboxotel

import (
	"context"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxgen/outboxgen/outbox"
)

// ScopeName names this package's tracer and meter.
const ScopeName = "github.com/outboxgen/outboxgen/contrib/otel"

// System is the messaging.system attribute of every span.
const System = "outboxgen"

// HeadersFrom returns the trace context of ctx as message headers, through
// the global propagator (otel.GetTextMapPropagator). Set it as
// PublisherConfig.HeadersFrom.
func HeadersFrom(ctx context.Context) map[string]string {
	carrier := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, carrier)
	if len(carrier) == 0 {
		return nil
	}
	return carrier
}

// Options configures [NewObserver]. A nil *Options means every default.
type Options struct {
	// TracerProvider makes the tracer. Default: otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator reads the trace context from the headers. Default:
	// otel.GetTextMapPropagator().
	Propagator propagation.TextMapPropagator
	// Link makes each delivery's span the root of a trace of its own,
	// linked to the publishing span, instead of its child (for publishers
	// whose traces should not grow with every later handling).
	Link bool
}

// Observer traces deliveries; set it as SubscriberConfig.Observer.
type Observer struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	link       bool
}

var _ outbox.DeliveryObserver = (*Observer)(nil)

// NewObserver returns an Observer that runs each delivery's handler in a
// consumer span named "process <queue>": a child of the span the message
// was published in (or linked to it, with Options.Link). The span carries
// the messaging attributes (system, operation, destination, message id),
// the delivery's number and ordering key; when the handler returns it
// records the outcome the subscriber decided as an event
// (outbox.retry_scheduled with its delay, outbox.dead_lettered or
// outbox.dropped with their reason, outbox.abandoned) and a failed
// handler's error with an error status, and ends. A retried message's next
// delivery is a new span of the same trace.
func NewObserver(opts *Options) *Observer {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
	if o.Propagator == nil {
		o.Propagator = otel.GetTextMapPropagator()
	}
	return &Observer{tracer: o.TracerProvider.Tracer(ScopeName), propagator: o.Propagator, link: o.Link}
}

// Start implements [outbox.DeliveryObserver].
func (ob *Observer) Start(ctx context.Context, d outbox.DeliveryInfo) context.Context {
	published := ob.propagator.Extract(context.Background(), propagation.MapCarrier(d.Headers))
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", System),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.operation.name", "process"),
		attribute.String("messaging.destination.name", d.Queue),
		attribute.String("messaging.message.id", strconv.FormatInt(d.ID, 10)),
		attribute.Int("messaging.outboxgen.deliveries", d.Deliveries),
	}
	if d.Subscriber != "" {
		attrs = append(attrs, attribute.String("messaging.consumer.group.name", d.Subscriber))
	}
	if d.OrderingKey != "" {
		attrs = append(attrs, attribute.String("messaging.outboxgen.ordering_key", d.OrderingKey))
	}
	startOpts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)}
	if sc := trace.SpanContextFromContext(published); sc.IsValid() {
		if ob.link {
			startOpts = append(startOpts, trace.WithLinks(trace.Link{SpanContext: sc}), trace.WithNewRoot())
		} else {
			ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
		}
	}
	ctx, _ = ob.tracer.Start(ctx, "process "+d.Queue, startOpts...)
	return ctx
}

// End implements [outbox.DeliveryObserver].
func (ob *Observer) End(ctx context.Context, _ outbox.DeliveryInfo, o outbox.DeliveryOutcome) {
	span := trace.SpanFromContext(ctx)
	switch o.Outcome {
	case outbox.OutcomeRetried:
		span.AddEvent("outbox.retry_scheduled", trace.WithAttributes(attribute.Float64("outbox.retry.delay_seconds", o.Delay.Seconds())))
	case outbox.OutcomeDeadLettered:
		span.AddEvent("outbox.dead_lettered", trace.WithAttributes(attribute.String("outbox.reason", o.Reason)))
	case outbox.OutcomeDropped:
		span.AddEvent("outbox.dropped", trace.WithAttributes(attribute.String("outbox.reason", o.Reason)))
	case outbox.OutcomeAbandoned:
		span.AddEvent("outbox.abandoned")
	}
	if o.Err != nil {
		span.RecordError(o.Err)
		span.SetStatus(codes.Error, firstLine(o.Err.Error()))
	}
	span.End()
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// Recorder records outbox events as OpenTelemetry metrics, the set
// contrib/prometheus records (without its "_total" suffixes):
//
//	outbox.published_messages{queue}, outbox.publish_errors{queue, error_type}
//	outbox.fetched_messages, .dispatched_messages, .acked_messages, .retried_messages{subscriber, queue}
//	outbox.dead_lettered_messages, .dropped_messages{subscriber, queue, reason}
//	outbox.lease_lost, .write_refused{subscriber, queue, write}
//	outbox.drain_timeouts{subscriber}
//	outbox.handler.duration (s){subscriber, queue, outcome}
//	outbox.message.age (s){subscriber, queue}
type Recorder struct {
	published, publishErrors, fetched, dispatched, acked, retried metric.Int64Counter
	deadLettered, dropped, leaseLost, writeRefused, drainTimeouts metric.Int64Counter
	handlerDuration, age                                          metric.Float64Histogram
}

var _ outbox.MetricsRecorder = (*Recorder)(nil)

// NewRecorder makes the instruments with mp (nil: otel.GetMeterProvider()).
func NewRecorder(mp metric.MeterProvider) (*Recorder, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	r := &Recorder{}
	var err error
	counter := func(dst *metric.Int64Counter, name, desc string) {
		if err != nil {
			return
		}
		*dst, err = m.Int64Counter("outbox."+name, metric.WithDescription(desc), metric.WithUnit("{message}"))
	}
	counter(&r.published, "published_messages", "Messages published to the outbox.")
	counter(&r.publishErrors, "publish_errors", "Publish and PublishBatch calls that failed, by error type.")
	counter(&r.fetched, "fetched_messages", "Messages a subscriber claimed.")
	counter(&r.dispatched, "dispatched_messages", "Handlers a subscriber started.")
	counter(&r.acked, "acked_messages", "Messages handled and deleted.")
	counter(&r.retried, "retried_messages", "Messages rescheduled after their handler failed.")
	counter(&r.deadLettered, "dead_lettered_messages", "Messages moved to the dead-letter table, by reason.")
	counter(&r.dropped, "dropped_messages", "Messages ended without a dead-letter table, by reason.")
	counter(&r.leaseLost, "lease_lost", "Outcome writes and heartbeats that found the lease gone, by write.")
	counter(&r.writeRefused, "write_refused", "Outcomes the database refused to store, by write.")
	counter(&r.drainTimeouts, "drain_timeouts", "Stops that abandoned handlers still running after the graceful timeout.")
	if err != nil {
		return nil, err
	}
	if r.handlerDuration, err = m.Float64Histogram("outbox.handler.duration", metric.WithUnit("s"),
		metric.WithDescription("How long handlers ran, by outcome (acked, retried, ended).")); err != nil {
		return nil, err
	}
	if r.age, err = m.Float64Histogram("outbox.message.age", metric.WithUnit("s"),
		metric.WithDescription("A message's age when its handler starts: from the row's creation (server clock) to the start (subscriber's clock).")); err != nil {
		return nil, err
	}
	return r, nil
}

// Record implements [outbox.MetricsRecorder].
func (r *Recorder) Record(ev outbox.MetricEvent) {
	ctx := context.Background()
	q := attribute.String("queue", ev.Queue)
	sq := metric.WithAttributes(attribute.String("subscriber", ev.Subscriber), q)
	withReason := func(key string) metric.MeasurementOption {
		return metric.WithAttributes(attribute.String("subscriber", ev.Subscriber), q, attribute.String(key, ev.Reason))
	}
	handler := func(outcome string) {
		if ev.Duration > 0 {
			r.handlerDuration.Record(ctx, ev.Duration.Seconds(),
				metric.WithAttributes(attribute.String("subscriber", ev.Subscriber), q, attribute.String("outcome", outcome)))
		}
	}
	switch ev.Name {
	case outbox.EventPublished:
		if ev.ErrorType != "" {
			r.publishErrors.Add(ctx, 1, metric.WithAttributes(q, attribute.String("error_type", ev.ErrorType)))
			return
		}
		r.published.Add(ctx, int64(ev.Count), metric.WithAttributes(q))
	case outbox.EventFetched:
		r.fetched.Add(ctx, int64(ev.Count), sq)
	case outbox.EventDispatched:
		r.dispatched.Add(ctx, 1, sq)
		r.age.Record(ctx, ev.Age.Seconds(), sq)
	case outbox.EventAcked:
		r.acked.Add(ctx, 1, sq)
		handler("acked")
	case outbox.EventRetried:
		r.retried.Add(ctx, 1, sq)
		handler("retried")
	case outbox.EventDeadLettered:
		r.deadLettered.Add(ctx, 1, withReason("reason"))
		handler("ended")
	case outbox.EventTerminal:
		r.dropped.Add(ctx, 1, withReason("reason"))
		handler("ended")
	case outbox.EventLeaseLost:
		r.leaseLost.Add(ctx, 1, withReason("write"))
	case outbox.EventWriteRefused:
		r.writeRefused.Add(ctx, 1, withReason("write"))
	case outbox.EventDrainTimeout:
		r.drainTimeouts.Add(ctx, 1, metric.WithAttributes(attribute.String("subscriber", ev.Subscriber)))
	}
}

// RegisterHealthGauges reports ob's health report ([outbox.Outbox.Health],
// with opts) as observable gauges of mp (nil: otel.GetMeterProvider()),
// read at each collection: outbox.health.problems,
// outbox.health.schema_version, outbox.health.notify_heard (1 or 0),
// outbox.health.notify.duration (s), outbox.health.notification_queue_usage
// (0 to 1), outbox.health.oldest_xmin.age ({transaction}),
// outbox.health.oldest_xmin.open (s), outbox.health.table.dead_tuples,
// outbox.health.table.live_tuples and outbox.health.table.xid_age
// ({transaction}). Each collection runs a few catalog queries and one
// notification, waiting at most opts.NotifyTimeout (default 2 s); a
// collection whose report fails records nothing. Unregister the returned
// registration to stop.
func RegisterHealthGauges(mp metric.MeterProvider, ob *outbox.Outbox, opts *outbox.HealthOptions) (metric.Registration, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	type gauge struct {
		name, unit, desc string
		value            func(*outbox.Health) float64
	}
	gauges := []gauge{
		{"problems", "{problem}", "Conditions past their thresholds that break the outbox (see Outbox.Health).",
			func(h *outbox.Health) float64 { return float64(len(h.Problems)) }},
		{"schema_version", "1", "The outbox schema's version; 0 when the outbox table does not exist.",
			func(h *outbox.Health) float64 { return float64(h.SchemaVersion) }},
		{"notify_heard", "1", "1 when a NOTIFY sent through the pool was heard on a LISTEN connection, else 0.",
			func(h *outbox.Health) float64 { return map[bool]float64{true: 1}[h.NotifyHeard] }},
		{"notify.duration", "s", "How long the NOTIFY probe took to arrive.",
			func(h *outbox.Health) float64 { return h.NotifyTook.Seconds() }},
		{"notification_queue_usage", "1", "pg_notification_queue_usage(): the server's notification queue, 0 to 1.",
			func(h *outbox.Health) float64 { return h.NotificationQueueUsage }},
		{"oldest_xmin.age", "{transaction}", "Age of the oldest snapshot horizon in the cluster, which holds back vacuum.",
			func(h *outbox.Health) float64 {
				if h.OldestXmin == nil {
					return 0
				}
				return float64(h.OldestXmin.Age)
			}},
		{"oldest_xmin.open", "s", "How long the transaction that holds the oldest horizon has been open.",
			func(h *outbox.Health) float64 {
				if h.OldestXmin == nil {
					return 0
				}
				return h.OldestXmin.Open.Seconds()
			}},
		{"table.dead_tuples", "{tuple}", "Dead row versions in the outbox table (statistics collector's estimate).",
			func(h *outbox.Health) float64 { return float64(h.DeadTuples) }},
		{"table.live_tuples", "{tuple}", "Live row versions in the outbox table (statistics collector's estimate).",
			func(h *outbox.Health) float64 { return float64(h.LiveTuples) }},
		{"table.xid_age", "{transaction}", "Age in transactions of the outbox table's oldest unfrozen row.",
			func(h *outbox.Health) float64 { return float64(h.XidAge) }},
	}
	instruments := make([]metric.Float64ObservableGauge, len(gauges))
	observables := make([]metric.Observable, len(gauges))
	for i, g := range gauges {
		inst, err := m.Float64ObservableGauge("outbox.health."+g.name, metric.WithUnit(g.unit), metric.WithDescription(g.desc))
		if err != nil {
			return nil, err
		}
		instruments[i], observables[i] = inst, inst
	}
	return m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		h, err := ob.Health(ctx, opts)
		if err != nil {
			return err
		}
		for i, g := range gauges {
			o.ObserveFloat64(instruments[i], g.value(&h))
		}
		return nil
	}, observables...)
}

// RegisterQueueGauges reports each queue's depth ([outbox.Outbox.QueueDepths],
// with opts; nil means every default) as observable gauges of mp (nil:
// otel.GetMeterProvider()), read at each collection, with the queue as
// attribute "queue": the series of contrib/prometheus's QueueCollector,
//
//	outbox.queue.ready_messages ({message})      due now and not leased
//	outbox.queue.scheduled_messages ({message})  due later (delayed or waiting to retry)
//	outbox.queue.leased_messages ({message})     held by a live lease
//	outbox.queue.expired_messages ({message})    held by a lease that has run out
//	outbox.queue.dead_letters ({message})        rows in the dead-letter table
//	outbox.queue.oldest_ready_wait (s)           how long the ready row due earliest has been due
//	outbox.queue.depth_capped                    1 when a count stopped at opts.Cap, else 0
//
// Each count stops at opts.Cap (default outbox.DepthCapDefault, 10,000),
// and a collection reads only indexes, so its cost is bounded per queue:
// at 1,000,000 rows of four queues, about 16 ms on a vacuumed table
// (see QueueDepths for the cost before vacuum). Rows blocked behind their
// ordering key and key hand-overs are not reported: Outbox.QueueStats
// reads them. A collection whose read fails records nothing; the
// collection's context bounds the read. Unregister the returned
// registration to stop.
func RegisterQueueGauges(mp metric.MeterProvider, ob *outbox.Outbox, opts *outbox.DepthOptions) (metric.Registration, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	type count struct {
		name, desc string
		value      func(*outbox.QueueDepth) int64
	}
	counts := []count{
		{"ready_messages", "Messages due now and not leased (counted up to the cap).",
			func(d *outbox.QueueDepth) int64 { return d.Ready }},
		{"scheduled_messages", "Messages due later: delayed, or waiting for a retry (counted up to the cap).",
			func(d *outbox.QueueDepth) int64 { return d.Scheduled }},
		{"leased_messages", "Messages held by a live lease (counted up to the cap).",
			func(d *outbox.QueueDepth) int64 { return d.Leased }},
		{"expired_messages", "Messages held by a lease that has run out; any claim takes them (counted up to the cap).",
			func(d *outbox.QueueDepth) int64 { return d.Expired }},
		{"dead_letters", "Rows of the queue in the dead-letter table (counted up to the cap).",
			func(d *outbox.QueueDepth) int64 { return d.DeadLettered }},
	}
	instruments := make([]metric.Int64ObservableGauge, len(counts))
	observables := make([]metric.Observable, 0, len(counts)+2)
	for i, c := range counts {
		inst, err := m.Int64ObservableGauge("outbox.queue."+c.name, metric.WithUnit("{message}"), metric.WithDescription(c.desc))
		if err != nil {
			return nil, err
		}
		instruments[i] = inst
		observables = append(observables, inst)
	}
	wait, err := m.Float64ObservableGauge("outbox.queue.oldest_ready_wait", metric.WithUnit("s"),
		metric.WithDescription("How long the ready message due earliest has been due; 0 when none is ready."))
	if err != nil {
		return nil, err
	}
	capped, err := m.Int64ObservableGauge("outbox.queue.depth_capped", metric.WithUnit("1"),
		metric.WithDescription("1 when one of the queue's counts stopped at the cap (it means at least that many), else 0."))
	if err != nil {
		return nil, err
	}
	observables = append(observables, wait, capped)
	return m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		depths, err := ob.QueueDepths(ctx, opts)
		if err != nil {
			return err
		}
		for i := range depths {
			d := &depths[i]
			attrs := metric.WithAttributes(attribute.String("queue", d.Queue))
			for j, c := range counts {
				o.ObserveInt64(instruments[j], c.value(d), attrs)
			}
			o.ObserveFloat64(wait, d.OldestReadyWait.Seconds(), attrs)
			o.ObserveInt64(capped, map[bool]int64{true: 1}[d.Capped], attrs)
		}
		return nil
	}, observables...)
}
