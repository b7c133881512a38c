package engine

import (
	"context"
	"crypto/rand"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/claim"
)

// PresenceInterval is how often a running subscriber writes its presence
// record (schema 14, <table>_subscribers); a record not written for
// three intervals is judged gone.
const PresenceInterval = 5 * time.Second

// presence is what a run's presence record says of it between writes.
type presence struct {
	id pgtype.UUID
	// lastClaim is when the fetcher last sent a claim, idleSince since
	// when its claims have found nothing (0: they find rows), and
	// findingSince since when they have found rows, in Unix nanoseconds.
	lastClaim, idleSince, findingSince atomic.Int64
	// stopping is set once the run stops.
	stopping atomic.Bool
}

func newPresence() *presence {
	p := &presence{id: pgtype.UUID{Valid: true}}
	_, _ = rand.Read(p.id.Bytes[:]) // never fails (crypto/rand)
	p.findingSince.Store(time.Now().UnixNano())
	return p
}

// claimSent records that the fetcher sends a claim now.
func (p *presence) claimSent() { p.lastClaim.Store(time.Now().UnixNano()) }

// claimed records what a claim found: rows, or none.
func (p *presence) claimed(rows bool) {
	if rows {
		if p.idleSince.Swap(0) != 0 {
			p.findingSince.Store(time.Now().UnixNano())
		}
	} else {
		p.idleSince.CompareAndSwap(0, time.Now().UnixNano())
	}
}

// present writes the run's presence record at once and every
// PresenceInterval until ctx ends, then once more as stopping. A write
// that fails is logged and tried again at the next interval.
func (r *run) present(ctx context.Context) {
	host, _ := os.Hostname()
	path := "lease"
	if claim.LocksRows(r.s.LockWindow, r.s.Pool.Config().MaxConns) {
		path = "lock"
	}
	p := db.PresentParams{ID: r.presence.id, Name: r.s.Name, Host: host, Pid: int32(os.Getpid()), Queues: r.s.Queues,
		Workers: int32(r.s.Workers), ClaimPath: path, EverySeconds: PresenceInterval.Seconds()}
	failed := false
	write := func(wctx context.Context) {
		p.Busy, p.InFlight = int32(r.crew.Busy()), int32(r.leases.Held())
		p.State, p.StateSince = "claiming", time.Unix(0, r.presence.findingSince.Load())
		if idle := r.presence.idleSince.Load(); idle != 0 {
			p.State, p.StateSince = "asleep", time.Unix(0, idle)
		}
		if r.presence.stopping.Load() {
			p.State = "stopping"
		}
		p.LastClaimAt = nil
		if last := r.presence.lastClaim.Load(); last != 0 {
			t := time.Unix(0, last)
			p.LastClaimAt = &t
		}
		err := r.queries().Present(wctx, p)
		if err != nil && !failed && wctx.Err() == nil {
			r.s.Log.WarnContext(wctx, "outbox: could not write the subscriber's presence record; operators do not see it",
				slog.Any("error", err))
		}
		failed = err != nil
	}
	t := time.NewTicker(PresenceInterval)
	defer t.Stop()
	for {
		write(r.writes)
		select {
		case <-ctx.Done():
			r.presence.stopping.Store(true)
			write(r.writes)
			return
		case <-t.C:
		}
	}
}

// absent deletes the run's presence record as the run ends, within the
// stop's deadline (r.writes): a database that does not answer leaves it
// to be shown gone.
func (r *run) absent() {
	if err := r.queries().Absent(r.writes, r.presence.id); err != nil {
		r.s.Log.Debug("outbox: could not delete the subscriber's presence record; it is shown gone", slog.Any("error", err))
	}
}
