package outboxjs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxgen/outboxgen/outbox"
)

// Defaults of [Config].
const (
	// PublishTimeoutDefault bounds the wait for one publish's ack.
	PublishTimeoutDefault = 5 * time.Second
	// RetryInitialDefault, RetryMaxDelayDefault and RetryJitterDefault
	// make the default retry strategy ([DefaultRetry]).
	RetryInitialDefault = 100 * time.Millisecond
	// RetryMaxDelayDefault: see RetryInitialDefault.
	RetryMaxDelayDefault = 10 * time.Second
	// RetryJitterDefault: see RetryInitialDefault.
	RetryJitterDefault = 0.2
)

// DefaultRetry returns the retry strategy a relay uses when its
// SubscriberConfig sets none: 100 ms doubling to 10 s, ±20 % jitter, and
// no cap on attempts, so a broker outage delays rows and never
// dead-letters them. Its longest wait, 12 s, stays well inside
// JetStream's default duplicate window of two minutes.
func DefaultRetry() *outbox.ExponentialRetry {
	return &outbox.ExponentialRetry{
		Initial: RetryInitialDefault, Multiplier: 2, MaxDelay: RetryMaxDelayDefault, Jitter: RetryJitterDefault,
	}
}

// Config configures a [Relay]. A nil *Config means every default; a zero
// field means its default.
type Config struct {
	// Subject maps a row to the subject its message is published to. It
	// must be safe for concurrent use. Default: [DefaultSubject], the
	// row's queue. A row for which it returns an error, or a subject
	// that is not a valid subject to publish to (empty, with white space
	// or wildcards, or an empty token), is not published: its delivery
	// ends at once (outbox.Reject), to the dead-letter table.
	Subject func(m *outbox.Message[[]byte]) (string, error)

	// Subjects are the subjects Subject can return, wildcards allowed:
	// the start-up check looks up the streams that capture them. Default:
	// the queues when Subject is nil; required when Subject is set.
	Subjects []string

	// Header maps a row to the headers of its message. It must be safe
	// for concurrent use. Default: [DefaultHeader], the row's headers
	// but those named Nats-*, which JetStream would obey as directives,
	// plus Outbox-Queue and Outbox-Ordering-Key. The relay sets
	// Nats-Msg-Id (and Nats-Expected-Stream when Stream is set) over
	// what it returns, dropping these headers in any other case. Any
	// other Nats-* header it returns reaches the stream as a directive:
	// a mapping that copies the row's headers should drop them, as
	// DefaultHeader does. An error, or a header key NATS refuses, ends
	// the row's delivery at once, as for Subject; so does a message the
	// stream refuses for good (see [Relay]).
	Header func(m *outbox.Message[[]byte]) (nats.Header, error)

	// Source names the outbox in message ids ([MsgID]). Default: the
	// outbox's schema and table, "public.outbox". Set it when outboxes
	// of several databases with the same schema and table relay into one
	// stream.
	Source string

	// Stream, when set, is the one stream every message must land in:
	// the start-up check reads only its configuration, and every publish
	// carries Nats-Expected-Stream, so the broker refuses (and the relay
	// retries) a message whose subject another stream captures. Default:
	// none; the check looks the streams up by Subjects.
	Stream string

	// PublishTimeout bounds the wait for the broker's ack of one
	// message; a publish not acknowledged by then fails, and its row is
	// retried. Default: PublishTimeoutDefault (5 s).
	PublishTimeout time.Duration

	// MaxRetryDelay is the longest wait the retry strategy can choose,
	// for the duplicate-window check. Default: computed for the outbox
	// package's strategies (ExponentialRetry, LinearRetry,
	// ConstantRetry, NoRetry) from their fields; required for a strategy
	// of another type, and for one whose waits have no bound.
	MaxRetryDelay time.Duration

	// WarnOnly makes the start-up check log what it finds (a duplicate
	// window too short for the relay's timing, a subject no stream
	// captures, a broker that does not answer) as warnings and run
	// anyway, instead of refusing to start. Rows may then reach a stream
	// twice. Default: false.
	WarnOnly bool

	// Subscriber configures the subscriber that reads the outbox. nil
	// means its defaults, with two differences: Retry defaults to
	// [DefaultRetry] (no cap on attempts), and MaxDeliveries 0 means no
	// cap (a broker outage must not dead-letter rows). Set MaxDeliveries
	// to cap it. Workers (default 16) bounds the publishes in flight.
	Subscriber *outbox.SubscriberConfig[[]byte]

	// Logger receives the relay's logs (a duplicate the stream dropped
	// is logged at debug level). Default: Subscriber.Logger, else
	// slog.Default().
	Logger *slog.Logger
}

