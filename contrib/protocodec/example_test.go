package protocodec_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/contrib/protocodec"
	"github.com/outboxgen/outboxgen/contrib/protocodec/shopv1"
	"github.com/outboxgen/outboxgen/outbox"
)

// Handle the shop's orders by their .proto contract: the rows carry the
// wire format and the message type shop.v1.OrderPlaced, whatever Go
// package the shop generated its code into.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/billing")
	if err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	handle := func(ctx context.Context, m *outbox.Message[*shopv1.OrderPlaced]) error {
		log.Printf("order %s: %d %s", m.Payload.GetOrderId(), m.Payload.GetTotal().GetMinorUnits(), m.Payload.GetTotal().GetCurrency())
		return nil
	}
	// readme:begin protocodec
	sub, err := outbox.NewSubscriber(ob, []string{"orders"}, handle, &outbox.SubscriberConfig[*shopv1.OrderPlaced]{
		Codec: protocodec.Codec[*shopv1.OrderPlaced]{}, // {JSON: true} for protojson
	})
	// readme:end
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(sub.Run(ctx))
}
