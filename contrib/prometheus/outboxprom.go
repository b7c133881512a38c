// Package outboxprom exports an outbox's metrics to Prometheus.
//
// A [Recorder] is an [outbox.MetricsRecorder]: set it as
// PublisherConfig.Metrics and SubscriberConfig.Metrics, and register it,
// and it counts what publishers and subscribers do and times handlers. A
// [QueueCollector] reads each queue's depth from the outbox's indexes when
// Prometheus scrapes it, and a [HealthCollector] runs the outbox's health
// report ([outbox.Outbox.Health]) at each scrape.
//
//	rec := outboxprom.NewRecorder(nil)
//	prometheus.MustRegister(rec, outboxprom.NewQueueCollector(ob, nil))
//	sub, err := outbox.NewSubscriber(ob, queues, handle, &outbox.SubscriberConfig[Order]{Metrics: rec})
//
// It is a module of its own, so that the outbox package does not depend on
// the Prometheus client.
package outboxprom

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxgen/outboxgen/outbox"
)

// Options configures a [Recorder]. A nil *Options means every default.
type Options struct {
	// Namespace prefixes every metric name. Default: "outbox".
	Namespace string
	// HandlerBuckets are the buckets, in seconds, of the handler duration
	// histogram. Default: prometheus.DefBuckets.
	HandlerBuckets []float64
	// AgeBuckets are the buckets, in seconds, of the histogram of a row's
	// age when its handler starts. Default: 1 ms to about 65 s, doubling.
	AgeBuckets []float64
}

func (o *Options) namespace() string {
	if o == nil || o.Namespace == "" {
		return "outbox"
	}
	return o.Namespace
}

// Recorder counts outbox events and times handlers. Its Record never
// blocks and never fails. Register it with a prometheus.Registerer; the
// metrics are (with the default namespace):
//
//	outbox_published_messages_total{queue}                 messages published
//	outbox_publish_errors_total{queue, error_type}         failed Publish and PublishBatch calls
//	outbox_fetched_messages_total{subscriber, queue}       messages claimed
//	outbox_dispatched_messages_total{subscriber, queue}    handlers started
//	outbox_acked_messages_total{subscriber, queue}         handled and deleted
//	outbox_retried_messages_total{subscriber, queue}       rescheduled after a failure
//	outbox_dead_lettered_messages_total{subscriber, queue, reason}
//	outbox_dropped_messages_total{subscriber, queue, reason}   ended without a dead-letter table
//	outbox_lease_lost_total{subscriber, queue, write}      outcomes or heartbeats that found the lease gone
//	outbox_write_refused_total{subscriber, queue, write}   outcomes the database refused to store
//	outbox_drain_timeouts_total{subscriber}                stops that abandoned running handlers
//	outbox_handler_duration_seconds{subscriber, queue, outcome}  histogram; outcome is acked, retried or ended
//	outbox_message_age_seconds{subscriber, queue}          histogram: creation to handler start
//
// subscriber is SubscriberConfig.Name (by default the queues,
// comma-separated).
type Recorder struct {
	published, publishErrors                       *prometheus.CounterVec
	fetched, dispatched, acked, retried            *prometheus.CounterVec
	deadLettered, dropped, leaseLost, writeRefused *prometheus.CounterVec
	drainTimeouts                                  *prometheus.CounterVec
	handlerDuration, age                           *prometheus.HistogramVec
	collectors                                     []prometheus.Collector
}

var _ outbox.MetricsRecorder = (*Recorder)(nil)

