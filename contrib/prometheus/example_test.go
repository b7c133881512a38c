package outboxprom_test

import (
	"context"
	"log"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	outboxprom "github.com/outboxgen/outboxgen/contrib/prometheus"
	"github.com/outboxgen/outboxgen/outbox"
)

type OrderCreated struct {
	ID string `json:"id"`
}

// Count what a publisher and a subscriber do, report each queue's depth at
// every scrape, and serve both on /metrics.
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
	rec := outboxprom.NewRecorder(nil)
	prometheus.MustRegister(rec, outboxprom.NewQueueCollector(ob, nil))

	pub, err := outbox.NewPublisher(ob, "orders", &outbox.PublisherConfig[OrderCreated]{Metrics: rec})
	if err != nil {
		log.Fatal(err)
	}
	_ = pub // publish inside your transactions
	sub, err := outbox.NewSubscriber(ob, []string{"orders"}, func(ctx context.Context, m *outbox.Message[OrderCreated]) error {
		return nil
	}, &outbox.SubscriberConfig[OrderCreated]{Name: "billing", Metrics: rec})
	if err != nil {
		log.Fatal(err)
	}
	go func() { log.Fatal(sub.Run(ctx)) }()

	http.Handle("/metrics", promhttp.Handler())
	log.Fatal(http.ListenAndServe(":9090", nil))
}
