package engine

import (
	"context"
	"time"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/lease"
)

// claimer takes rows of the run's queues for its workers. claim puts up
// to n rows into r.buf, which has room for them, each tracked in
// r.leases, and returns how many it put there. ctx ends a wait for a
// place to claim; the claim's statements are bounded by r.writes, not
// ctx (see byLease.claim), so rows a claim took when the stop came are
// released with the other unstarted rows.
//
// Every claimer keeps the claim promises: a row goes to one live claim
// at a time; every write of an outcome is filtered by the claim that
// made it (its lease token, or its transaction's row locks); a claim
// that dies counts as a delivery; a key's rows go one at a time, in
// order. The conformance suite holds each implementation, and the
// default mixture of them, to these promises.
type claimer interface {
	claim(ctx context.Context, n int32) (int, error)
}

// newClaimer returns how r claims; it is the one place that chooses.
//   - By lease, when the subscriber claims by lease (LockWindow negative,
//     a transactional handler) or the pool is too small to lock
//     (locksRows).
//   - Else by lock after a claim that found minLockedClaim rows or more,
//     and by lease after a smaller one: a claim by lock pays a
//     transaction and a record, which only claims of many rows amortise.
//     A negative minLockedClaim (a test's) claims by lock only.
func newClaimer(r *run) claimer {
	lease := &byLease{r: r, q: r.queries()}
	if r.locks == nil {
		return lease
	}
	lock := &byLock{r: r, lease: lease}
	if r.s.MinLockedClaim <= 0 {
		return lock
	}
	return &mixed{lock: lock, lease: lease, min: r.s.MinLockedClaim, last: r.s.FetchBatchSize}
}

// locksRows reports whether a subscriber with lockWindow, on a pool of
// maxConns connections, claims by lock at all.
func locksRows(lockWindow time.Duration, maxConns int32) bool {
	return lockWindow > 0 && maxConns >= MinLockingPoolConns
}

// mixed claims by lock while claims find many rows, else by lease.
type mixed struct {
	lock, lease claimer
	min         int
	// last is how many rows the last claim took.
	last int
}

func (m *mixed) claim(ctx context.Context, n int32) (got int, err error) {
	c := m.lease
	if m.last >= m.min {
		c = m.lock
	}
	got, err = c.claim(ctx, n)
	m.last = got
	return got, err
}

// byLease claims by writing a lease on its rows, in one statement.
type byLease struct {
	r *run
	q *db.Queries
}

// claim leases up to n rows of the subscriber's queues. A subscriber of
// one queue uses the claim without the ranking across queues.
//
// Its statements are not cancelled when ctx ends, only GracefulTimeout
// later (r.writes), and each is bounded by QueryTimeout: a statement the
// client gives up on may still take rows on the server after the client
// went away, leaving them leased to nobody until their lease expires. The
// stop waits for the claim instead, and releases the rows it took with
// the other unstarted rows.
func (c *byLease) claim(_ context.Context, n int32) (int, error) {
	r, sctx := c.r, c.r.writes
	ttl := r.s.LeaseTTL.Seconds()
	token, err := newLeaseToken()
	if err != nil {
		return 0, err
	}
	sent := time.Now()
	if len(r.s.Queues) > 1 {
		rows, err := c.q.Claim(sctx, db.ClaimParams{Token: token, Queues: r.s.Queues, MaxRows: n, LeaseTtlSeconds: ttl})
		r.hand(r.leases.Add(r.handlerCtx, rows, token, sent))
		return len(rows), err
	}
	queue := r.s.Queues[0]
	rows, err := c.q.ClaimQueue(sctx, db.ClaimQueueParams{Token: token, Queue: queue, MaxRows: n, LeaseTtlSeconds: ttl})
	fill := func(i int, c *db.ClaimRow) { fillClaimRow(c, &rows[i], queue) }
	r.hand(r.leases.AddEach(r.handlerCtx, len(rows), fill, token, sent))
	return len(rows), err
}

// claimExpired leases up to n rows of the subscriber's queues whose lease
// expired, and returns how many it claimed.
func (c *byLease) claimExpired(n int32) (int, error) {
	r := c.r
	token, err := newLeaseToken()
	if err != nil {
		return 0, err
	}
	sent := time.Now()
	rows, err := c.q.ClaimExpired(r.writes, db.ClaimExpiredParams{Queues: r.s.Queues, MaxRows: n, Token: token,
		LeaseTtlSeconds: r.s.LeaseTTL.Seconds()})
	claimed := make([]db.ClaimRow, len(rows))
	for i := range rows {
		claimed[i] = db.ClaimRow(rows[i])
	}
	r.hand(r.leases.Add(r.handlerCtx, claimed, token, sent))
	return len(rows), err
}

// hand puts claimed rows in buf for the workers.
func (r *run) hand(ds []*lease.Delivery) {
	for _, d := range ds {
		r.buf <- d
	}
}

// byLock claims by row lock (see lockedClaim), and by lease the rows
// whose lease expired (a holder stopped extending it), which it takes
// over every MaxFetchInterval and whenever a claim by lock finds nothing.
type byLock struct {
	r     *run
	lease *byLease
	// expiredTaken is when the claimer last took over expired leases.
	expiredTaken time.Time
	// lockedUpTo is where, in each queue, the last locked claim stopped,
	// set when it found as many rows as it asked for; frontLocked is when
	// a locked claim last looked from the queues' start.
	lockedUpTo  map[string]lockCursor
	frontLocked time.Time
}

func (c *byLock) claim(ctx context.Context, n int32) (int, error) {
	if time.Since(c.expiredTaken) >= c.r.s.MaxFetchInterval {
		c.expiredTaken = time.Now()
		if got, err := c.lease.claimExpired(n); err != nil || got > 0 {
			return got, err
		}
	}
	got, err := c.claimLocked(ctx, n)
	if got > 0 || err != nil {
		return got, err
	}
	c.expiredTaken = time.Now()
	return c.lease.claimExpired(n)
}
