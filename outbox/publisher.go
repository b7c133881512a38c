package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/msgtype"
)

// DBTX is what a [Publisher] writes through: the caller's pgx.Tx, or a
// *pgx.Conn or *pgxpool.Pool to publish in autocommit. Any sqlc-generated
// DBTX interface for pgx/v5 has the same method set.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
}

// Defaults of [PublisherConfig].
const (
	// PayloadMaxBytesDefault caps an encoded payload when
	// PublisherConfig.MaxPayloadBytes is zero: 1 MiB.
	PayloadMaxBytesDefault = 1 << 20
	// PayloadMaxBytesLimit is the largest MaxPayloadBytes accepted: 256 MiB.
	// An outbox row is read whole by every claim that takes it; bigger
	// documents belong in a table or object store the message points to.
	PayloadMaxBytesLimit = 256 << 20
	// QueueMaxBytes is the longest queue name.
	QueueMaxBytes = 255
)

// PublisherConfig configures a [Publisher]. A nil *PublisherConfig means
// every default.
type PublisherConfig[T any] struct {
	// Codec encodes messages. Default: DefaultCodec[T]() (JSON, or pass-
	// through for []byte and string).
	Codec Codec[T]

	// MaxPayloadBytes caps each encoded payload, in bytes. Default:
	// PayloadMaxBytesDefault (1 MiB); at most PayloadMaxBytesLimit.
	MaxPayloadBytes int

	// Metrics receives an EventPublished event per Publish or PublishBatch
	// call, successful or not. Default: none.
	Metrics MetricsRecorder

	// Logger receives the publisher's own problems (a panicking metrics
	// recorder). Default: slog.Default().
	Logger *slog.Logger

	// HeadersFrom, when set, adds headers taken from the context of each
	// Publish and PublishBatch call to its messages: a trace context, say
	// (contrib/otel's HeadersFrom). Headers in PublishOpts win over them,
	// and together they pass the checks PublishOpts.Headers does. A panic
	// in it fails the call with an error. Default: none.
	HeadersFrom func(ctx context.Context) map[string]string

	// Tier is where Publish and PublishBatch write rows. Default:
	// TierTable, the outbox table.
	Tier Tier
}

// Tier is where a [Publisher] writes its rows.
type Tier int

const (
	// TierTable writes rows into the outbox table: every delivery's state
	// lives on its row (lease, attempts, schedule), each row is inserted,
	// leased and deleted, and a row is claimable a moment after its
	// commit. Timers (PublishOpts.TimerID) live there.
	TierTable Tier = iota

	// TierRing writes rows into the outbox's ring, the log tier beside
	// its table (schema 13, `<table>_ring`): rows are appended and read
	// by snapshot difference per lane, with no write per row delivered,
	// and the ring empties a partition at once with TRUNCATE, so a held
	// vacuum horizon leaves no dead rows behind its writes. The rows that
	// need per-row state (retries, rows not yet due, handlers that run
	// on) move into the outbox table as their claim ends. Subscribers
	// claim from the ring as soon as their queues use it; a claim of the
	// ring takes more round trips than one of the table, so a quiet
	// queue's delivery waits longer on it. A claim reads a transaction's
	// rows of a lane whole (a lane's progress is a snapshot, which cannot
	// end inside a transaction), however many there are: a transaction of
	// a million rows of one queue makes claims of about a quarter of a
	// million each, held in memory and moved into the table as far as
	// their handlers have not run by the claim's end. Write large backfills
	// in transactions of thousands of rows.
	//
	// A key's rows keep their order when its publishers write into the
	// ring, or move from the table to the ring (a ring row of a key the
	// table holds goes behind the table's rows); a key written into both
	// tiers at once, or moved back to the table while the ring holds its
	// rows, may be delivered out of order. Timers are the table's:
	// PublishOpts.TimerID gives an *InputError. [Outbox.Row] and the
	// console's row page find a ring row only once it moves into the
	// table; QueueDepths, inspect and health count the ring's rows.
	TierRing
)

// String returns the tier's name: "table", "ring", or "Tier(n)".
func (t Tier) String() string {
	switch t {
	case TierTable:
		return "table"
	case TierRing:
		return "ring"
	}
	return fmt.Sprintf("Tier(%d)", int(t))
}

// Publisher writes messages of type T to one queue of an outbox, inside the
// caller's transaction. It is safe for concurrent use.
type Publisher[T any] struct {
	publisher
	codec Codec[T]
}

// publisher is what a Publisher does that does not depend on its message
// type: checks, headers, the statements, metrics. It is compiled once, not
// once per message type.
type publisher struct {
	ob          *Outbox
	queue       string
	contentType string
	messageType string
	maxPayload  int
	metrics     MetricsRecorder
	log         *slog.Logger
	headersFrom func(ctx context.Context) map[string]string
	tier        Tier
}

