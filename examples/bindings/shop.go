package shop

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/outbox"
)

// PlaceOrder stores an order's message in the caller's transaction with the
// generated, typed publisher.
func PlaceOrder(ctx context.Context, ob *outbox.Outbox, tx pgx.Tx, o OrderPlaced) error {
	pub, err := NewOrderPlacedPublisher(ob, nil)
	if err != nil {
		return err
	}
	_, err = pub.Publish(ctx, tx, o, &outbox.PublishOpts{OrderingKey: o.Customer})
	return err
}

// Shipping returns the subscriber that ships placed orders.
func Shipping(ob *outbox.Outbox, ship func(context.Context, OrderPlaced) error) (*outbox.Subscriber[OrderPlaced], error) {
	return NewOrderPlacedSubscriber(ob, func(ctx context.Context, m *outbox.Message[OrderPlaced]) error {
		return ship(ctx, m.Payload)
	}, nil)
}

// OrderShipped names its message type (type= in its annotation).
var _ outbox.MessageTyper = OrderShipped{}
