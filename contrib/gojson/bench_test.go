package outboxgojson_test

import (
	"testing"

	outboxgojson "github.com/outboxgen/outboxgen/contrib/gojson"
	"github.com/outboxgen/outboxgen/outbox"
)

// orderPayload is a typical payload: an Order of 105 bytes.
const orderPayload = `{"order_id":"ord_100204","customer_id":"cus_2930","total":{"amount":"129.50","currency":"EUR"},"lines":2}`

var order = Order{OrderID: "ord_100204", CustomerID: "cus_2930", Total: Money{Amount: "129.50", Currency: "EUR"}, Lines: 2}

func BenchmarkDecode(b *testing.B) {
	for _, c := range []struct {
		name  string
		codec outbox.Codec[Order]
	}{
		{"encoding/json", outbox.JSONCodec[Order]{}},
		{"goccy", outboxgojson.Codec[Order]{}},
	} {
		b.Run(c.name, func(b *testing.B) {
			payload := []byte(orderPayload)
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.codec.Decode(payload); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkEncode(b *testing.B) {
	for _, c := range []struct {
		name  string
		codec outbox.Codec[Order]
	}{
		{"encoding/json", outbox.JSONCodec[Order]{}},
		{"goccy", outboxgojson.Codec[Order]{}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(orderPayload)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.codec.Encode(order); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
