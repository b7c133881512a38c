// Package ringwriter writes messages into the log tier's ring (package
// ring) with the plain SQL INSERT any writer uses: the row Publish would
// write into the outbox table, with Publish's default codec, its
// ordering key and delay as columns. The soak and the chaos harness use
// it to put the ring under load.
package ringwriter

import (
	"context"
	"encoding/json"
	"reflect"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/internal/msgtype"
	"github.com/outboxgen/outboxgen/internal/naming"
	"github.com/outboxgen/outboxgen/outbox"
)

// Writer writes messages of one type into the ring of one outbox.
type Writer struct {
	insert  string
	headers []byte
}

// New returns the Writer of messages of type T into the ring of outbox n,
// whose headers name T as a Publisher of T would.
func New[T any](n naming.Names) (*Writer, error) {
	mt, err := msgtype.Of(reflect.TypeFor[T]())
	if err != nil {
		return nil, err
	}
	headers, err := json.Marshal(map[string]string{outbox.HeaderContentType: "application/json", outbox.HeaderMessageType: mt.Name})
	if err != nil {
		return nil, err
	}
	return &Writer{
		insert: "INSERT INTO " + n.Qualified(n.Table+"_ring") +
			" (queue, payload, headers, ordering_key, next_attempt_at) VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))",
		headers: headers,
	}, nil
}

// Write writes m into queue in tx, as Publish with opts (nil: none) would
// write it into the outbox table: its ordering key, and its delay from
// now. A timer id or a not-before time is not the ring's (they stay the
// outbox table's).
func (w *Writer) Write(ctx context.Context, tx pgx.Tx, queue string, m any, opts *outbox.PublishOpts) error {
	payload, err := json.Marshal(m)
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
	_, err = tx.Exec(ctx, w.insert, queue, payload, w.headers, key, delay)
	return err
}
