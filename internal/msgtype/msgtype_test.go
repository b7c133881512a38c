package msgtype

import (
	"testing"
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
	byDefault := Type{Name: "Order"}
	chosen := Type{Name: "shop.Order", Chosen: true}
	tests := []struct {
		t      Type
		header string
		want   bool
	}{
		{byDefault, "", true},
		{byDefault, "Order", true},
		{byDefault, "github.com/acme/shop.Order", true},
		{byDefault, "github.com/acme/billing/v2.Order", true},
		{byDefault, "Shipment", false},
		{byDefault, "github.com/acme/shop.Shipment", false},
		{byDefault, "github.com/acme/shop.Order[int]", false},
		{byDefault, "order", false},
		{chosen, "shop.Order", true},
		{chosen, "", true},
		{chosen, "Order", false},
		{chosen, "github.com/x/shop.Order", false},
		{Type{}, "anything", true},
		{Type{Name: "Envelope[Order]"}, "github.com/acme/shop.Envelope[*github.com/acme/shop.Order]", true},
		{Type{Name: "Envelope[Order]"}, "github.com/acme/shop.Envelope[github.com/acme/shop.Shipment]", false},
	}
	for _, tt := range tests {
		if got := tt.t.Reads(tt.header); got != tt.want {
			t.Errorf("%+v.Reads(%q) = %v, want %v", tt.t, tt.header, got, tt.want)
		}
	}
}
