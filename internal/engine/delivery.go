package engine

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
)

// delivery is one claim of a row, from claim to outcome. The rows of one
// claim share its lease token. A row can be claimed twice by one run (its
// lease expired while a heartbeat could not reach the database, and the
// run's next claim took it back): the two deliveries share the row id and
// differ in their lease token.
type delivery struct {
	row   db.ClaimRow
	token pgtype.UUID
	// claimed is when the claim returned, on this process's clock.
	claimed time.Time
	// batch is the claim statement that leased the row.
	batch *claimBatch

	// ctx is the handler's context, made when the handler starts (see
	// leases.start), a child of batch.ctx: cancelled with ErrLeaseLost
	// when the lease expires unextended or a heartbeat finds it taken, and
	// with ErrSubscriberStopped on forced stop. Both are nil until then.
	ctx    context.Context
	cancel context.CancelCauseFunc
	lost   bool // guarded by leases.mu
	done   bool // guarded by leases.mu: no longer tracked
	// acking: a transactional handler's transaction is deleting the row,
	// so heartbeats leave it be. Guarded by leases.mu.
	acking bool
	// settled: a locked claim keeps the row's outcome, or gave the row
	// up. Guarded by batch.locked.mu.
	settled bool
}

// claimBatch is the rows one claim statement leased. They share their
// local lease deadline (counted from the statement's sending) and every
// heartbeat moves it for all of them, so one timer keeps it.
type claimBatch struct {
	// ctx is cancelled with ErrLeaseLost when the batch's lease runs out
	// unextended; it parents the handlers' contexts.
	ctx    context.Context
	cancel context.CancelCauseFunc
	expiry *time.Timer
	rows   []*delivery // guarded by leases.mu
	held   int         // rows not done; guarded by leases.mu
	// locked is the claim's transaction when the claim holds its rows by
	// row lock, until it ends (see lockedClaim); nil for a leased claim.
	locked *lockedClaim
	// ending is set while a locked claim's end writes the leases its rows
	// take, until it commits: a heartbeat on another connection would not
	// find them yet, and take the rows' leases for lost. Guarded by
	// leases.mu.
	ending bool
}

// context is the context of logs about d: its handler's once it started,
// else its batch's.
func (d *delivery) context() context.Context {
	if d.ctx != nil {
		return d.ctx
	}
	return d.batch.ctx
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
	elapsed, more := dbx.Seconds(s), time.Since(d.claimed)
	if elapsed > math.MaxInt64-more {
		return math.MaxInt64
	}
	return elapsed + more
}

// Attempts reads an attempt count: a negative one, written by another
// client, is 0.
func Attempts(n int32) int { return max(int(n), 0) }

// leases tracks every delivery this run holds, batch by batch, for
// heartbeats and expiry.
type leases struct {
	ttl     time.Duration
	mu      sync.Mutex
	batches map[*claimBatch]struct{}
	n       int // deliveries held
}

// newLeases returns an empty tracker of leases of the given TTL.
func newLeases(ttl time.Duration) leases {
	return leases{ttl: ttl, batches: map[*claimBatch]struct{}{}}
}

// add starts tracking rows claimed by a statement sent at sent; their
// contexts are children of parent. The lease ends LeaseTTL after sent, not
// after the rows arrived: the server stamped the expiry when it ran the
// statement, after sent, so the local deadline never outlives the
// server's however late the answer comes (a loaded client, a slow
// network), and no handler starts on a lease another claim may own.
func (l *leases) add(parent context.Context, rows []db.ClaimRow, token pgtype.UUID, sent time.Time) []*delivery {
	return l.addEach(parent, len(rows), func(i int, r *db.ClaimRow) { *r = rows[i] }, token, sent)
}

// addEach is add for n rows that fill writes in place, so rows read in
// another shape are not copied twice.
func (l *leases) addEach(parent context.Context, n int, fill func(i int, r *db.ClaimRow), token pgtype.UUID, sent time.Time) []*delivery {
	if n == 0 {
		return nil
	}
	ctx, cancel := context.WithCancelCause(parent)
	b := &claimBatch{ctx: ctx, cancel: cancel, rows: make([]*delivery, n), held: n}
	now := time.Now()
	ds := make([]delivery, n)
	for i := range ds {
		ds[i] = delivery{token: token, claimed: now, batch: b}
		fill(i, &ds[i].row)
		b.rows[i] = &ds[i]
	}
	b.expiry = time.AfterFunc(l.left(sent), func() { cancel(ErrLeaseLost) })
	l.mu.Lock()
	l.batches[b] = struct{}{}
	l.n += n
	l.mu.Unlock()
	return b.rows
}

// start makes d's handler context, or reports false when d's lease is
// already gone (expired, or found taken by a heartbeat): another claim may
// own the row, so its handler must not run.
func (l *leases) start(d *delivery) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d.lost || d.batch.ctx.Err() != nil {
		return false
	}
	d.ctx, d.cancel = context.WithCancelCause(d.batch.ctx)
	return true
}

