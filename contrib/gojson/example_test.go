package outboxgojson_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	outboxgojson "github.com/outboxgen/outboxgen/contrib/gojson"
	"github.com/outboxgen/outboxgen/outbox"
)

type OrderPlaced struct {
	OrderID string `json:"order_id"`
	Amount  string `json:"amount"`
}

// Publish and handle a queue's messages with go-json. Each side can keep
// outbox.JSONCodec instead, or switch later: the payloads and their
// content type are the same.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}

	// readme:begin gojson
	pub, err := outbox.NewPublisher(ob, "orders", &outbox.PublisherConfig[OrderPlaced]{
		Codec: outboxgojson.Codec[OrderPlaced]{},
	})
	// readme:end
	if err != nil {
		log.Fatal(err)
	}
	_ = pub // pub.Publish(ctx, tx, OrderPlaced{...}, nil) inside your transactions

	sub, err := outbox.NewSubscriber(ob, []string{"orders"}, func(ctx context.Context, m *outbox.Message[OrderPlaced]) error {
		log.Printf("order %s: %s", m.Payload.OrderID, m.Payload.Amount)
		return nil
	}, &outbox.SubscriberConfig[OrderPlaced]{
		Name:  "billing",
		Codec: outboxgojson.Codec[OrderPlaced]{},
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(sub.Run(ctx))
}
