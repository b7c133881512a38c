// Package othertypes declares message types for the outbox package's
// tests under the names its tests give their own: where a type lives after
// a move to another package, or another service's copy of it.
package othertypes

// Order has the name and the JSON of the outbox tests' Order.
type Order struct {
	ID    string `json:"id"`
	Total int    `json:"total"`
}

// Shipment is another message.
type Shipment struct {
	ID      string `json:"id"`
	Carrier string `json:"carrier"`
}

// Envelope has the name and the JSON of the outbox tests' Envelope.
type Envelope[T any] struct {
	Body T `json:"body"`
}
