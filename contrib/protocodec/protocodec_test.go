package protocodec_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/outboxgen/outboxgen/contrib/protocodec"
	"github.com/outboxgen/outboxgen/contrib/protocodec/shopv1"
	"github.com/outboxgen/outboxgen/outbox"
	"github.com/outboxgen/outboxgen/outbox/outboxtest"
)

func TestMain(m *testing.M) { outboxtest.Main(m) }

// order is a message with every kind of field the contract has.
func order(id string) *shopv1.OrderPlaced {
	return &shopv1.OrderPlaced{
		OrderId:    id,
		CustomerId: "cus_2930",
		Lines: []*shopv1.Line{
			{Sku: "SKU-31002", Quantity: 2, UnitPrice: &shopv1.Money{MinorUnits: 450, Currency: "EUR"}},
			{Sku: "SKU-10421", Quantity: 1, UnitPrice: &shopv1.Money{MinorUnits: 12050, Currency: "EUR"}},
		},
		Total:    &shopv1.Money{MinorUnits: 12950, Currency: "EUR"},
		PlacedAt: timestamppb.New(time.Date(2026, 12, 7, 12, 36, 15, 0, time.UTC)),
	}
}

type codec = protocodec.Codec[*shopv1.OrderPlaced]

// Both formats give back the message they were given; the wire format is
// proto's, protojson's is JSON with the proto field names.
func TestCodecRoundTrips(t *testing.T) {
	t.Parallel()
	for _, c := range []codec{{}, {JSON: true}} {
		b, err := c.Encode(order("ord_1"))
		if err != nil {
			t.Fatalf("%+v: Encode: %v", c, err)
		}
		got, err := c.Decode(b)
		if err != nil {
			t.Fatalf("%+v: Decode: %v", c, err)
		}
		if diff := cmp.Diff(order("ord_1"), got, protocmp.Transform()); diff != "" {
			t.Errorf("%+v: round trip (-want +got):\n%s", c, diff)
		}
		if c.JSON != strings.Contains(string(b), `"orderId":"ord_1"`) {
			t.Errorf("%+v wrote %q", c, b)
		}
		if c.JSON {
			continue
		}
		want, _ := proto.Marshal(order("ord_1"))
		if diff := cmp.Diff(want, b); diff != "" {
			t.Errorf("the wire format differs from proto.Marshal's (-want +got):\n%s", diff)
		}
	}
}

