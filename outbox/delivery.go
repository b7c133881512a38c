package outbox

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
)

// delivery is one claimed row, from claim to outcome.
type delivery struct {
	row   db.Outbox
	token pgtype.UUID

	// ctx is the handler's context: cancelled with ErrLeaseLost when the
	// lease expires unextended or a heartbeat finds it taken, and with
	// ErrSubscriberStopped on forced stop.
	ctx    context.Context
	cancel context.CancelCauseFunc
	expiry *time.Timer
	lost   bool // guarded by leases.mu
}

// leases tracks every row this run holds, for heartbeats and expiry.
type leases struct {
	ttl time.Duration
	mu  sync.Mutex
	m   map[int64]*delivery
}

// add starts tracking a claimed row; its context is a child of parent.
func (l *leases) add(parent context.Context, row db.Outbox) *delivery {
	ctx, cancel := context.WithCancelCause(parent)
	d := &delivery{row: row, token: row.AcquiredToken, ctx: ctx, cancel: cancel}
	d.expiry = time.AfterFunc(l.ttl, func() { cancel(ErrLeaseLost) })
	l.mu.Lock()
	l.m[row.ID] = d
	l.mu.Unlock()
	return d
}

// remove stops tracking d and releases its resources.
func (l *leases) remove(d *delivery) {
	l.mu.Lock()
	delete(l.m, d.row.ID)
	l.mu.Unlock()
	d.expiry.Stop()
	d.cancel(nil)
}

// snapshot returns the ids and tokens of every held row.
func (l *leases) snapshot() ([]int64, []pgtype.UUID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]int64, 0, len(l.m))
	tokens := make([]pgtype.UUID, 0, len(l.m))
	for id, d := range l.m {
		ids = append(ids, id)
		tokens = append(tokens, d.token)
	}
	return ids, tokens
}

// extended restarts the expiry of the rows a heartbeat extended and
// returns the rows it did not: their leases are gone.
func (l *leases) extended(ids []int64, tried []int64) []*delivery {
	ok := make(map[int64]bool, len(ids))
	for _, id := range ids {
		ok[id] = true
	}
	var lost []*delivery
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range tried {
		d, held := l.m[id]
		if !held {
			continue // finished while the heartbeat ran
		}
		if ok[id] {
			d.expiry.Reset(l.ttl)
			continue
		}
		if !d.lost {
			d.lost = true
			lost = append(lost, d)
		}
	}
	return lost
}

// isLost reports whether a heartbeat found d's lease gone.
func (l *leases) isLost(d *delivery) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return d.lost
}
