package msgtype

import (
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/internal/msgtype/othertypes"
)

func TestUnqualified(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"OrderPlaced":                                                "OrderPlaced",
		"github.com/acme/shop.OrderPlaced":                           "OrderPlaced",
		"main.order":                                                 "order",
		"gopkg.in/acme-x~y+z.v2/shop.Order":                          "Order",
		"[]github.com/acme/shop.Order":                               "[]Order",
		"[2]github.com/acme/shop.Order":                              "[2]Order",
		"map[string]github.com/acme/shop.Order":                      "map[string]Order",
		"github.com/acme/shop.Envelope[*github.com/acme/shop.Order]": "Envelope[Order]",
		"github.com/acme/shop.Pair[github.com/a/x.K,map[string]*example.com.V]": "Pair[K,map[string]V]",
		"github.com/acme/shop.Envelope[github.com/acme/shop.order·1]":           "Envelope[order·1]",
		"github.com/acme/ünï.Größe":                                             "Größe",
		`shop.Box[struct { ID string "json:\"a.b/c\"" }]`:                       `Box[struct { ID string "json:\"a.b/c\"" }]`,
		`shop.Box[struct { ID string "unterminated`:                             `Box[struct { ID string "unterminated`,
		"Order Placed":  "Order Placed",
		"shop.order.v1": "v1",
		"trailing.":     "",
		"":              "",
	} {
		if got := Unqualified(in); got != want {
			t.Errorf("Unqualified(%q) = %q, want %q", in, got, want)
		}
		if got := Unqualified(Unqualified(in)); got != Unqualified(in) {
			t.Errorf("Unqualified is not idempotent on %q: %q", in, got)
		}
	}
}

func TestReads(t *testing.T) {
	t.Parallel()
	byDefault := Type{Name: "Order", Qualified: "github.com/acme/shop.Order"}
	envelope := Type{Name: "Envelope[Order]", Qualified: "github.com/acme/shop.Envelope[*github.com/acme/shop.Order]"}
	chosen := Type{Name: "shop.Order", Chosen: true}
	tests := []struct {
		t      Type
		header string
		want   bool
	}{
		{byDefault, "", true},
		{byDefault, "Order", true},
		{byDefault, "github.com/acme/shop.Order", true},
		{byDefault, "github.com/acme/billing/v2.Order", false},
		{byDefault, "github.com/acme/shop/v2.Order", false},
		{byDefault, "shop.Order", false},
		{byDefault, "*github.com/acme/shop.Order", true},
		{byDefault, "Shipment", false},
		{byDefault, "github.com/acme/shop.Shipment", false},
		{byDefault, "github.com/acme/shop.Order[int]", false},
		{byDefault, "order", false},
		{chosen, "shop.Order", true},
		{chosen, "", true},
		{chosen, "Order", false},
		{chosen, "github.com/x/shop.Order", false},
		{Type{}, "anything", true},
		{envelope, "Envelope[Order]", true},
		{envelope, "github.com/acme/shop.Envelope[*github.com/acme/shop.Order]", true},
		{envelope, "github.com/acme/shop.Envelope[github.com/acme/shop.Order]", true},
		{envelope, "github.com/acme/shop.Envelope[github.com/acme/billing.Order]", false},
		{envelope, "github.com/acme/billing.Envelope[*github.com/acme/shop.Order]", false},
		{envelope, "github.com/acme/shop.Envelope[github.com/acme/shop.Shipment]", false},
		{Type{Name: "string", Qualified: "string"}, "string", true},
		{Type{Name: "string", Qualified: "string"}, "github.com/acme/shop.string", false},
	}
	for _, tt := range tests {
		if got := tt.t.Reads(tt.header); got != tt.want {
			t.Errorf("%+v.Reads(%q) = %v, want %v", tt.t, tt.header, got, tt.want)
		}
	}
}

// Of spells a default name both bare and as publishers before the bare
// names did, with every package path; a chosen name has no qualified
// spelling.
func TestOfQualified(t *testing.T) {
	t.Parallel()
	const path = "github.com/outboxgen/outboxgen/internal/msgtype/othertypes"
	for _, tt := range []struct {
		t    reflect.Type
		want Type
	}{
		{reflect.TypeFor[*othertypes.Order](), Type{Name: "Order", Qualified: path + ".Order"}},
		{reflect.TypeFor[othertypes.Envelope[*othertypes.Order]](), Type{Name: "Envelope[Order]", Qualified: path + ".Envelope[*" + path + ".Order]"}},
		{reflect.TypeFor[map[string][]othertypes.Shipment](), Type{Name: "map[string][]Shipment", Qualified: "map[string][]" + path + ".Shipment"}},
		{reflect.TypeFor[othertypes.Envelope[int]](), Type{Name: "Envelope[int]", Qualified: path + ".Envelope[int]"}},
		{reflect.TypeFor[string](), Type{Name: "string", Qualified: "string"}},
		{reflect.TypeFor[[]byte](), Type{}},
	} {
		got, err := Of(tt.t)
		if err != nil {
			t.Fatalf("Of(%v): %v", tt.t, err)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("Of(%v) (-want +got):\n%s", tt.t, diff)
		}
	}
}