// remove stops tracking d and releases its resources.
func (l *leases) remove(d *delivery) {
	l.mu.Lock()
	if d.done {
		l.mu.Unlock()
		return
	}
	d.done = true
	l.n--
	b := d.batch
	b.held--
	last := b.held == 0
	if last {
		delete(l.batches, b)
		b.expiry.Stop()
	}
	cancel := d.cancel
	l.mu.Unlock()
	if cancel != nil {
		cancel(nil)
	}
	if last {
		b.cancel(nil)
	}
}

// leaseStarted splits unsettled, rows of a locked claim that is ending
// without an outcome: it returns those whose handlers started, which take
// token, the token of the lease the claim's end writes, and gives up the
// others, whose handlers will never start (start refuses them). The rows
// of settled, which have outcomes, take token too.
func (l *leases) leaseStarted(unsettled, settled []*delivery, token pgtype.UUID) (started []*delivery) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, d := range append(unsettled, settled...) {
		d.batch.ending = true
	}
	for _, d := range unsettled {
		if d.ctx == nil {
			d.lost = true
			continue
		}
		d.token = token
		started = append(started, d)
	}
	for _, d := range settled {
		d.token = token
	}
	return started
}

// renew restarts b's expiry from sent, when a statement sent then leased
// its rows and committed: heartbeats extend them from now on.
func (l *leases) renew(b *claimBatch, sent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b.ending = false
	if b.held > 0 {
		b.expiry.Reset(l.left(sent))
	}
}

// snapshot returns every held delivery with a written lease, with its id
// and token (rows a locked claim holds have none yet).
func (l *leases) snapshot() ([]*delivery, []int64, []pgtype.UUID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ds := make([]*delivery, 0, l.n)
	ids := make([]int64, 0, l.n)
	tokens := make([]pgtype.UUID, 0, l.n)
	for b := range l.batches {
		for _, d := range b.rows {
			if !d.done && !d.acking && d.token.Valid && !b.ending {
				ds = append(ds, d)
				ids = append(ids, d.row.ID)
				tokens = append(tokens, d.token)
			}
		}
	}
	return ds, ids, tokens
}

// leaseMarginMax caps leaseMargin.
const leaseMarginMax = 250 * time.Millisecond

// leaseMargin is how long before a lease ends (counted from the sending
// of the statement that stamped it) its handlers' contexts are cancelled:
// a tenth of the lease, at most leaseMarginMax. Cancelling a context only
// asks; the handler's goroutine learns of it when the scheduler runs it,
// which on a loaded machine can be milliseconds later. The margin makes
// the cancellation reach the handler before another claim can take the
// row, not merely be issued before.
func leaseMargin(ttl time.Duration) time.Duration { return min(ttl/10, leaseMarginMax) }

// left is how much of a lease stamped by a statement sent at sent is
// left, less the margin.
func (l *leases) left(sent time.Time) time.Duration {
	return max(l.ttl-leaseMargin(l.ttl)-time.Since(sent), 0)
}

// extended restarts the expiry of the batches whose deliveries a
// heartbeat sent at sent extended, counting from sent like add, and
// returns the deliveries of tried it did not extend: their leases are
// gone. Their handlers' contexts, if made, are cancelled with
// ErrLeaseLost.
func (l *leases) extended(extended []lease, tried []*delivery, sent time.Time) []*delivery {
	ok := make(map[lease]bool, len(extended))
	for _, e := range extended {
		ok[e] = true
	}
	var lost []*delivery
	reset := map[*claimBatch]bool{}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, d := range tried {
		if d.done || d.acking {
			continue // finished, or being acknowledged, while the heartbeat ran
		}
		if ok[d.lease()] {
			reset[d.batch] = true
			continue
		}
		if !d.lost {
			d.lost = true
			if d.cancel != nil {
				d.cancel(ErrLeaseLost)
			}
			lost = append(lost, d)
		}
	}
	for b := range reset {
		if b.held > 0 {
			b.expiry.Reset(l.left(sent))
		}
	}
	return lost
}

// settle stops heartbeats of d, whose row a transactional handler's
// transaction is deleting: their statement would wait for its commit.
func (l *leases) settle(d *delivery) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d.acking = true
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
	return l.n
}

// lease names one delivery: its row and its claim's token.
type lease struct {
	id    int64
	token pgtype.UUID
}

// lease returns d's lease.
func (d *delivery) lease() lease { return lease{d.row.ID, d.token} }

// leasesOf reads the leases a batch write returns.
func leasesOf[R any](rows []R, pair func(R) (int64, pgtype.UUID)) []lease {
	out := make([]lease, len(rows))
	for i, r := range rows {
		out[i].id, out[i].token = pair(r)
	}
	return out
}
