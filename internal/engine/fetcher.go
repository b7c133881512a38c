package engine

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
)

// fetch claims rows into buf until ctx is done. It claims when at least
// a quarter of buf is free (or buf is empty), so claims stay batched and
// the next claim is under way while workers still have rows; when a
// claim finds nothing it waits with exponential backoff and jitter between
// MinFetchInterval and MaxFetchInterval, cut short by a NOTIFY and never
// past the earliest scheduled row's due time. Before it waits, it records
// that it sleeps, so that writers notify (see sleeper).
func (r *run) fetch(ctx context.Context) {
	cfg := r.s
	q := r.queries()
	// A failed claim is retried at least every MaxFetchInterval, as an
	// idle subscriber polls: after an outage or a failover the subscriber
	// claims again within that long of the database's return.
	errs := dbx.Backoff{Base: 100 * time.Millisecond, Max: min(30*time.Second, cfg.MaxFetchInterval)}
	idle := 0
	for ctx.Err() == nil {
		free := cap(r.buf) - len(r.buf)
		if free < max(cap(r.buf)/4, 1) && len(r.buf) > 0 {
			select {
			case <-ctx.Done():
				return
			case <-r.taken:
			}
			continue
		}
		r.handOff(ctx, q)
		r.sweepLocks(ctx, q)
		sent := time.Now()
		want := int32(min(free, cfg.FetchBatchSize))
		r.presence.claimSent()
		n, err := r.claims.Claim(ctx, want)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if dbx.Classify(err) == dbx.Doomed {
				// A claim in autocommit is a transaction of its own: at
				// REPEATABLE READ or SERIALIZABLE (the pool's default), a
				// row another claim changed since its snapshot fails it.
				// The next claim takes a new snapshot; no backoff for it.
				dbx.Sleep(ctx, time.Duration(float64(cfg.MinFetchInterval)*(0.5+rand.Float64())))
				continue
			}
			wait := errs.Next()
			r.s.Log.ErrorContext(ctx, "outbox: claim failed; retrying", slog.Any("error", err), slog.Duration("backoff", wait))
			dbx.Sleep(ctx, wait)
			continue
		}
		r.emit(MetricEvent{Name: EventFetched, Queue: r.s.Queues[0], Count: n})
		r.presence.claimed(n > 0)
		if n > 0 {
			idle = 0
			r.found(ctx, q, n, n >= int(want))
			continue
		}
		if r.asleep(ctx, q) {
			continue
		}
		idle = min(idle+1, 30)
		r.idle(ctx, q, idle, sent)
	}
}

// idle waits after an empty claim, sent at claimed: the n-th in a row.
func (r *run) idle(ctx context.Context, q *db.Queries, n int, claimed time.Time) {
	cfg := r.s
	select {
	case <-r.wake:
		// Notified while the claim ran: claim again at once, without
		// asking when the next scheduled row comes due.
		r.woken()
		return
	default:
	}
	wait := float64(cfg.MinFetchInterval) * float64(uint64(1)<<(n-1)) * (0.75 + rand.Float64()/2)
	d := min(time.Duration(wait), cfg.MaxFetchInterval)
	if dueIn, err := q.NextDueIn(ctx, db.NextDueInParams{Queues: r.s.Queues, SinceClaimSeconds: time.Since(claimed).Seconds()}); err == nil {
		d = min(d, max(dbx.Seconds(dueIn), 0))
	} else if !errors.Is(err, pgx.ErrNoRows) && ctx.Err() == nil {
		r.s.Log.WarnContext(ctx, "outbox: next due time unknown", slog.Any("error", err))
	}
	d = r.sleepWait(r.untilHandOff(d))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-r.wake:
		r.woken()
	case <-t.C:
	}
}

// woken handles a wake-up of the idle fetcher. A publisher holding a
// waiting hand-over's key notifies when it commits: try the hand-over
// again now.
func (r *run) woken() {
	if !r.handoffs.retryAt.IsZero() {
		r.handoffs.pending.Store(true)
	}
}

// wakeFetcher asks the fetcher to claim now; it never blocks.
func (r *run) wakeFetcher() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// wants reports whether a notification payload names one of our queues.
func (r *run) wants(queue string) bool { return slices.Contains(r.s.Queues, queue) }
