package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/internal/wakeup"
)

// wakeSource is what the LISTEN connections of o's subscribers need of o.
func (o *Outbox) wakeSource() *wakeup.Source {
	return &wakeup.Source{
		Dial: func(ctx context.Context, dsn string, connect func(context.Context) (*pgx.Conn, error)) (*pgx.Conn, error) {
			return dialListener(ctx, o, dsn, connect)
		},
		Queries:      o.queries,
		ProbeChannel: o.naming.ProbeChannel(),
		SendProbe:    o.sendProbe,
	}
}

// dialListener opens a LISTEN connection: through connect when set,
// else dsn when set, else with the pool's connection settings.
func dialListener(ctx context.Context, o *Outbox, dsn string, connect func(context.Context) (*pgx.Conn, error)) (*pgx.Conn, error) {
	switch {
	case connect != nil:
		return connect(ctx)
	case dsn != "":
		return pgx.Connect(ctx, dsn)
	default:
		return pgx.ConnectConfig(ctx, o.pool.Config().ConnConfig.Copy())
	}
}

// sendProbe notifies the probe channel through the pool, with a random
// payload that tells this probe from others, and returns the payload.
func (o *Outbox) sendProbe(ctx context.Context) (string, error) {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	payload := hex.EncodeToString(b[:])
	return payload, o.queries(o.pool).NotifyProbe(ctx, payload)
}