// NewRecorder returns a Recorder with every series at zero. Register it
// once per process (or per Namespace).
func NewRecorder(opts *Options) *Recorder {
	ns := opts.namespace()
	r := &Recorder{}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help}, labels)
		r.collectors = append(r.collectors, c)
		return c
	}
	r.published = counter("published_messages_total", "Messages published to the outbox.", "queue")
	r.publishErrors = counter("publish_errors_total", "Publish and PublishBatch calls that failed, by error type.", "queue", "error_type")
	r.fetched = counter("fetched_messages_total", "Messages a subscriber claimed.", "subscriber", "queue")
	r.dispatched = counter("dispatched_messages_total", "Handlers a subscriber started.", "subscriber", "queue")
	r.acked = counter("acked_messages_total", "Messages handled and deleted.", "subscriber", "queue")
	r.retried = counter("retried_messages_total", "Messages rescheduled after their handler failed.", "subscriber", "queue")
	r.deadLettered = counter("dead_lettered_messages_total", "Messages moved to the dead-letter table, by reason.", "subscriber", "queue", "reason")
	r.dropped = counter("dropped_messages_total", "Messages ended without a dead-letter table (deleted and logged), by reason.", "subscriber", "queue", "reason")
	r.leaseLost = counter("lease_lost_total", "Outcome writes and heartbeats that found the lease gone, by write.", "subscriber", "queue", "write")
	r.writeRefused = counter("write_refused_total", "Outcomes the database refused to store, by write.", "subscriber", "queue", "write")
	r.drainTimeouts = counter("drain_timeouts_total", "Stops that abandoned handlers still running after the graceful timeout.", "subscriber")

	handlerBuckets, ageBuckets := prometheus.DefBuckets, prometheus.ExponentialBuckets(0.001, 2, 17)
	if opts != nil && len(opts.HandlerBuckets) > 0 {
		handlerBuckets = opts.HandlerBuckets
	}
	if opts != nil && len(opts.AgeBuckets) > 0 {
		ageBuckets = opts.AgeBuckets
	}
	r.handlerDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Name: "handler_duration_seconds", Help: "How long handlers ran, by outcome (acked, retried, ended).",
		Buckets: handlerBuckets,
	}, []string{"subscriber", "queue", "outcome"})
	r.age = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Name: "message_age_seconds",
		Help:    "A message's age when its handler starts: from the row's creation (server clock) to the start (subscriber's clock).",
		Buckets: ageBuckets,
	}, []string{"subscriber", "queue"})
	r.collectors = append(r.collectors, r.handlerDuration, r.age)
	return r
}

// Record implements [outbox.MetricsRecorder].
func (r *Recorder) Record(ev outbox.MetricEvent) {
	sub, q := ev.Subscriber, ev.Queue
	switch ev.Name {
	case outbox.EventPublished:
		if ev.ErrorType != "" {
			r.publishErrors.WithLabelValues(q, ev.ErrorType).Inc()
			return
		}
		r.published.WithLabelValues(q).Add(float64(ev.Count))
	case outbox.EventFetched:
		r.fetched.WithLabelValues(sub, q).Add(float64(ev.Count))
	case outbox.EventDispatched:
		r.dispatched.WithLabelValues(sub, q).Inc()
		r.age.WithLabelValues(sub, q).Observe(ev.Age.Seconds())
	case outbox.EventAcked:
		r.acked.WithLabelValues(sub, q).Inc()
		r.observeHandler(sub, q, "acked", ev.Duration)
	case outbox.EventRetried:
		r.retried.WithLabelValues(sub, q).Inc()
		r.observeHandler(sub, q, "retried", ev.Duration)
	case outbox.EventDeadLettered:
		r.deadLettered.WithLabelValues(sub, q, ev.Reason).Inc()
		r.observeHandler(sub, q, "ended", ev.Duration)
	case outbox.EventTerminal:
		r.dropped.WithLabelValues(sub, q, ev.Reason).Inc()
		r.observeHandler(sub, q, "ended", ev.Duration)
	case outbox.EventLeaseLost:
		r.leaseLost.WithLabelValues(sub, q, ev.Reason).Inc()
	case outbox.EventWriteRefused:
		r.writeRefused.WithLabelValues(sub, q, ev.Reason).Inc()
	case outbox.EventDrainTimeout:
		r.drainTimeouts.WithLabelValues(sub).Inc()
	}
}

// observeHandler records a handler's duration; outcomes whose handler
// never ran (a row that could not be decoded) have none.
func (r *Recorder) observeHandler(sub, q, outcome string, d time.Duration) {
	if d > 0 {
		r.handlerDuration.WithLabelValues(sub, q, outcome).Observe(d.Seconds())
	}
}

