package outbox

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
)

// delivery is one claim of a row, from claim to outcome. A row can be
// claimed twice by one run (its lease expired while a heartbeat could not
// reach the database, and the run's next claim took it back): the two
// deliveries share the row id and differ in their lease token.
type delivery struct {
	row   db.ClaimRow
	token pgtype.UUID
	// claimed is when the claim returned, on this process's clock.
	claimed time.Time

	// ctx is the handler's context: cancelled with ErrLeaseLost when the
	// lease expires unextended or a heartbeat finds it taken, and with
	// ErrSubscriberStopped on forced stop.
	ctx    context.Context
	cancel context.CancelCauseFunc
	expiry *time.Timer
	lost   bool // guarded by leases.mu
}

// sinceFirstAttempt is the time from the row's first handled attempt to
// now: what the server measured at the claim plus the time since, on this
// process's monotonic clock, so clock skew between the two does not count.
// It is 0 when the row was never attempted, and saturates rather than
// overflow for a first attempt another client wrote as ±infinity.
func (d *delivery) sinceFirstAttempt() time.Duration {
	s := d.row.SinceFirstAttemptSeconds
	if s == 0 {
		return 0
	}
	elapsed, more := seconds(s), time.Since(d.claimed)
	if elapsed > math.MaxInt64-more {
		return math.MaxInt64
	}
	return elapsed + more
}

// attempts reads an attempt count: a negative one, written by another
// client, is 0.
func attempts(n int32) int { return max(int(n), 0) }

// leases tracks every delivery this run holds, by lease token, for
// heartbeats and expiry.
type leases struct {
	ttl time.Duration
	mu  sync.Mutex
	m   map[pgtype.UUID]*delivery
}

// add starts tracking a row claimed by a statement sent at sent; its
// context is a child of parent. The lease ends LeaseTTL after sent, not
// after the rows arrived: the server stamped the expiry when it ran the
// statement, after sent, so the local deadline never outlives the
// server's however late the answer comes (a loaded client, a slow
// network), and no handler starts on a lease another claim may own.
func (l *leases) add(parent context.Context, row db.ClaimRow, sent time.Time) *delivery {
	ctx, cancel := context.WithCancelCause(parent)
	d := &delivery{row: row, token: row.AcquiredToken, claimed: time.Now(), ctx: ctx, cancel: cancel}
	d.expiry = time.AfterFunc(l.left(sent), func() { cancel(ErrLeaseLost) })
	l.mu.Lock()
	l.m[d.token] = d
	l.mu.Unlock()
	return d
}

// remove stops tracking d and releases its resources.
func (l *leases) remove(d *delivery) {
	l.mu.Lock()
	delete(l.m, d.token)
	l.mu.Unlock()
	d.expiry.Stop()
	d.cancel(nil)
}

// snapshot returns the ids and tokens of every held delivery.
func (l *leases) snapshot() ([]int64, []pgtype.UUID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]int64, 0, len(l.m))
	tokens := make([]pgtype.UUID, 0, len(l.m))
	for token, d := range l.m {
		ids = append(ids, d.row.ID)
		tokens = append(tokens, token)
	}
	return ids, tokens
}

// left is how much of a lease stamped by a statement sent at sent is
// left.
func (l *leases) left(sent time.Time) time.Duration { return max(l.ttl-time.Since(sent), 0) }

// extended restarts the expiry of the deliveries a heartbeat sent at sent
// extended, counting from sent like add, and returns those it tried but
// did not extend: their leases are gone.
func (l *leases) extended(extended, tried []pgtype.UUID, sent time.Time) []*delivery {
	ok := make(map[pgtype.UUID]bool, len(extended))
	for _, t := range extended {
		ok[t] = true
	}
	var lost []*delivery
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, t := range tried {
		d, held := l.m[t]
		if !held {
			continue // finished while the heartbeat ran
		}
		if ok[t] {
			d.expiry.Reset(l.left(sent))
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

// held counts the deliveries this run holds.
func (l *leases) held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}
