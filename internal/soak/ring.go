package main

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/naming"
	"github.com/outboxgen/outboxgen/internal/ring"
	"github.com/outboxgen/outboxgen/internal/ringwriter"
	"github.com/outboxgen/outboxgen/outbox"
)

// ringWriter writes the soak's messages into the log tier's ring beside
// the outbox table (-ring), with the plain SQL INSERT any writer uses
// (package ringwriter).
type ringWriter struct {
	*ringwriter.Writer
	pool    *pgxpool.Pool
	queries func(db.DBTX) *db.Queries
}

// newRingWriter adds the ring to the outbox of schema and returns its
// writer.
func newRingWriter(ctx context.Context, pool *pgxpool.Pool, schema string) (*ringWriter, error) {
	names := naming.Names{Schema: schema, Table: table}
	w, err := ringwriter.New[Event](names)
	if err != nil {
		return nil, err
	}
	return &ringWriter{Writer: w, pool: pool, queries: naming.Queries(names)}, nil
}

// write writes e, published with opts, in tx.
func (w *ringWriter) write(ctx context.Context, tx pgx.Tx, e Event, opts *outbox.PublishOpts) error {
	return w.Write(ctx, tx, queueOf(e.Seq), e, opts)
}

// unread counts the ring's rows no lane has read past.
func (w *ringWriter) unread(ctx context.Context) (int64, error) {
	return ring.Unread(ctx, w.pool, w.queries, 30*time.Second)
}