// Describe implements prometheus.Collector.
func (r *Recorder) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range r.collectors {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (r *Recorder) Collect(ch chan<- prometheus.Metric) {
	for _, c := range r.collectors {
		c.Collect(ch)
	}
}

// QueueOptions configures a [QueueCollector]. A nil *QueueOptions means
// every default.
type QueueOptions struct {
	// Namespace prefixes every metric name. Default: "outbox".
	Namespace string
	// Timeout bounds each scrape's query. Default: 5 s.
	Timeout time.Duration
	// Cap is where each count stops (outbox.DepthOptions.Cap): a gauge at
	// it means at least that many. Default: outbox.DepthCapDefault
	// (10,000).
	Cap int64
}

// QueueCollector reads [outbox.Outbox.QueueDepths] when it is collected
// and reports each queue's depth as gauges (with the default namespace):
//
//	outbox_queue_ready_messages{queue}          due and not leased
//	outbox_queue_scheduled_messages{queue}      due later (delayed or waiting to retry)
//	outbox_queue_leased_messages{queue}         held by a live lease
//	outbox_queue_expired_messages{queue}        held by a lease that has run out
//	outbox_queue_dead_letters{queue}            rows in the dead-letter table
//	outbox_queue_oldest_ready_wait_seconds{queue}  how long the ready row due earliest has been due
//	outbox_queue_depth_capped{queue}            1 when a count stopped at QueueOptions.Cap, else 0
//
// A scrape reads only indexes and each count stops at QueueOptions.Cap,
// so its cost is bounded per queue however long the backlog. At 1,000,000
// rows of four queues in mixed states on a 2-core machine, with the default
// cap, a scrape took about 16 ms on a vacuumed table, where
// [outbox.Outbox.QueueStats], which scans the tables whole, took about
// 270 ms. Before vacuum has marked the table's pages all-visible each
// counted entry is checked in the table: about 140 ms then (11 ms with a
// cap of 1,000). Keep autovacuum on, and lower Cap when there are many
// queues.
//
// It leaves out what only a scan of the rows can tell: rows blocked
// behind their ordering key, held keys, key hand-overs, and the age of
// the oldest row. `outboxgen inspect` and [outbox.Outbox.QueueStats] read
// them. A scrape that fails or times out reports the error to Prometheus
// rather than stale values.
type QueueCollector struct {
	ob      *outbox.Outbox
	timeout time.Duration
	opts    outbox.DepthOptions
	descs   queueDescs
}

type queueDescs struct {
	ready, scheduled, leased, expired, dead, wait, capped *prometheus.Desc
}

func (d *queueDescs) all() []*prometheus.Desc {
	return []*prometheus.Desc{d.ready, d.scheduled, d.leased, d.expired, d.dead, d.wait, d.capped}
}

// NewQueueCollector returns a collector of ob's queues.
func NewQueueCollector(ob *outbox.Outbox, opts *QueueOptions) *QueueCollector {
	ns, timeout := "outbox", 5*time.Second
	var depth outbox.DepthOptions
	if opts != nil {
		if opts.Namespace != "" {
			ns = opts.Namespace
		}
		if opts.Timeout > 0 {
			timeout = opts.Timeout
		}
		depth.Cap = opts.Cap
	}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(ns, "queue", name), help, []string{"queue"}, nil)
	}
	return &QueueCollector{ob: ob, timeout: timeout, opts: depth, descs: queueDescs{
		ready:     desc("ready_messages", "Messages due now and not leased (counted up to the cap)."),
		scheduled: desc("scheduled_messages", "Messages due later: delayed, or waiting for a retry (counted up to the cap)."),
		leased:    desc("leased_messages", "Messages held by a live lease (counted up to the cap)."),
		expired:   desc("expired_messages", "Messages held by a lease that has run out; any claim takes them (counted up to the cap)."),
		dead:      desc("dead_letters", "Rows of the queue in the dead-letter table (counted up to the cap)."),
		wait:      desc("oldest_ready_wait_seconds", "How long the ready message due earliest has been due; 0 when none is ready."),
		capped:    desc("depth_capped", "1 when one of the queue's counts stopped at the cap (it means at least that many), else 0."),
	}}
}

// Describe implements prometheus.Collector.
func (c *QueueCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs.all() {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *QueueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	depths, err := c.ob.QueueDepths(ctx, &c.opts)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = errors.Join(err, errors.New("outboxprom: QueueDepths took longer than QueueOptions.Timeout"))
		}
		failed(ch, c.descs.all(), err)
		return
	}
	d := &c.descs
	for _, s := range depths {
		capped := 0.0
		if s.Capped {
			capped = 1
		}
		for _, g := range []struct {
			desc *prometheus.Desc
			v    float64
		}{
			{d.ready, float64(s.Ready)}, {d.scheduled, float64(s.Scheduled)}, {d.leased, float64(s.Leased)},
			{d.expired, float64(s.Expired)}, {d.dead, float64(s.DeadLettered)},
			{d.wait, s.OldestReadyWait.Seconds()}, {d.capped, capped},
		} {
			ch <- gauge(g.desc, g.v, s.Queue)
		}
	}
}