// Relay publishes the rows of outbox queues to JetStream. Create it with
// [NewRelay] and call [Relay.Run].
//
// A publish that fails is retried by the subscriber's retry strategy
// (Config.Subscriber), unless publishing the same message again cannot
// succeed: a payload above the server's max_payload or a header NATS
// cannot carry, which the client refuses, or a refusal of the stream
// for what the message is, such as a message above the stream's
// MaxMsgSize or headers above its limit, or a directive of a custom
// Config.Header that cannot hold (Nats-Expected-Last-Sequence,
// Nats-Expected-Last-Msg-Id, a Nats-Rollup the stream does not allow).
// Such a row's delivery ends at once with [outbox.Reject]: it goes to
// the dead-letter table with reason rejected and the broker's error,
// and its key's later rows are relayed. Refusals about the stream
// rather than the message (no stream captures the subject, another
// stream than Config.Stream does, a sealed stream, storage or account
// limits, a cluster without a leader), timeouts and connection failures
// are retried: every row would meet them until the stream or the broker
// is mended.
type Relay struct {
	ob         *outbox.Outbox
	js         jetstream.JetStream
	sub        *outbox.Subscriber[[]byte]
	subject    func(m *outbox.Message[[]byte]) (string, error)
	header     func(m *outbox.Message[[]byte]) (nats.Header, error)
	subjects   []string
	source     string
	stream     string
	warnOnly   bool
	log        *slog.Logger
	redelivery Redelivery
	running    atomic.Bool
}

