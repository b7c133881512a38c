package main

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/outboxgen/outboxgen/bench/internal/benchpb"
	"github.com/outboxgen/outboxgen/outbox"
)

const (
	schemaOurs      = "outboxbench"
	schemaRiver     = "outboxbench_river"
	schemaWatermill = "outboxbench_watermill"
	// schemaRing holds an outbox with the log tier's ring beside its
	// table (package ring): its subscribers claim from both.
	schemaRing = "outboxbench_ring"
	topic      = "orders"
)

// benchSchemas are the schemas newBenchEnv creates, and close drops.
var benchSchemas = []string{schemaOurs, schemaRiver, schemaWatermill, schemaRing}

// order is the message every contender writes: about 120 bytes of JSON.
type order struct {
	ID       string   `json:"id"`
	Customer string   `json:"customer"`
	Total    int      `json:"total"`
	Items    []string `json:"items"`
}

// Kind makes order a River job.
func (order) Kind() string { return "order" }

func sampleOrder(i int) order {
	return order{ID: fmt.Sprintf("order-%08d", i), Customer: "customer-42", Total: 1999 + i%100, Items: []string{"tea", "cake", "scones"}}
}

// sampleOrderPB is sampleOrder(i) as a Protocol Buffers message.
func sampleOrderPB(i int) *benchpb.Order {
	o := sampleOrder(i)
	return &benchpb.Order{Id: o.ID, Customer: o.Customer, Total: int64(o.Total), Items: o.Items}
}

// benchEnv holds every contender's client on one database.
type benchEnv struct {
	pool      *pgxpool.Pool
	stdDB     *sql.DB
	ob        *outbox.Outbox
	ring      *outbox.Outbox
	river     *river.Client[pgx.Tx]
	watermill *wsql.Publisher
}

func newBenchEnv(ctx context.Context, dsn string) (*benchEnv, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("-dsn: %w", err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	e := &benchEnv{pool: pool, stdDB: stdlib.OpenDBFromPool(pool)}
	if err := e.setup(ctx); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// migratedOutbox migrates an outbox of the default table in schema (the
// ring beside its table, as in every outbox since schema 13).
func migratedOutbox(ctx context.Context, pool *pgxpool.Pool, schema string) (*outbox.Outbox, error) {
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	if err := ob.Migrate(ctx); err != nil {
		return nil, err
	}
	return ob, nil
}

func (e *benchEnv) setup(ctx context.Context) error {
	for _, s := range benchSchemas {
		id := pgx.Identifier{s}.Sanitize()
		if _, err := e.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+id+" CASCADE; CREATE SCHEMA "+id); err != nil {
			return fmt.Errorf("create schema %s: %w", s, err)
		}
	}

	var err error
	if e.ob, err = migratedOutbox(ctx, e.pool, schemaOurs); err != nil {
		return err
	}
	if e.ring, err = migratedOutbox(ctx, e.pool, schemaRing); err != nil {
		return err
	}

	driver := riverpgxv5.New(e.pool)
	migrator, err := rivermigrate.New(driver, &rivermigrate.Config{Schema: schemaRiver})
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrate: %w", err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[order]) error { return nil }))
	e.river, err = river.NewClient(driver, &river.Config{Schema: schemaRiver, Workers: workers, Logger: discardLogger()})
	if err != nil {
		return err
	}

	e.watermill, err = wsql.NewPublisher(wsql.BeginnerFromPgx(e.pool), wsql.PublisherConfig{
		SchemaAdapter:        watermillSchema(),
		AutoInitializeSchema: true,
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	// The first publish creates the table; keep it out of the measurements.
	return e.watermill.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte(`{}`)))
}

func watermillSchema() wsql.PostgreSQLQueueSchema {
	return wsql.PostgreSQLQueueSchema{
		GenerateMessagesTableName: func(topic string) string {
			return pgx.Identifier{schemaWatermill, "watermill_" + topic}.Sanitize()
		},
	}
}

// reset empties every contender's tables so each round starts alike.
func (e *benchEnv) reset(ctx context.Context) error {
	_, err := e.pool.Exec(ctx, "TRUNCATE "+
		pgx.Identifier{schemaOurs, "outbox"}.Sanitize()+", "+
		pgx.Identifier{schemaOurs, "outbox_dlq"}.Sanitize()+", "+
		pgx.Identifier{schemaOurs, "outbox_handoff"}.Sanitize()+", "+
		pgx.Identifier{schemaRiver, "river_job"}.Sanitize()+", "+
		pgx.Identifier{schemaWatermill, "watermill_" + topic}.Sanitize()+", "+
		ringTables())
	return err
}

func (e *benchEnv) close() {
	ctx := context.Background()
	if e.ob != nil {
		for _, s := range benchSchemas {
			_, _ = e.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{s}.Sanitize()+" CASCADE")
		}
	}
	_ = e.stdDB.Close()
	e.pool.Close()
}
