package outboxjs_test

import (
	"context"
	"log"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	outboxjs "github.com/outboxgen/outboxgen/contrib/jetstream"
	"github.com/outboxgen/outboxgen/outbox"
)

// Relay the queue orders.created of the outbox public.outbox to the
// subject events.orders.created, which a stream with the default
// duplicate window (two minutes) captures. The row's headers travel as
// NATS headers, and each message's Nats-Msg-Id is
// "public.outbox:<row id>:<created at>", so JetStream drops a second copy
// of a row that is published again after a crash.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	// readme:begin relay
	relay, err := outboxjs.NewRelay(ob, nc, []string{"orders.created"}, &outboxjs.Config{
		Subject:  func(m *outbox.Message[[]byte]) (string, error) { return "events." + m.Queue, nil },
		Subjects: []string{"events.>"},
		Subscriber: &outbox.SubscriberConfig[[]byte]{
			Workers: 64, // publishes awaiting their ack at once
		},
	})
	if err != nil {
		log.Fatal(err) // an *outbox.ConfigError naming the field
	}
	// Run refuses to start (a *outboxjs.WindowError) when a row could be
	// published again after the stream forgot its id.
	if err := relay.Run(ctx); err != nil {
		log.Fatal(err)
	}
	// readme:end
}