// NewRelay returns a relay of queues of ob that publishes through nc. It
// validates cfg, returning an *outbox.ConfigError naming the first field
// that breaks a rule, and touches neither the database nor the broker.
// nc stays the caller's: the relay never closes it.
func NewRelay(ob *outbox.Outbox, nc *nats.Conn, queues []string, cfg *Config) (*Relay, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	bad := func(field string, v any, rule string) error {
		return &outbox.ConfigError{Field: "outboxjs.Config." + field, Value: fmt.Sprint(v), Rule: rule}
	}
	if ob == nil {
		return nil, &outbox.ConfigError{Field: "ob", Rule: "must not be nil"}
	}
	if nc == nil {
		return nil, &outbox.ConfigError{Field: "nc", Rule: "must not be nil"}
	}
	var sc outbox.SubscriberConfig[[]byte]
	if c.Subscriber != nil {
		sc = *c.Subscriber
	}
	if sc.Retry == nil {
		sc.Retry = DefaultRetry()
	}
	if sc.MaxDeliveries == 0 {
		sc.MaxDeliveries = -1
	}
	log := cmp.Or(c.Logger, sc.Logger, slog.Default())
	if sc.Logger == nil {
		sc.Logger = log
	}

	switch {
	case c.PublishTimeout < 0:
		return nil, bad("PublishTimeout", c.PublishTimeout, "must not be negative")
	case c.MaxRetryDelay < 0:
		return nil, bad("MaxRetryDelay", c.MaxRetryDelay, "must not be negative")
	case c.Subject != nil && len(c.Subjects) == 0:
		return nil, bad("Subjects", "[]", "must list the subjects Subject returns (wildcards allowed) when Subject is set")
	case c.Stream != "" && !validStreamName(c.Stream):
		return nil, bad("Stream", c.Stream, "must be a stream name: no white space, '.', '*', '>', '/' or '\\'")
	}
	c.PublishTimeout = cmp.Or(c.PublishTimeout, PublishTimeoutDefault)
	if c.Subject == nil {
		c.Subject = DefaultSubject
		if len(c.Subjects) == 0 {
			c.Subjects = queues
		}
		for _, q := range queues {
			if !validPublishSubject(q) {
				return nil, bad("Subject", q, "is nil, so queues are subjects, and this queue is not a valid NATS subject: set Subject")
			}
		}
	}
	for _, s := range c.Subjects {
		if !validFilterSubject(s) {
			return nil, bad("Subjects", s, "must be valid NATS subjects (tokens separated by '.', no white space, '*' or '>' as whole tokens, '>' last)")
		}
	}
	if c.Header == nil {
		c.Header = DefaultHeader
	}
	if c.Source == "" {
		c.Source = ob.Schema() + "." + ob.Table()
	}
	retry, err := maxRetryDelay(sc.Retry, c.MaxRetryDelay)
	if err != nil {
		return nil, err
	}

	r := &Relay{
		ob: ob, subject: c.Subject, header: c.Header, subjects: c.Subjects,
		source: c.Source, stream: c.Stream, warnOnly: c.WarnOnly, log: log,
	}
	r.sub, err = outbox.NewSubscriber(ob, queues, r.handle, &sc)
	if err != nil {
		return nil, err
	}
	run := r.sub.Config() // the subscriber's timing, defaults filled in
	r.redelivery = Redelivery{
		PublishTimeout: c.PublishTimeout, LeaseTTL: run.LeaseTTL, MaxRetryDelay: retry,
		MaxFetchInterval: run.MaxFetchInterval, Margin: redeliveryMargin,
	}
	// Each worker has at most one publish awaiting its ack; the margin
	// covers publishes a cancelled handler left behind until they time
	// out.
	r.js, err = jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(2*run.Workers),
		jetstream.WithPublishAsyncTimeout(c.PublishTimeout))
	if err != nil {
		return nil, fmt.Errorf("outboxjs: %w", err)
	}
	return r, nil
}

// ErrRunning is returned by [Relay.Run] when the relay is already
// running.
var ErrRunning = errors.New("outboxjs: Relay.Run called while the relay runs")

// Run checks the streams' duplicate windows ([Relay.Check]), then relays
// rows until ctx ends, and returns as [outbox.Subscriber.Run] does: within
// the subscriber's GracefulTimeout plus outbox.StopSlack after ctx ends.
// It returns the check's error without relaying anything when the check
// fails, unless Config.WarnOnly is set.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer r.running.Store(false)
	if err := r.Check(ctx); err != nil {
		if !r.warnOnly {
			return err
		}
		r.log.WarnContext(ctx, "outboxjs: relaying despite the stream check (Config.WarnOnly): rows may reach a stream twice",
			slog.Any("error", err))
	}
	err := r.sub.Run(ctx)
	// Publishes still awaiting an ack belong to handlers that were
	// abandoned; their rows keep their leases and are published again.
	r.js.CleanupPublisher()
	return err
}

