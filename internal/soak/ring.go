package main

import (
	"context"
	"encoding/json"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/msgtype"
	"github.com/outboxgen/outboxgen/internal/naming"
	"github.com/outboxgen/outboxgen/internal/ring"
	"github.com/outboxgen/outboxgen/outbox"
)

// ringWriter writes the soak's messages into the log tier's ring beside
// the outbox table (-ring), with the plain SQL INSERT any writer uses:
// the row Publish would write, its ordering key and delay as columns.
type ringWriter struct {
	insert  string
	headers []byte
	pool    *pgxpool.Pool
	queries func(db.DBTX) *db.Queries
}

// newRingWriter adds the ring to the outbox of schema and returns its
// writer.
func newRingWriter(ctx context.Context, pool *pgxpool.Pool, schema string) (*ringWriter, error) {
	names := naming.Names{Schema: schema, Table: table}
	if err := ring.Create(ctx, pool, names); err != nil {
		return nil, err
	}
	mt, err := msgtype.Of(reflect.TypeFor[Event]())
	if err != nil {
		return nil, err
	}
	headers, err := json.Marshal(map[string]string{outbox.HeaderContentType: "application/json", outbox.HeaderMessageType: mt.Name})
	if err != nil {
		return nil, err
	}
	cache := naming.NewCache(names)
	return &ringWriter{
		insert: "INSERT INTO " + pgx.Identifier{schema, table + "_ring"}.Sanitize() +
			" (queue, payload, headers, ordering_key, next_attempt_at) VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))",
		headers: headers, pool: pool,
		queries: func(c db.DBTX) *db.Queries { return db.New(naming.DBTX{Inner: c, Cache: cache}) },
	}, nil
}

// write writes e, published with opts, in tx.
func (w *ringWriter) write(ctx context.Context, tx pgx.Tx, e Event, opts *outbox.PublishOpts) error {
	payload, err := json.Marshal(e)
	if err != nil {
		return err
	}
	var key *string
	var delay float64
	if opts != nil {
		if opts.OrderingKey != "" {
			key = &opts.OrderingKey
		}
		delay = opts.Delay.Seconds()
	}
	_, err = tx.Exec(ctx, w.insert, queueOf(e.Seq), payload, w.headers, key, delay)
	return err
}

// unread counts the ring's rows no lane has read past.
func (w *ringWriter) unread(ctx context.Context) (int64, error) {
	return ring.Unread(ctx, w.pool, w.queries, 30*time.Second)
}