// ValidateQueue reports, as a *[ConfigError], whether name breaks the rule
// for queue names: 1 to QueueMaxBytes bytes of printable UTF-8.
func ValidateQueue(name string) error { return checkQueue("queue", name) }

// NewPublisher returns a publisher of T messages to queue. It validates its
// arguments and returns a *[ConfigError] naming the first one that breaks a
// rule; it does not touch the database.
//
// Every row it writes carries T's name in the message-type header
// ([HeaderMessageType]): T's type name without its package path, such as
// "OrderPlaced", or the name T's [MessageTyper] method returns, or the
// codec's when it names its messages ([CodecMessageTyper]).
// Subscribers of another type refuse the row. Interfaces and byte slices
// record no type.
func NewPublisher[T any](ob *Outbox, queue string, cfg *PublisherConfig[T]) (*Publisher[T], error) {
	var c PublisherConfig[T]
	if cfg != nil {
		c = *cfg
	}
	if c.Codec == nil {
		c.Codec = DefaultCodec[T]()
	}
	messageType, err := messageTypeOf(c.Codec)
	if err != nil {
		err = &ConfigError{Field: "T", Value: reflect.TypeFor[T]().String(), Rule: err.Error()}
	}
	core := publisher{ob: ob, queue: queue, messageType: messageType.Name, maxPayload: c.MaxPayloadBytes,
		metrics: c.Metrics, log: c.Logger, headersFrom: c.HeadersFrom, tier: c.Tier}
	if err := core.resolve(c.Codec, c.Codec.ContentType, err); err != nil {
		return nil, err
	}
	return &Publisher[T]{publisher: core, codec: c.Codec}, nil
}