// handle publishes one row and waits for its ack.
func (r *Relay) handle(ctx context.Context, m *outbox.Message[[]byte]) error {
	id := MsgID(r.source, m)
	subject, err := r.subject(m)
	if err != nil {
		return outbox.Reject(fmt.Errorf("outboxjs: Config.Subject: %w", err))
	}
	if !validPublishSubject(subject) {
		return outbox.Reject(fmt.Errorf("outboxjs: Config.Subject returned %q, not a subject to publish to", subject))
	}
	h, err := r.header(m)
	if err != nil {
		return outbox.Reject(fmt.Errorf("outboxjs: Config.Header: %w", err))
	}
	opts := []jetstream.PublishOpt{jetstream.WithMsgID(id)}
	if r.stream != "" {
		opts = append(opts, jetstream.WithExpectStream(r.stream))
	}
	if h == nil {
		h = nats.Header{} // the options set headers
	}
	// The options set the relay's own headers over the mapping's; one
	// the mapping wrote in another case would travel beside them.
	for k := range h {
		if strings.EqualFold(k, jetstream.MsgIDHeader) ||
			(r.stream != "" && strings.EqualFold(k, jetstream.ExpectedStreamHeader)) {
			delete(h, k)
		}
	}
	failed := func(err error) error {
		err = fmt.Errorf("outboxjs: publish %s to %s: %w", id, subject, err)
		if permanent(err) {
			// The same message would be refused the same way every
			// time, and would hold back its key's later rows.
			return outbox.Reject(err)
		}
		return err
	}
	f, err := r.js.PublishMsgAsync(&nats.Msg{Subject: subject, Header: h, Data: m.Payload}, opts...)
	if err != nil {
		return failed(err)
	}
	// The ack timeout (Config.PublishTimeout) ends every wait.
	select {
	case ack := <-f.Ok():
		if ack.Duplicate {
			r.log.DebugContext(ctx, "outboxjs: the stream already held this message; dropped as a duplicate",
				slog.String("msg_id", id), slog.String("stream", ack.Stream), slog.Uint64("seq", ack.Sequence))
		}
		return nil
	case err := <-f.Err():
		return failed(err)
	case <-ctx.Done():
		return fmt.Errorf("outboxjs: publish %s to %s: %w", id, subject, context.Cause(ctx))
	}
}

// MsgID returns the Nats-Msg-Id of row m of the outbox named source:
// source, the row's id and its creation time in microseconds since 1970,
// e.g. "public.outbox:4211:1733000000123456". It is the same at every
// delivery of the row. The creation time tells apart two rows that got
// the same id, as after the table is emptied with RESTART IDENTITY or
// dropped and migrated again.
func MsgID(source string, m *outbox.Message[[]byte]) string {
	return fmt.Sprintf("%s:%d:%d", source, m.ID, m.CreatedAt.UnixMicro())
}

// DefaultSubject is the default Config.Subject: the row's queue.
func DefaultSubject(m *outbox.Message[[]byte]) (string, error) { return m.Queue, nil }

// Headers the default Config.Header adds to the row's own.
const (
	// HeaderQueue carries the row's queue.
	HeaderQueue = "Outbox-Queue"
	// HeaderOrderingKey carries the row's ordering key, when it has one.
	HeaderOrderingKey = "Outbox-Ordering-Key"
)

// DefaultHeader is the default Config.Header: every header of the row,
// under its own key, plus [HeaderQueue] and, for a keyed row,
// [HeaderOrderingKey]. NATS trims white space around header values and
// turns line breaks in them into spaces.
//
// It drops every header of the row whose name starts with "Nats-", in
// any case (Nats-Msg-Id, Nats-Rollup, Nats-Expected-Last-Sequence,
// Nats-TTL, ...): JetStream obeys such headers as directives, and a
// row's headers are data, which must neither purge the stream's other
// messages, nor expire the message, nor make it unpublishable. The only
// JetStream headers a relayed message carries are those the relay sets:
// its own Nats-Msg-Id, and Nats-Expected-Stream when Config.Stream is
// set.
func DefaultHeader(m *outbox.Message[[]byte]) (nats.Header, error) {
	h := make(nats.Header, len(m.Headers)+3)
	for k, v := range m.Headers {
		if isDirective(k) {
			continue
		}
		h[k] = []string{v}
	}
	h[HeaderQueue] = []string{m.Queue}
	if m.OrderingKey != "" {
		h[HeaderOrderingKey] = []string{m.OrderingKey}
	}
	return h, nil
}

// directivePrefix starts the name of every header JetStream reads as a
// directive.
const directivePrefix = "Nats-"

// isDirective reports whether JetStream may read header k as a
// directive: its name starts with "Nats-", in any case.
func isDirective(k string) bool {
	return len(k) >= len(directivePrefix) && strings.EqualFold(k[:len(directivePrefix)], directivePrefix)
}
