package shop

import (
	"context"
	"embed"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/outbox"
)

// readme:begin migrations

// Migrations are the shop's own goose migrations, in migrations/, which
// the service applies at start and its tests to each test's schema.
//
//go:embed migrations/*.sql
var Migrations embed.FS

// readme:end

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

// RecordShipment is a transactional handler: it records the shipment in
// the transaction that acknowledges the message, so the row is written
// once however often the message is delivered.
func RecordShipment(ctx context.Context, tx pgx.Tx, m *outbox.Message[OrderPlaced]) error {
	_, err := tx.Exec(ctx, "INSERT INTO shipments (order_id, customer) VALUES ($1, $2)", m.Payload.OrderID, m.Payload.Customer)
	return err
}

// Shipments returns the subscriber that records placed orders' shipments
// with RecordShipment.
func Shipments(ob *outbox.Outbox) (*outbox.Subscriber[OrderPlaced], error) {
	return NewOrderPlacedTxSubscriber(ob, RecordShipment, nil)
}

// OrderShipped names its message type (type= in its annotation).
var _ outbox.MessageTyper = OrderShipped{}
