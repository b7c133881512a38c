package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/internal/msgtype"
	"github.com/outboxgen/outboxgen/internal/msgtype/othertypes"
)

type shipment struct {
	ID      string `json:"id"`
	Carrier string `json:"carrier"`
}

type box[T any] struct{ V T }

// namedByValue and namedByPointer choose their message type names.
type namedByValue struct{ ID string }

func (namedByValue) OutboxMessageType() string { return "shop.order.v1" }

type namedByPointer struct{ ID string }

func (*namedByPointer) OutboxMessageType() string { return "shop.order.v1" }

type unnamed struct{}

func (unnamed) OutboxMessageType() string { return "" }

type badName struct{}

func (badName) OutboxMessageType() string { return "a\nb" }

type panickyName struct{ p *int }

func (n panickyName) OutboxMessageType() string { return string(rune(*n.p)) }

func TestMessageTypeNames(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		got  func() (msgtype.Type, error)
		want string
	}{
		{"struct", typeOf[order], "order"},
		{"pointer to struct", typeOf[*order], "order"},
		{"generic", typeOf[box[*order]], "box[order]"},
		{"generic of generic", typeOf[box[map[string][]*box[order]]], "box[map[string][]box[order]]"},
		{"generic of a predeclared type", typeOf[box[int]], "box[int]"},
		{"generic of an anonymous struct", typeOf[box[struct {
			ID string `json:"id.x/y"`
		}]], `box[struct { ID string "json:\"id.x/y\"" }]`},
		{"slice", typeOf[[]*order], "[]order"},
		{"array", typeOf[[2]order], "[2]order"},
		{"map", typeOf[map[string]order], "map[string]order"},
		{"string", typeOf[string], "string"},
		{"int", typeOf[int], "int"},
		{"bytes", typeOf[[]byte], ""},
		{"raw JSON", typeOf[json.RawMessage], ""},
		{"any", typeOf[any], ""},
		{"named interface", typeOf[error], ""},
		{"map of any", typeOf[map[string]any], ""},
		{"anonymous struct", typeOf[struct{ ID string }], ""},
		{"named by a value method", typeOf[namedByValue], "shop.order.v1"},
		{"pointer to a type named by a value method", typeOf[*namedByValue], "shop.order.v1"},
		{"named by a pointer method", typeOf[namedByPointer], "shop.order.v1"},
		{"named empty", typeOf[unnamed], ""},
	}
	for _, tt := range tests {
		got, err := tt.got()
		if err != nil || got.Name != tt.want {
			t.Errorf("%s: %q, %v; want %q", tt.name, got.Name, err, tt.want)
		}
	}
	for name, f := range map[string]func() (msgtype.Type, error){
		"non-printable": typeOf[badName], "panicking": typeOf[panickyName],
	} {
		if got, err := f(); err == nil {
			t.Errorf("%s name: %q, want an error", name, got.Name)
		}
	}
	ob, err := New(unreachablePool(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	var ce *ConfigError
	if _, err := NewPublisher[badName](ob, "q", nil); !errors.As(err, &ce) || ce.Field != "T" {
		t.Errorf("NewPublisher of a type with a bad name: %v, want a *ConfigError for T", err)
	}
}

func TestPublishRecordsTheMessageType(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if _, err := newPublisher[order](t, e, "orders", nil).PublishBatch(e.ctx, e.pubPool, []order{{ID: "o-1"}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, h := e.claimOne("orders"); h[HeaderMessageType] != "order" {
		t.Errorf("headers %v", h)
	}
	if _, err := newPublisher[namedByPointer](t, e, "named", nil).Publish(e.ctx, e.pubPool, namedByPointer{}, nil); err != nil {
		t.Fatal(err)
	}
	if _, h := e.claimOne("named"); h[HeaderMessageType] != "shop.order.v1" {
		t.Errorf("headers %v", h)
	}
	if _, err := newPublisher[[]byte](t, e, "raw", nil).Publish(e.ctx, e.pubPool, []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	if _, h := e.claimOne("raw"); len(h) != 2 || h[HeaderMessageType] != "" {
		t.Errorf("raw bytes recorded a message type: %v", h)
	}

	// The header is reserved, and counts toward HeadersMaxBytes.
	pub := newPublisher[order](t, e, "orders", nil)
	var in *InputError
	if _, err := pub.Publish(e.ctx, e.pubPool, order{}, &PublishOpts{Headers: map[string]string{HeaderMessageType: "x"}}); !errors.As(err, &in) || in.Field != `PublishOpts.Headers["message-type"]` {
		t.Errorf("caller-set message-type: %v, want an *InputError", err)
	}
	const corr = "c"
	reserved := len(HeaderContentType+ContentTypeJSON+HeaderCorrelationID) + 36 + len(HeaderMessageType+pub.messageType)
	fits := &PublishOpts{CorrelationID: corr, Headers: map[string]string{"k": strings.Repeat("v", HeadersMaxBytes-reserved-1)}}
	if _, err := pub.Publish(e.ctx, e.pubPool, order{}, fits); err != nil {
		t.Errorf("headers of exactly HeadersMaxBytes: %v", err)
	}
	fits.Headers["k"] += "v"
	if _, err := pub.Publish(e.ctx, e.pubPool, order{}, fits); !errors.As(err, &in) || in.Field != "PublishOpts.Headers" {
		t.Errorf("headers one byte over HeadersMaxBytes: %v, want an *InputError", err)
	}
}

func TestSubscriberOfAnotherTypeDeadLettersTheRow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id, err := newPublisher[order](t, e, "mixed", nil).Publish(e.ctx, e.pubPool, order{ID: "o-1", Total: 5}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := &events{}
	sub := startSub(t, e.ob, []string{"mixed"}, func(context.Context, *Message[shipment]) error {
		t.Error("handler ran for an order")
		return nil
	}, fastConfig[shipment](rec))
	eventually(t, "the dead letter", func() bool { return len(rec.named(EventDeadLettered)) == 1 })
	got, _ := e.dlqRow(id)
	wantErr := `message type "order"; this subscriber reads "shipment"`
	if got.FailureReason != ReasonDecodeError || !strings.Contains(deref(got.LastError), wantErr) {
		t.Errorf("DLQ row %+v: %s; want reason %s and %s", got, deref(got.LastError), ReasonDecodeError, wantErr)
	}
	if err := sub.stop(); err != nil {
		t.Fatal(err)
	}

	// Rows without the header (plain SQL) and rows of a type with the
	// same chosen name reach a typed subscriber; raw bytes take anything.
	e.exec(`INSERT INTO outbox (queue, payload, headers) VALUES ('mixed', '{"id": "sql"}', '{"content-type": "application/json"}')`)
	if _, err := newPublisher[namedByValue](t, e, "mixed", nil).Publish(e.ctx, e.pubPool, namedByValue{ID: "named"}, nil); err != nil {
		t.Fatal(err)
	}
	typed := make(chan string, 2)
	sub = startSub(t, e.ob, []string{"mixed"}, func(_ context.Context, m *Message[*namedByPointer]) error {
		typed <- m.Payload.ID + " " + m.MessageType()
		return nil
	}, fastConfig[*namedByPointer](nil))
	got2 := []string{receive(t, typed), receive(t, typed)}
	slices.Sort(got2)
	if diff := cmp.Diff([]string{"named shop.order.v1", "sql "}, got2); diff != "" {
		t.Errorf("typed subscriber (-want +got):\n%s", diff)
	}
	if err := sub.stop(); err != nil {
		t.Fatal(err)
	}

	if _, err := newPublisher[order](t, e, "mixed", nil).Publish(e.ctx, e.pubPool, order{ID: "o-2"}, nil); err != nil {
		t.Fatal(err)
	}
	raw := make(chan string, 1)
	startSub(t, e.ob, []string{"mixed"}, func(_ context.Context, m *Message[[]byte]) error {
		raw <- string(m.Payload)
		return nil
	}, fastConfig[[]byte](nil))
	if got := receive(t, raw); got != `{"id":"o-2","total":0}` {
		t.Errorf("raw subscriber got %s", got)
	}
}

// receive waits up to 20 s for a value from ch.
func receive[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatal("timed out waiting for a delivery")
		panic("unreachable")
	}
}

// Order and Envelope have namesakes of the same JSON in othertypes.
type Order struct {
	ID    string `json:"id"`
	Total int    `json:"total"`
}

type Envelope[T any] struct {
	Body T `json:"body"`
}

// othertypesPath is the package path that publishers of earlier releases
// recorded for the types of othertypes.
const othertypesPath = "github.com/outboxgen/outboxgen/internal/msgtype/othertypes"

// readQueue runs a subscriber of T over queue until it handled delivered
// rows and dead-lettered deadLettered, stops it, and returns each handled
// row as "id message-type", sorted.
func readQueue[T any](t *testing.T, e *env, queue string, id func(T) string, delivered, deadLettered int) []string {
	t.Helper()
	rec := &events{}
	got := make(chan string, delivered)
	sub := startSub(t, e.ob, []string{queue}, func(_ context.Context, m *Message[T]) error {
		got <- id(m.Payload) + " " + m.MessageType()
		return nil
	}, fastConfig[T](rec))
	out := make([]string, 0, delivered)
	for range delivered {
		out = append(out, receive(t, got))
	}
	eventually(t, "the dead letters", func() bool { return len(rec.named(EventDeadLettered)) >= deadLettered })
	if err := sub.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := len(rec.named(EventDeadLettered)); n != deadLettered {
		t.Errorf("%d rows dead-lettered, want %d", n, deadLettered)
	}
	slices.Sort(out)
	return out
}

// insertTyped writes a row of queue with payload and the message-type
// header messageType through plain SQL, as another publisher (an earlier
// release, say) would, and returns its id.
func (e *env) insertTyped(queue, payload, messageType string) int64 {
	e.t.Helper()
	var id int64
	headers, _ := json.Marshal(map[string]string{HeaderContentType: ContentTypeJSON, HeaderMessageType: messageType})
	if err := e.db.Pool.QueryRow(e.ctx, `INSERT INTO outbox (queue, payload, headers) VALUES ($1, $2, $3) RETURNING id`,
		queue, payload, headers).Scan(&id); err != nil {
		e.t.Fatal(err)
	}
	return id
}

// wantDecodeError checks that the row id was dead-lettered as a
// decode_error with an error containing want.
func (e *env) wantDecodeError(id int64, want string) {
	e.t.Helper()
	got, ok := e.dlqRow(id)
	if !ok || got.FailureReason != ReasonDecodeError || !strings.Contains(deref(got.LastError), want) {
		e.t.Errorf("dead letter of row %d: %+v, %s; want reason %s and %s", id, got, deref(got.LastError), ReasonDecodeError, want)
	}
}

func TestMessageTypeSurvivesAMoveBetweenPackages(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// Rows in flight when Order moved here from othertypes: published by
	// this release, and by an earlier one, which recorded the old package
	// path and so names the type that was there, not this one.
	if _, err := newPublisher[othertypes.Order](t, e, "moved", nil).Publish(e.ctx, e.pubPool, othertypes.Order{ID: "o-1", Total: 5}, nil); err != nil {
		t.Fatal(err)
	}
	oldOrder := e.insertTyped("moved", `{"id": "o-2", "total": 7}`, othertypesPath+".Order")
	// A message of another type, today's and an earlier release's, is
	// refused.
	ship, err := newPublisher[*othertypes.Shipment](t, e, "moved", nil).Publish(e.ctx, e.pubPool, &othertypes.Shipment{ID: "s-1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	oldShip := e.insertTyped("moved", `{"id": "s-2"}`, othertypesPath+".Shipment")

	got := readQueue(t, e, "moved", func(o Order) string { return o.ID }, 1, 3)
	want := []string{"o-1 Order"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Subscriber[Order] after the move (-want +got):\n%s", diff)
	}
	e.wantDecodeError(oldOrder, `message type "`+othertypesPath+`.Order"; this subscriber reads "Order", or "`+outboxPath+`.Order"`)
	e.wantDecodeError(ship, `message type "Shipment"; this subscriber reads "Order"`)
	e.wantDecodeError(oldShip, `message type "`+othertypesPath+`.Shipment"; this subscriber reads "Order"`)

	// And back: the type's old package reads what its new one published.
	if _, err := newPublisher[Order](t, e, "moved.back", nil).Publish(e.ctx, e.pubPool, Order{ID: "o-3"}, nil); err != nil {
		t.Fatal(err)
	}
	e.insertTyped("moved.back", `{"id": "o-4"}`, othertypesPath+".Order")
	got = readQueue(t, e, "moved.back", func(o *othertypes.Order) string { return o.ID }, 2, 0)
	want = []string{"o-3 Order", "o-4 " + othertypesPath + ".Order"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Subscriber[*othertypes.Order] (-want +got):\n%s", diff)
	}
}

func TestGenericMessageTypesSurviveAMoveBetweenPackages(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher[othertypes.Envelope[*othertypes.Order]](t, e, "envelopes", nil)
	if _, err := pub.Publish(e.ctx, e.pubPool, othertypes.Envelope[*othertypes.Order]{Body: &othertypes.Order{ID: "o-1"}}, nil); err != nil {
		t.Fatal(err)
	}
	// An earlier release's row names the package the type was in.
	old := e.insertTyped("envelopes", `{"body": {"id": "o-2"}}`, othertypesPath+".Envelope[*"+othertypesPath+".Order]")
	ship, err := newPublisher[othertypes.Envelope[othertypes.Shipment]](t, e, "envelopes", nil).
		Publish(e.ctx, e.pubPool, othertypes.Envelope[othertypes.Shipment]{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := readQueue(t, e, "envelopes", func(m Envelope[Order]) string { return m.Body.ID }, 1, 2)
	want := []string{"o-1 Envelope[Order]"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Subscriber[Envelope[Order]] (-want +got):\n%s", diff)
	}
	e.wantDecodeError(old, `this subscriber reads "Envelope[Order]", or "`+outboxPath+`.Envelope[`+outboxPath+`.Order]"`)
	e.wantDecodeError(ship, `message type "Envelope[Shipment]"; this subscriber reads "Envelope[Order]"`)
}

func TestChosenMessageTypesMatchExactly(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// A chosen name is a contract: the package-qualified spelling of the
	// Go type's name, or its bare name, is another message type.
	bare := e.insertTyped("named", `{"ID": "n-1"}`, "namedByValue")
	qualified := e.insertTyped("named", `{"ID": "n-2"}`, "github.com/outboxgen/outboxgen/outbox.namedByValue")
	e.insertTyped("named", `{"ID": "n-3"}`, "shop.order.v1")
	got := readQueue(t, e, "named", func(n namedByValue) string { return n.ID }, 1, 2)
	if diff := cmp.Diff([]string{"n-3 shop.order.v1"}, got); diff != "" {
		t.Errorf("Subscriber[namedByValue] (-want +got):\n%s", diff)
	}
	e.wantDecodeError(bare, `message type "namedByValue"; this subscriber reads "shop.order.v1"`)
	e.wantDecodeError(qualified, `this subscriber reads "shop.order.v1"`)
}

// outboxPath is the package path that publishers of earlier releases
// recorded for this package's types.
const outboxPath = "github.com/outboxgen/outboxgen/outbox"

// A package-qualified message type, as earlier releases wrote it, names
// the package of each type in it: a subscriber reads it only when its own
// type is of those packages, and a row of another package's namesake of
// the same JSON is dead-lettered, never decoded.
func TestQualifiedMessageTypeIsReadOnlyByTheTypesOfItsPackages(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.insertTyped("orders", `{"id": "o-1", "total": 5}`, outboxPath+".Order")
	billing := e.insertTyped("orders", `{"id": "o-2", "total": 7}`, othertypesPath+".Order")
	got := readQueue(t, e, "orders", func(o Order) string { return o.ID }, 1, 1)
	if diff := cmp.Diff([]string{"o-1 " + outboxPath + ".Order"}, got); diff != "" {
		t.Errorf("Subscriber[Order] (-want +got):\n%s", diff)
	}
	e.wantDecodeError(billing, `message type "`+othertypesPath+`.Order"; this subscriber reads "Order", or "`+outboxPath+`.Order" as earlier releases spelled it`)

	// A generic type's arguments name their packages too; pointer stars
	// do not matter, as JSON encodes *T as T.
	e.insertTyped("envelopes", `{"body": {"id": "e-1"}}`, outboxPath+".Envelope[*"+outboxPath+".Order]")
	foreignBody := e.insertTyped("envelopes", `{"body": {"id": "e-2"}}`, outboxPath+".Envelope["+othertypesPath+".Order]")
	foreign := e.insertTyped("envelopes", `{"body": {"id": "e-3"}}`, othertypesPath+".Envelope[*"+othertypesPath+".Order]")
	got = readQueue(t, e, "envelopes", func(m Envelope[*Order]) string { return m.Body.ID }, 1, 2)
	if diff := cmp.Diff([]string{"e-1 " + outboxPath + ".Envelope[*" + outboxPath + ".Order]"}, got); diff != "" {
		t.Errorf("Subscriber[Envelope[*Order]] (-want +got):\n%s", diff)
	}
	for _, id := range []int64{foreignBody, foreign} {
		e.wantDecodeError(id, `this subscriber reads "Envelope[Order]", or "`+outboxPath+`.Envelope[*`+outboxPath+`.Order]" as earlier releases spelled it`)
	}
}

// typeOf is the message type of T with a codec that names nothing.
func typeOf[T any]() (msgtype.Type, error) { return messageTypeOf[T](nil) }

// namingCodec is JSON whose format names its messages (as Protocol
// Buffers' full names do): CodecMessageTyper.
type namingCodec[T any] struct {
	JSONCodec[T]
	name func() string
}

func (c namingCodec[T]) MessageType() string { return c.name() }

// A codec that names its messages decides the message type: publishers
// with it record its name, not the Go type's; subscribers with it read
// only that name, and subscribers of the same Go type without it refuse
// it. A name that panics or is not printable is a ConfigError.
func TestACodecThatNamesItsMessagesDecidesTheMessageType(t *testing.T) {
	t.Parallel()
	e := setup(t)
	named := namingCodec[Order]{name: func() string { return "shop.v1.Order" }}
	pub, err := NewPublisher(e.ob, "codec-named", &PublisherConfig[Order]{Codec: named})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(e.ctx, e.pubPool, Order{ID: "o-1"}, nil); err != nil {
		t.Fatal(err)
	}
	bare := e.insertTyped("codec-named", `{"id": "o-2"}`, "Order")
	got := make(chan string, 2)
	cfg := fastConfig[Order](nil)
	cfg.Codec = named
	sub := startSub(t, e.ob, []string{"codec-named"}, func(_ context.Context, m *Message[Order]) error {
		got <- m.Payload.ID + " " + m.MessageType()
		return nil
	}, cfg)
	if r := receive(t, got); r != "o-1 shop.v1.Order" {
		t.Errorf("delivered %q, want o-1 shop.v1.Order", r)
	}
	eventually(t, "the Go type's name dead-lettered", func() bool { _, ok := e.dlqRow(bare); return ok })
	if err := sub.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.wantDecodeError(bare, `message type "Order"; this subscriber reads "shop.v1.Order"`)
	// Without the codec, the same Go type reads its own name only.
	plain := e.insertTyped("codec-plain", `{"id": "o-3"}`, "shop.v1.Order")
	if diff := cmp.Diff([]string{}, readQueue(t, e, "codec-plain", func(o Order) string { return o.ID }, 0, 1)); diff != "" {
		t.Errorf("a subscriber without the codec (-want +got):\n%s", diff)
	}
	e.wantDecodeError(plain, `this subscriber reads "Order"`)

	for _, name := range []func() string{func() string { panic("no descriptor") }, func() string { return "a\nb" }} {
		_, err := NewPublisher(e.ob, "codec-named", &PublisherConfig[Order]{Codec: namingCodec[Order]{name: name}})
		var ce *ConfigError
		if !errors.As(err, &ce) || !strings.Contains(ce.Rule, "MessageType") {
			t.Errorf("NewPublisher with a codec whose MessageType fails = %v; want a *ConfigError naming it", err)
		}
	}
}