// HealthCollector runs [outbox.Outbox.Health] when it is collected and
// reports it as gauges (with the default namespace):
//
//	outbox_health_problems                       conditions past their thresholds (Health.Problems)
//	outbox_health_schema_version                 the schema's version (0: no outbox table)
//	outbox_health_notify_heard                   1 when the NOTIFY probe was heard, else 0
//	outbox_health_notify_seconds                 how long the probe took to arrive
//	outbox_health_notification_queue_usage      the server's notification queue, 0 to 1
//	outbox_health_oldest_xmin_age_transactions   what holds back vacuum: its horizon's age
//	outbox_health_oldest_xmin_open_seconds       and how long its transaction has been open
//	outbox_health_table_dead_tuples              the outbox table's dead row versions
//	outbox_health_table_live_tuples              and live ones
//	outbox_health_table_xid_age_transactions     the age of its oldest unfrozen row
//
// Each scrape runs a few catalog queries and one notification, waiting at
// most the options' NotifyTimeout (default 2 s) for it.
type HealthCollector struct {
	ob    *outbox.Outbox
	opts  *outbox.HealthOptions
	descs []*prometheus.Desc
}

// Indexes of HealthCollector.descs, in the order of the list above.
const (
	hProblems = iota
	hSchema
	hNotifyHeard
	hNotifySeconds
	hQueueUsage
	hXminAge
	hXminOpen
	hDead
	hLive
	hXidAge
)

// NewHealthCollector returns a collector of ob's health; opts may be nil
// (pass the subscribers' ListenDSN in it when they have one).
func NewHealthCollector(ob *outbox.Outbox, opts *outbox.HealthOptions, namespace string) *HealthCollector {
	if namespace == "" {
		namespace = "outbox"
	}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "health", name), help, nil, nil)
	}
	return &HealthCollector{ob: ob, opts: opts, descs: []*prometheus.Desc{
		hProblems:      desc("problems", "Conditions past their thresholds that break the outbox (see Outbox.Health)."),
		hSchema:        desc("schema_version", "The outbox schema's version; 0 when the outbox table does not exist."),
		hNotifyHeard:   desc("notify_heard", "1 when a NOTIFY sent through the pool was heard on a LISTEN connection, else 0."),
		hNotifySeconds: desc("notify_seconds", "How long the NOTIFY probe took to arrive."),
		hQueueUsage:    desc("notification_queue_usage", "pg_notification_queue_usage(): the server's notification queue, 0 to 1."),
		hXminAge:       desc("oldest_xmin_age_transactions", "Age of the oldest snapshot horizon in the cluster, which holds back vacuum."),
		hXminOpen:      desc("oldest_xmin_open_seconds", "How long the transaction that holds the oldest horizon has been open."),
		hDead:          desc("table_dead_tuples", "Dead row versions in the outbox table (statistics collector's estimate)."),
		hLive:          desc("table_live_tuples", "Live row versions in the outbox table (statistics collector's estimate)."),
		hXidAge:        desc("table_xid_age_transactions", "Age in transactions of the outbox table's oldest unfrozen row."),
	}}
}

// Describe implements prometheus.Collector.
func (c *HealthCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *HealthCollector) Collect(ch chan<- prometheus.Metric) {
	h, err := c.ob.Health(context.Background(), c.opts)
	if err != nil {
		failed(ch, c.descs, err)
		return
	}
	values := make([]float64, len(c.descs))
	values[hProblems] = float64(len(h.Problems))
	values[hSchema] = float64(h.SchemaVersion)
	if h.NotifyHeard {
		values[hNotifyHeard] = 1
	}
	values[hNotifySeconds] = h.NotifyTook.Seconds()
	values[hQueueUsage] = h.NotificationQueueUsage
	if x := h.OldestXmin; x != nil {
		values[hXminAge], values[hXminOpen] = float64(x.Age), x.Open.Seconds()
	}
	values[hDead], values[hLive], values[hXidAge] = float64(h.DeadTuples), float64(h.LiveTuples), float64(h.XidAge)
	for i, d := range c.descs {
		ch <- gauge(d, values[i])
	}
}

// gauge is a gauge sample of desc, or the error that kept it from being
// one.
func gauge(desc *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	m, err := prometheus.NewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	if err != nil {
		return prometheus.NewInvalidMetric(desc, err)
	}
	return m
}

// failed reports err, for a collection that could not read its values, as
// every one of descs.
func failed(ch chan<- prometheus.Metric, descs []*prometheus.Desc, err error) {
	for _, d := range descs {
		ch <- prometheus.NewInvalidMetric(d, err)
	}
}
