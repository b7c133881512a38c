package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/outboxgen/outboxgen/bench/internal/benchpb"
	outboxgojson "github.com/outboxgen/outboxgen/contrib/gojson"
	"github.com/outboxgen/outboxgen/contrib/protocodec"
	"github.com/outboxgen/outboxgen/outbox"
)

// BenchmarkCodec measures what each codec of the drain suite costs the
// client per message: Encode of the sample order (what a publisher does
// per message) and Decode of its payload (what a subscriber does before
// its handler runs). The payload-B metric is the encoded size.
//
//	go test -run '^$' -bench Codec -benchmem
func BenchmarkCodec(b *testing.B) {
	benchCodec(b, "encoding-json", outbox.JSONCodec[order]{}, sampleOrder(1))
	benchCodec(b, "gojson", outboxgojson.Codec[order]{}, sampleOrder(1))
	benchCodec(b, "protobuf", protocodec.Codec[*benchpb.Order]{}, sampleOrderPB(1))
	benchCodec(b, "protojson", protocodec.Codec[*benchpb.Order]{JSON: true}, sampleOrderPB(1))
}

func benchCodec[T any](b *testing.B, name string, codec outbox.Codec[T], m T) {
	payload, err := codec.Encode(m)
	if err != nil {
		b.Fatal(err)
	}
	b.Run(name+"/encode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := codec.Encode(m); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(payload)), "payload-B")
	})
	b.Run(name+"/decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := codec.Decode(payload); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(payload)), "payload-B")
	})
}

// TestCodecsRoundTrip checks that every codec the drain suite runs gives
// back the sample order it encoded, and that the protobuf order holds the
// same values as the JSON one.
func TestCodecsRoundTrip(t *testing.T) {
	t.Parallel()
	roundTrip(t, outbox.JSONCodec[order]{}, sampleOrder(7))
	roundTrip(t, outboxgojson.Codec[order]{}, sampleOrder(7))
	roundTrip(t, protocodec.Codec[*benchpb.Order]{}, sampleOrderPB(7))
	roundTrip(t, protocodec.Codec[*benchpb.Order]{JSON: true}, sampleOrderPB(7))
	o, pb := sampleOrder(7), sampleOrderPB(7)
	if pb.GetId() != o.ID || pb.GetCustomer() != o.Customer || pb.GetTotal() != int64(o.Total) || !cmp.Equal(pb.GetItems(), o.Items) {
		t.Errorf("sampleOrderPB(7) = %v, sampleOrder(7) = %+v", pb, o)
	}
}

func roundTrip[T any](t *testing.T, codec outbox.Codec[T], m T) {
	t.Helper()
	payload, err := codec.Encode(m)
	if err != nil {
		t.Fatalf("%T: Encode: %v", codec, err)
	}
	got, err := codec.Decode(payload)
	if err != nil {
		t.Fatalf("%T: Decode: %v", codec, err)
	}
	if diff := cmp.Diff(m, got, protocmp.Transform()); diff != "" {
		t.Errorf("%T: round trip (-sent +got):\n%s", codec, diff)
	}
}