// resolve checks p as NewPublisher filled it and applies its defaults,
// reporting the first error in this order: ob, queue, the codec (a nil
// pointer in codec; its content type from contentType, called only once
// the codec is known not to be one), the payload cap, the tier, then the
// message type's error typeErr.
func (p *publisher) resolve(codec any, contentType func() string, typeErr error) error {
	if p.ob == nil {
		return &ConfigError{Field: "ob", Value: "<nil>", Rule: "must not be nil"}
	}
	if err := checkQueue("queue", p.queue); err != nil {
		return err
	}
	if v := reflect.ValueOf(codec); v.Kind() == reflect.Pointer && v.IsNil() {
		return &ConfigError{Field: "PublisherConfig.Codec", Value: fmt.Sprintf("%T(nil)", codec), Rule: "must not be a nil pointer"}
	}
	switch {
	case p.maxPayload == 0:
		p.maxPayload = PayloadMaxBytesDefault
	case p.maxPayload < 0 || p.maxPayload > PayloadMaxBytesLimit:
		return &ConfigError{Field: "PublisherConfig.MaxPayloadBytes", Value: fmt.Sprint(p.maxPayload),
			Rule: fmt.Sprintf("must be between 1 and %d (PayloadMaxBytesLimit)", PayloadMaxBytesLimit)}
	}
	if p.tier != TierTable && p.tier != TierRing {
		return &ConfigError{Field: "PublisherConfig.Tier", Value: p.tier.String(), Rule: "must be TierTable or TierRing"}
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	p.contentType = contentType()
	if p.contentType == "" || !msgtype.Printable(p.contentType, true) {
		return &ConfigError{Field: "PublisherConfig.Codec", Value: fmt.Sprintf("%T", codec),
			Rule: "ContentType() must return a non-empty printable string"}
	}
	return typeErr
}

// Queue returns the queue this publisher writes to.
func (p *Publisher[T]) Queue() string { return p.queue }

// Publish writes msg as one outbox row through tx and returns the row's id.
//
// With a pgx.Tx the row becomes visible to subscribers when, and only if,
// the caller commits tx: Publish never begins, commits or rolls back the
// caller's transaction. With a pool or connection it commits at once.
// Subscribers listening on the outbox are notified on commit.
//
// A codec that returns a nil payload ([BytesCodec] given a nil slice)
// stores an empty one.
//
// Invalid options, an oversized payload or bad headers give an
// *[InputError] before any statement is sent, so tx stays usable. A timer
// id already held by a row of the queue gives [ErrTimerExists], and tx
// stays usable too.
func (p *Publisher[T]) Publish(ctx context.Context, tx DBTX, msg T, opts *PublishOpts) (int64, error) {
	start := time.Now()
	var (
		id      int64
		payload []byte
	)
	opts, err := p.prepare(ctx, tx, opts, false)
	if err == nil {
		payload, err = p.encode(msg, "msg", -1)
	}
	if err == nil {
		id, err = p.insert(ctx, tx, payload, opts)
	}
	p.observe(start, 1, len(payload), err)
	return id, err
}

// insert writes one row of payload.
func (p *publisher) insert(ctx context.Context, tx DBTX, payload []byte, opts *PublishOpts) (int64, error) {
	headers, err := encodeHeaders(opts.headers(), p.contentType, correlationID(opts), p.messageType)
	if err != nil {
		return 0, err
	}
	delay, notBefore := opts.schedule()
	q := p.ob.queries(tx)
	var id int64
	switch {
	case p.tier == TierRing:
		id, err = q.PublishRing(ctx, db.PublishRingParams{
			Queue: p.queue, Payload: payload, Headers: headers, OrderingKey: opts.orderingKey(),
			DelaySeconds: delay, NotBefore: notBefore,
		})
	case opts != nil && opts.TimerID != "":
		id, err = q.PublishTimer(ctx, db.PublishTimerParams{
			Queue: p.queue, Payload: payload, Headers: headers, OrderingKey: opts.orderingKey(),
			TimerID: opts.TimerID, DelaySeconds: delay, NotBefore: notBefore,
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, ErrTimerExists
		}
	default:
		id, err = q.Publish(ctx, db.PublishParams{
			Queue: p.queue, Payload: payload, Headers: headers, OrderingKey: opts.orderingKey(),
			DelaySeconds: delay, NotBefore: notBefore,
		})
	}
	if err != nil {
		return 0, p.writeError(ctx, "Publish", err)
	}
	return id, nil
}

// PublishBatch writes one row per message through tx in a single statement
// and returns their ids in the order of msgs. The transaction rules of
// [Publisher.Publish] apply; subscribers get one notification per batch.
//
// opts apply to every message (TimerID is not allowed). The messages of a
// batch share one correlation id: opts.CorrelationID, or one fresh id for
// the batch. No message is written unless all are valid. An empty msgs
// writes nothing.
func (p *Publisher[T]) PublishBatch(ctx context.Context, tx DBTX, msgs []T, opts *PublishOpts) ([]int64, error) {
	start := time.Now()
	var (
		ids  []int64
		size int
	)
	opts, err := p.prepare(ctx, tx, opts, true)
	if err == nil && len(msgs) > 0 {
		payloads := make([][]byte, len(msgs))
		for i, m := range msgs {
			if payloads[i], err = p.encode(m, "msgs", i); err != nil {
				break
			}
			size += len(payloads[i])
		}
		if err != nil {
			size = 0
		} else {
			ids, err = p.insertBatch(ctx, tx, payloads, opts)
		}
	}
	p.observe(start, len(msgs), size, err)
	return ids, err
}

// insertBatch writes one row per payload in one statement.
func (p *publisher) insertBatch(ctx context.Context, tx DBTX, payloads [][]byte, opts *PublishOpts) ([]int64, error) {
	headers, err := encodeHeaders(opts.headers(), p.contentType, correlationID(opts), p.messageType)
	if err != nil {
		return nil, err
	}
	delay, notBefore := opts.schedule()
	params := db.PublishBatchParams{
		Queue: p.queue, Headers: headers, OrderingKey: opts.orderingKey(),
		DelaySeconds: delay, NotBefore: notBefore, Payloads: payloads,
	}
	var ids []int64
	if p.tier == TierRing {
		ids, err = p.ob.queries(tx).PublishRingBatch(ctx, db.PublishRingBatchParams(params))
	} else {
		ids, err = p.ob.queries(tx).PublishBatch(ctx, params)
	}
	if err != nil {
		return nil, p.writeError(ctx, "PublishBatch", err)
	}
	if len(ids) != len(payloads) {
		return nil, fmt.Errorf("outbox: PublishBatch to %q: inserted %d rows for %d messages", p.queue, len(ids), len(payloads))
	}
	// Identity values are drawn in insertion order, which follows msgs.
	slices.Sort(ids)
	return ids, nil
}

// writeError is the error of method's INSERT that failed. A table it
// writes that does not exist (the outbox not migrated, or its schema
// older than the ring's, 13, for TierRing) gives the *SchemaError that
// names the fix, read on the outbox's own pool, since tx may be a
// transaction the failure aborted.
func (p *publisher) writeError(ctx context.Context, method string, err error) error {
	if se := p.ob.missingObject(ctx, err); se != nil {
		return se
	}
	return wrapOp(fmt.Sprintf("%s to %q", method, p.queue), err)
}

// prepare adds the headers HeadersFrom takes from ctx to opts and checks
// what every publish call shares, before anything is encoded or sent.
func (p *publisher) prepare(ctx context.Context, tx DBTX, opts *PublishOpts, batch bool) (*PublishOpts, error) {
	opts, err := p.contextHeaders(ctx, opts)
	if err != nil {
		return nil, err
	}
	return opts, p.check(tx, opts, batch)
}

// check validates what every publish call shares.
func (p *publisher) check(tx DBTX, opts *PublishOpts, batch bool) error {
	if tx == nil {
		return &InputError{Field: "tx", Rule: "must not be nil"}
	}
	if err := opts.check(batch); err != nil {
		return err
	}
	if p.tier == TierRing && opts != nil && opts.TimerID != "" {
		return &InputError{Field: "PublishOpts.TimerID", Rule: "timers live in the outbox table; this publisher writes into the ring (PublisherConfig.Tier)"}
	}
	reserved := len(HeaderContentType) + len(p.contentType) + len(HeaderCorrelationID) + max(len(correlationIDOf(opts)), 36)
	if p.messageType != "" {
		reserved += len(HeaderMessageType) + len(p.messageType)
	}
	return checkHeaders("PublishOpts.Headers", opts.headers(), reserved)
}

// contextHeaders returns opts with the headers HeadersFrom takes from ctx
// added under opts' own, or opts itself when there are none.
func (p *publisher) contextHeaders(ctx context.Context, opts *PublishOpts) (_ *PublishOpts, err error) {
	if p.headersFrom == nil {
		return opts, nil
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("outbox: PublisherConfig.HeadersFrom panicked: %v", r)
		}
	}()
	from := p.headersFrom(ctx)
	if len(from) == 0 {
		return opts, nil
	}
	var o PublishOpts
	if opts != nil {
		o = *opts
	}
	merged := maps.Clone(from)
	maps.Copy(merged, o.Headers)
	o.Headers = merged
	return &o, nil
}

// encode runs the codec and enforces the payload cap. Errors name field,
// indexed by i unless i is negative; the name is built only on failure.
func (p *Publisher[T]) encode(msg T, field string, i int) ([]byte, error) {
	b, err := encode(p.codec, msg)
	return p.payload(b, err, field, i)
}

// payload checks an encoded payload b (err: the codec's failure).
func (p *publisher) payload(b []byte, err *InputError, field string, i int) ([]byte, error) {
	if err == nil && b == nil {
		// The payload column is NOT NULL, and pgx sends a nil slice as
		// NULL: the violation would abort the caller's transaction.
		b = []byte{}
	}
	if err == nil && len(b) > p.maxPayload {
		err = &InputError{
			Rule: fmt.Sprintf("encoded payload is %d bytes; at most %d (PublisherConfig.MaxPayloadBytes)", len(b), p.maxPayload)}
	}
	if err != nil {
		err.Field = field
		if i >= 0 {
			err.Field = fmt.Sprintf("%s[%d]", field, i)
		}
		return nil, err
	}
	return b, nil
}

func (p *publisher) observe(start time.Time, count, size int, err error) {
	record(p.metrics, p.log, MetricEvent{
		Name: EventPublished, Queue: p.queue, Count: count, Bytes: size,
		Duration: time.Since(start), ErrorType: errorClass(err),
	})
}

func correlationIDOf(o *PublishOpts) string {
	if o == nil {
		return ""
	}
	return o.CorrelationID
}

// correlationID returns the caller's correlation id or a fresh one.
func correlationID(o *PublishOpts) string {
	if id := correlationIDOf(o); id != "" {
		return id
	}
	return uuid.NewString()
}

// checkQueue enforces the queue name rule: 1 to QueueMaxBytes bytes of
// printable UTF-8.
func checkQueue(field, q string) error {
	if q == "" || len(q) > QueueMaxBytes {
		return &ConfigError{Field: field, Value: q, Rule: fmt.Sprintf("must be 1 to %d bytes; is %d", QueueMaxBytes, len(q))}
	}
	if !msgtype.Printable(q, true) {
		return &ConfigError{Field: field, Value: q, Rule: "must be printable UTF-8"}
	}
	return nil
}

// checkQueueToRead enforces what reads of a queue need: a name the table
// can hold, 1 to QueueMaxBytes bytes. Other clients may have written rows
// to queues whose names break the rule for publishing and subscribing
// (control characters, say), and an operator must still be able to look
// at them.
func checkQueueToRead(field, q string) error {
	if q == "" || len(q) > QueueMaxBytes {
		return &ConfigError{Field: field, Value: q, Rule: fmt.Sprintf("must be 1 to %d bytes; is %d", QueueMaxBytes, len(q))}
	}
	return nil
}
