// Package bindpkg holds message types covering every kind of field the
// bind command maps to JSON Schema.
package bindpkg

import (
	"encoding/json"
	"time"
)

// OrderCreated is published when an order is placed.
//
//outbox:message queue=orders.created
type OrderCreated struct {
	ID        string            `json:"id"`
	Customer  Customer          `json:"customer"`
	Lines     []Line            `json:"lines"`
	Total     int64             `json:"total_cents"`
	Discount  float64           `json:"discount,omitempty"`
	Gift      bool              `json:"gift"`
	Note      *string           `json:"note"`
	Tags      map[string]string `json:"tags,omitempty"`
	Placed    time.Time         `json:"placed_at"`
	Timeout   time.Duration     `json:"timeout"`
	Raw       json.RawMessage   `json:"raw,omitempty"`
	Signature []byte            `json:"signature,omitempty"`
	Checksum  [4]uint8          `json:"checksum"`
	Extra     any               `json:"extra,omitempty"`
	Amount    Pair[int64]       `json:"amount"`
	Labels    Pair[string]      `json:"labels"`
	Audit                       // embedded: its fields are inlined
	*Trace                      // embedded pointer: its fields may be absent
	internal  string
	Skipped   string `json:"-"`
	Untagged  int
}

// Customer is nested in OrderCreated.
type Customer struct {
	Name    string   `json:"name"`
	Address *Address `json:"address,omitempty"`
}

// Address is nested twice deep.
type Address struct {
	City string `json:"city"`
}

// Line is an order line.
type Line struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"qty"`
}

// Audit is embedded in OrderCreated.
type Audit struct {
	CreatedBy string `json:"created_by"`
}

// Pair is generic: each instantiation has a schema of its own.
type Pair[T any] struct {
	Key   string `json:"key"`
	Value T      `json:"value"`
}

// Trace is embedded in OrderCreated through a pointer.
type Trace struct {
	TraceID string `json:"trace_id"`
}

// PaymentFailed is a second message type on its own queue, with a
// message type name of its own.
//
//outbox:message type=payments.PaymentFailed/v1 queue=payments.failed
type PaymentFailed struct {
	OrderID string `json:"order_id"`
	Reason  string `json:"reason"`
}

var _ = OrderCreated{}.internal