// The codec names its messages by their full name, says which content
// types it reads, refuses a nil message and a payload of another format,
// and keeps the fields a newer contract added.
func TestCodecContract(t *testing.T) {
	t.Parallel()
	bin, js := codec{}, codec{JSON: true}
	if got := bin.MessageType(); got != "shop.v1.OrderPlaced" {
		t.Errorf("MessageType = %q, want shop.v1.OrderPlaced", got)
	}
	if bin.ContentType() != protocodec.ContentTypeProto || js.ContentType() != outbox.ContentTypeJSON {
		t.Errorf("content types %q, %q", bin.ContentType(), js.ContentType())
	}
	for _, c := range []struct {
		codec codec
		ct    string
		want  bool
	}{
		{bin, protocodec.ContentTypeProto, true}, {bin, protocodec.ContentTypeProtoIANA, true}, {bin, outbox.ContentTypeJSON, false},
		{js, outbox.ContentTypeJSON, true}, {js, protocodec.ContentTypeProto, false},
	} {
		if got := c.codec.Accepts(c.ct); got != c.want {
			t.Errorf("%+v.Accepts(%q) = %v, want %v", c.codec, c.ct, got, c.want)
		}
	}
	for _, c := range []codec{bin, js} {
		if _, err := c.Encode(nil); err == nil || !strings.Contains(err.Error(), "nil message") {
			t.Errorf("%+v: Encode(nil) = %v; want the nil message refused", c, err)
		}
		if _, err := c.Decode([]byte("\xff\xff not a message")); err == nil {
			t.Errorf("%+v: Decode of garbage gave no error", c)
		}
	}
	// A field this contract does not know (number 99), as a newer
	// publisher writes it: read, and kept when written again.
	newer := append(must(bin.Encode(order("ord_2"))), 0x9a, 0x06, 0x03, 'n', 'e', 'w')
	m, err := bin.Decode(newer)
	if err != nil {
		t.Fatalf("Decode of a newer contract's row: %v", err)
	}
	if again := must(bin.Encode(m)); string(again) != string(newer) {
		t.Errorf("the unknown field was not kept: %x, want %x", again, newer)
	}
	if _, err := js.Decode([]byte(`{"orderId":"ord_3","addedLater":true}`)); err != nil {
		t.Errorf("protojson Decode of a newer contract's row: %v", err)
	}
	// An interface type encodes, and decodes nothing.
	var iface protocodec.Codec[proto.Message]
	if iface.MessageType() != "" {
		t.Errorf("Codec[proto.Message].MessageType = %q, want none", iface.MessageType())
	}
	if _, err := iface.Decode(must(bin.Encode(order("ord_4")))); err == nil {
		t.Error("Codec[proto.Message] decoded a row")
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// Through an outbox: a publisher with the codec records the full name, a
// subscriber with it receives equal messages, outboxtest reads them with
// it, and a subscriber of the same Go type without it refuses the rows
// (reason decode_error): the contract is the name, not the Go type.
func TestPublishAndSubscribeThroughAnOutbox(t *testing.T) {
	t.Parallel()
	f := outboxtest.New(t, outboxtest.Connect(t), nil)
	for _, c := range []codec{{}, {JSON: true}} {
		queue := "orders.bin"
		if c.JSON {
			queue = "orders.json"
		}
		pub, err := outbox.NewPublisher(f.Outbox, queue, &outbox.PublisherConfig[*shopv1.OrderPlaced]{Codec: c})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pub.PublishBatch(t.Context(), f.Pool, []*shopv1.OrderPlaced{order("ord_1"), order("ord_2")}, nil); err != nil {
			t.Fatal(err)
		}
		outboxtest.RequirePublishedBy(t, f.Outbox, queue, outbox.Codec[*shopv1.OrderPlaced](c), []cmp.Option{protocmp.Transform()},
			order("ord_1"), order("ord_2"))
		rows, err := f.Outbox.Unprocessed(t.Context(), queue, 10)
		if err != nil || len(rows) != 2 || rows[0].Headers[outbox.HeaderMessageType] != "shop.v1.OrderPlaced" ||
			rows[0].Headers[outbox.HeaderContentType] != c.ContentType() {
			t.Fatalf("rows %+v, %v; want two of message type shop.v1.OrderPlaced and content type %s", rows, err, c.ContentType())
		}
		var got []*shopv1.OrderPlaced
		outboxtest.Drain(t, f.Outbox, []string{queue}, func(_ context.Context, m *outbox.Message[*shopv1.OrderPlaced]) error {
			got = append(got, m.Payload)
			return nil
		}, &outbox.SubscriberConfig[*shopv1.OrderPlaced]{Codec: c, Workers: 1}, 0)
		if diff := cmp.Diff([]*shopv1.OrderPlaced{order("ord_1"), order("ord_2")}, got, protocmp.Transform()); diff != "" {
			t.Errorf("%+v: delivered (-want +got):\n%s", c, diff)
		}
	}
	// The same Go type with another codec reads another message type.
	pub, err := outbox.NewPublisher(f.Outbox, "orders.mixed", &outbox.PublisherConfig[*shopv1.OrderPlaced]{Codec: codec{JSON: true}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(t.Context(), f.Pool, order("ord_9"), nil); err != nil {
		t.Fatal(err)
	}
	outboxtest.Drain(t, f.Outbox, []string{"orders.mixed"}, func(context.Context, *outbox.Message[*shopv1.OrderPlaced]) error {
		t.Error("a subscriber with encoding/json's codec decoded a protojson row")
		return nil
	}, &outbox.SubscriberConfig[*shopv1.OrderPlaced]{Retry: outbox.NoRetry{}}, 0)
	dead, err := f.Outbox.DeadLetters(t.Context(), outbox.DeadLetterFilter{Queue: "orders.mixed"}, 0, 10)
	if err != nil || len(dead) != 1 || dead[0].Reason != outbox.ReasonDecodeError ||
		!strings.Contains(dead[0].LastError, `message type "shop.v1.OrderPlaced"; this subscriber reads "OrderPlaced"`) {
		t.Errorf("dead letters %+v, %v; want the row refused for its message type", dead, err)
	}
}
