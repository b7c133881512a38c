package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/outboxgen/outboxgen/db"
)

// sweepLocks deletes, every MaxFetchInterval, the records of locked
// claims no claim needs any more. Subscribers that claim by lease sweep
// too: their claims read the records, which other subscribers (or a
// restored dump) may have left.
func (r *run) sweepLocks(ctx context.Context, q *db.Queries) {
	if time.Since(r.locksSwept) < r.s.MaxFetchInterval {
		return
	}
	r.locksSwept = time.Now()
	if _, err := q.SweepLocks(ctx); err != nil && ctx.Err() == nil {
		r.s.Log.WarnContext(ctx, "outbox: sweeping the records of locked claims failed", slog.Any("error", err))
	}
}
