package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/lease"
)

// heartbeat moves, every HeartbeatInterval, the expiry of every lease this
// run holds to LeaseTTL from now, in one statement. A delivery the
// statement misses lost its lease: its handler's context is cancelled with
// cause lease.ErrLeaseLost.
func (r *run) heartbeat(ctx context.Context) {
	q := r.queries()
	t := time.NewTicker(r.s.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ds, ids, tokens := r.leases.Snapshot()
		if len(ids) == 0 {
			continue
		}
		sent := time.Now()
		extended, err := q.ExtendLeases(ctx, db.ExtendLeasesParams{Ids: ids, Tokens: tokens, LeaseTtlSeconds: r.s.LeaseTTL.Seconds()})
		if err != nil {
			if ctx.Err() == nil {
				r.s.Log.WarnContext(ctx, "outbox: heartbeat failed; leases run on", slog.Int("rows", len(ids)), slog.Any("error", err))
			}
			continue
		}
		held := lease.LeasesOf(extended, func(e db.ExtendLeasesRow) (int64, pgtype.UUID) { return e.ID, e.Token })
		for _, d := range r.leases.Extended(held, ds, sent) {
			r.s.Log.WarnContext(ctx, "outbox: heartbeat found the lease taken; cancelling the handler", rowAttrs(d)...)
			r.emit(MetricEvent{Name: EventLeaseLost, Queue: d.Row.Queue, ID: d.Row.ID, Deliveries: int(d.Row.DeliveriesCount), Reason: "heartbeat"})
		}
	}
}
