package outboxotel_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	outboxotel "github.com/outboxgen/outboxgen/contrib/otel"
	"github.com/outboxgen/outboxgen/outbox"
)

type OrderCreated struct {
	ID string `json:"id"`
}

// One trace from the request that published a message to every handling
// of it, and the outbox's metrics and health as OpenTelemetry instruments.
// The SDK's set-up (exporters, providers) is the service's own; this
// wires the outbox into the global providers.
func Example() {
	otel.SetTextMapPropagator(propagation.TraceContext{}) // the W3C traceparent header
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	rec, err := outboxotel.NewRecorder(nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := outboxotel.RegisterHealthGauges(nil, ob, nil); err != nil {
		log.Fatal(err)
	}

	// readme:begin tracing
	// Publish within the request's span: its trace travels in the headers.
	pub, err := outbox.NewPublisher(ob, "orders", &outbox.PublisherConfig[OrderCreated]{
		HeadersFrom: outboxotel.HeadersFrom,
		Metrics:     rec,
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = pub // pub.Publish(ctx, tx, ...) inside your transactions

	// Each delivery runs in a consumer span, a child of the publishing
	// span, with retries and dead letters as its events.
	sub, err := outbox.NewSubscriber(ob, []string{"orders"}, func(ctx context.Context, m *outbox.Message[OrderCreated]) error {
		return nil // ctx carries the consumer span
	}, &outbox.SubscriberConfig[OrderCreated]{
		Name:     "billing",
		Metrics:  rec,
		Observer: outboxotel.NewObserver(nil),
	})
	if err != nil {
		log.Fatal(err)
	}
	// readme:end
	log.Fatal(sub.Run(ctx))
}
