// Package shop is an example of a service that declares its outbox
// messages and lets outboxgen bind generate their typed constructors and
// AsyncAPI document.
package shop

import "time"

// readme:begin bind
//go:generate go run github.com/outboxgen/outboxgen/cmd/outboxgen bind

// OrderPlaced is published in the transaction that stores the order.
//
//outbox:message queue=shop.order_placed
type OrderPlaced struct {
	OrderID  string    `json:"order_id"`
	Customer string    `json:"customer"`
	Cents    int64     `json:"total_cents"`
	Placed   time.Time `json:"placed_at"`
	Coupon   *string   `json:"coupon,omitempty"`
}

// readme:end

// readme:begin shipped

// OrderShipped is published when the parcel leaves the warehouse. Its
// message type is named, so a shipping service may consume it with a Go
// type of another name that names the same message type, and the type
// may be renamed while rows are in flight.
//
//outbox:message queue=shop.order_shipped type=shop.OrderShipped
type OrderShipped struct {
	OrderID  string   `json:"order_id"`
	Carrier  string   `json:"carrier"`
	Tracking []string `json:"tracking"`
}

// readme:end
