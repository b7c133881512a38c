package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
)

// handoffs tracks the per-key hand-overs the fetcher completes. When a
// key's head leaves the table, the deleting transaction unblocks the key's
// next row itself; when it cannot without waiting (a publisher of the key
// has not committed yet), it records the hand-over and announces it on the
// outbox's handoff channel, and the subscribers of the queue complete it.
type handoffs struct {
	// pending is set by the listener (a notification, a reconnect) and at
	// start: run the hand-over before the next claim.
	pending atomic.Bool
	// retryAt is when to try again the hand-overs whose keys another
	// transaction still held; zero when none wait. Fetcher only.
	retryAt time.Time
	delay   time.Duration
	// swept is when the fetcher last ran the hand-overs. Fetcher only.
	swept time.Time
	// inTx: the pool's sessions do not run at READ COMMITTED, so each
	// call runs in a READ COMMITTED transaction of its own. Fetcher only.
	inTx bool
}

// Hand-overs whose key another transaction holds are retried after
// handoffRetryMin, doubling up to MaxFetchInterval: the holder is a
// publisher whose commit (or rollback) frees the key.
const handoffRetryMin = 5 * time.Millisecond

// Each call of <table>_hand_off locks at most HandoffMaxKeys keys, in a
// transaction of its own: each lock holds a slot of PostgreSQL's shared
// lock table (about max_locks_per_transaction × max_connections slots for
// the whole server) until the call ends. A run of the hand-overs makes at
// most handoffCalls calls, so a backlog of recorded keys delays the next
// claim by little; the rest is taken up again before the claim after.
const (
	HandoffMaxKeys = 128
	handoffCalls   = 8
)

// handOff completes the recorded hand-overs of the subscriber's queues
// when one was announced, a retry is due, or MaxFetchInterval has passed
// since the last run: an announcement can be missed (the LISTEN
// connection was down, or writers skipped NOTIFY while the server's
// notification queue was half full), and a busy subscriber never polls.
func (r *run) handOff(ctx context.Context, q *db.Queries) {
	h := &r.handoffs
	now := time.Now()
	if !h.pending.Swap(false) && (h.retryAt.IsZero() || now.Before(h.retryAt)) &&
		now.Sub(h.swept) < r.s.MaxFetchInterval {
		return
	}
	h.retryAt, h.swept = time.Time{}, now
	var (
		waiting int32
		more    bool
		err     error
	)
	for range handoffCalls {
		var res db.HandOffRow
		res, err = r.handOffOnce(ctx, q)
		if err != nil {
			break
		}
		if res.Handed > 0 {
			// The keys' next rows are due from when they were published,
			// behind where the claims stopped.
			r.claims.Behind()
		}
		waiting += res.Waiting
		if more = res.More; !more {
			break
		}
	}
	switch {
	case err != nil && ctx.Err() != nil:
		h.pending.Store(true)
		return
	case err != nil:
		r.s.Log.WarnContext(ctx, "outbox: completing ordering-key hand-overs failed; retrying", slog.Any("error", err))
	case more:
		// Keys are left that no call has tried yet: go on after the
		// next claim.
		h.retryAt = time.Now()
		return
	case waiting == 0:
		h.delay = 0
		return
	}
	h.delay = min(max(2*h.delay, handoffRetryMin), r.s.MaxFetchInterval)
	h.retryAt = time.Now().Add(h.delay)
}

// handOffOnce makes one call of the hand-over function (HandOff), at READ
// COMMITTED: in autocommit while the pool's sessions run at it, else (a
// pool whose default is REPEATABLE READ or SERIALIZABLE, which HandOff
// reports by doing nothing) in a READ COMMITTED transaction of its own,
// from then on.
func (r *run) handOffOnce(ctx context.Context, q *db.Queries) (db.HandOffRow, error) {
	h, p := &r.handoffs, db.HandOffParams{Queues: r.s.Queues, MaxKeys: HandoffMaxKeys}
	if !h.inTx {
		res, err := q.HandOff(ctx, p)
		if err != nil || res.ReadCommitted {
			return res, err
		}
		h.inTx = true
	}
	tx, rollback, err := dbx.BeginReadCommitted(ctx, r.s.Pool, r.s.QueryTimeout)
	if err != nil {
		return db.HandOffRow{}, err
	}
	res, err := r.s.Queries(dbx.Bounded{Inner: tx, Timeout: r.s.QueryTimeout}).HandOff(ctx, p)
	if err == nil && !res.ReadCommitted {
		err = errors.New("outbox: a READ COMMITTED transaction reports another isolation level")
	}
	if err != nil {
		rollback()
		return db.HandOffRow{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, r.s.QueryTimeout)
	defer cancel()
	return res, tx.Commit(cctx)
}

// untilHandOff bounds an idle wait by the next hand-over retry.
func (r *run) untilHandOff(d time.Duration) time.Duration {
	if at := r.handoffs.retryAt; !at.IsZero() {
		return max(min(d, time.Until(at)), 0)
	}
	return d
}
