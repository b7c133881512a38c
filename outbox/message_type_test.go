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
		{"struct", messageTypeOf[order], "order"},
		{"pointer to struct", messageTypeOf[*order], "order"},
		{"generic", messageTypeOf[box[*order]], "box[order]"},
		{"generic of generic", messageTypeOf[box[map[string][]*box[order]]], "box[map[string][]box[order]]"},
		{"generic of a predeclared type", messageTypeOf[box[int]], "box[int]"},
		{"generic of an anonymous struct", messageTypeOf[box[struct {
			ID string `json:"id.x/y"`
		}]], `box[struct { ID string "json:\"id.x/y\"" }]`},
		{"slice", messageTypeOf[[]*order], "[]order"},
		{"array", messageTypeOf[[2]order], "[2]order"},
		{"map", messageTypeOf[map[string]order], "map[string]order"},
		{"string", messageTypeOf[string], "string"},
		{"int", messageTypeOf[int], "int"},
		{"bytes", messageTypeOf[[]byte], ""},
		{"raw JSON", messageTypeOf[json.RawMessage], ""},
		{"any", messageTypeOf[any], ""},
		{"named interface", messageTypeOf[error], ""},
		{"map of any", messageTypeOf[map[string]any], ""},
		{"anonymous struct", messageTypeOf[struct{ ID string }], ""},
		{"named by a value method", messageTypeOf[namedByValue], "shop.order.v1"},
		{"pointer to a type named by a value method", messageTypeOf[*namedByValue], "shop.order.v1"},
		{"named by a pointer method", messageTypeOf[namedByPointer], "shop.order.v1"},
		{"named empty", messageTypeOf[unnamed], ""},
	}
	for _, tt := range tests {
		got, err := tt.got()
		if err != nil || got.Name != tt.want {
			t.Errorf("%s: %q, %v; want %q", tt.name, got.Name, err, tt.want)
		}
	}
	for name, f := range map[string]func() (msgtype.Type, error){
		"non-printable": messageTypeOf[badName], "panicking": messageTypeOf[panickyName],
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
	if _, err := newPublisher[order](t, e, "orders", nil).PublishBatch(e.ctx, e.db.Pool, []order{{ID: "o-1"}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, h := e.claimOne("orders"); h[HeaderMessageType] != "order" {
		t.Errorf("headers %v", h)
	}
	if _, err := newPublisher[namedByPointer](t, e, "named", nil).Publish(e.ctx, e.db.Pool, namedByPointer{}, nil); err != nil {
		t.Fatal(err)
	}
	if _, h := e.claimOne("named"); h[HeaderMessageType] != "shop.order.v1" {
		t.Errorf("headers %v", h)
	}
	if _, err := newPublisher[[]byte](t, e, "raw", nil).Publish(e.ctx, e.db.Pool, []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	if _, h := e.claimOne("raw"); len(h) != 2 || h[HeaderMessageType] != "" {
		t.Errorf("raw bytes recorded a message type: %v", h)
	}

	// The header is reserved, and counts toward HeadersMaxBytes.
	pub := newPublisher[order](t, e, "orders", nil)
	var in *InputError
	if _, err := pub.Publish(e.ctx, e.db.Pool, order{}, &PublishOpts{Headers: map[string]string{HeaderMessageType: "x"}}); !errors.As(err, &in) || in.Field != `PublishOpts.Headers["message-type"]` {
		t.Errorf("caller-set message-type: %v, want an *InputError", err)
	}
	const corr = "c"
	reserved := len(HeaderContentType+ContentTypeJSON+HeaderCorrelationID) + 36 + len(HeaderMessageType+pub.messageType)
	fits := &PublishOpts{CorrelationID: corr, Headers: map[string]string{"k": strings.Repeat("v", HeadersMaxBytes-reserved-1)}}
	if _, err := pub.Publish(e.ctx, e.db.Pool, order{}, fits); err != nil {
		t.Errorf("headers of exactly HeadersMaxBytes: %v", err)
	}
	fits.Headers["k"] += "v"
	if _, err := pub.Publish(e.ctx, e.db.Pool, order{}, fits); !errors.As(err, &in) || in.Field != "PublishOpts.Headers" {
		t.Errorf("headers one byte over HeadersMaxBytes: %v, want an *InputError", err)
	}
}

func TestSubscriberOfAnotherTypeDeadLettersTheRow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id, err := newPublisher[order](t, e, "mixed", nil).Publish(e.ctx, e.db.Pool, order{ID: "o-1", Total: 5}, nil)
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
	if _, err := newPublisher[namedByValue](t, e, "mixed", nil).Publish(e.ctx, e.db.Pool, namedByValue{ID: "named"}, nil); err != nil {
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

	if _, err := newPublisher[order](t, e, "mixed", nil).Publish(e.ctx, e.db.Pool, order{ID: "o-2"}, nil); err != nil {
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
