// Package claim takes the rows of a subscriber's queues for its workers.
// A Claimer claims by lease (one statement stamps each row with a fresh
// token and the holder's expiry) or by row lock (a transaction of the
// claim's own holds the rows, recorded so that a claim that dies still
// counts, and ends by deleting the handled rows and leasing the rest);
// the default mixes the two. New is the one place that chooses. Claims
// hand their rows to the run as lease.Deliveries, and a claim by lock
// writes its rows' outcomes in its own transaction when it ends.
//
// It imports the generated queries, dbx and lease; what it needs of the
// run that uses it (where rows go, where outcomes go, its contexts) comes
// in an Env.
package claim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
	"github.com/outboxgen/outboxgen/internal/lease"
)

// Claimer takes rows of the run's queues for its workers.
//
// Every Claimer keeps the claim promises: a row goes to one live claim at
// a time; every write of an outcome is filtered by the claim that made it
// (its lease token, or its transaction's row locks); a claim that dies
// counts as a delivery; a key's rows go one at a time, in order. The
// conformance suites (this package's, the engine's and outbox's) hold
// each implementation, and the default mixture of them, to these
// promises.
type Claimer interface {
	// Claim puts up to n rows into the run's buffer (Env.Hand), which has
	// room for them, each tracked in Env.Leases, and returns how many it
	// put there. ctx ends a wait for a place to claim; the claim's
	// statements are bounded by Env.Writes, not ctx (see byLease.Claim),
	// so rows a claim took when the stop came are released with the
	// other unstarted rows.
	Claim(ctx context.Context, n int32) (int, error)
	// Ended waits until every claim by lock this Claimer made has ended
	// (the stop, Env.Stopping, ends them at once), and returns how many
	// of their outcomes could not be written before Env.Ends.
	Ended() int
	// HandedOn tells the Claimer of outcomes the lease path wrote: a
	// keyed row deleted unblocked its key's next row, which the next
	// claim must look for behind where the claims stopped.
	HandedOn(os []lease.Outcome)
	// Behind tells the Claimer that rows may have become claimable
	// behind where its claims stopped (a recorded hand-over was
	// completed): the next claim reads every queue from its start.
	Behind()
}

// Env is what a Claimer needs of the run that uses it.
type Env struct {
	// The subscriber's queues and settings (see outbox.SubscriberConfig).
	Queues                                               []string
	LeaseTTL, LockWindow, QueryTimeout, MaxFetchInterval time.Duration
	MinFetchInterval                                     time.Duration
	FetchBatchSize                                       int
	// MinLockedClaim is the fewest rows a claim must have found for the
	// next one to claim by lock; 0 or negative: every claim by lock.
	MinLockedClaim int
	Log            *slog.Logger

	// Pool is the outbox's pool; Queries runs its statements on a
	// connection, a transaction or the pool.
	Pool    *pgxpool.Pool
	Queries func(db.DBTX) *db.Queries

	// Leases tracks the rows the run holds.
	Leases *lease.Tracker
	// HandlerCtx parents the deliveries' contexts.
	HandlerCtx context.Context
	// Writes bounds the claims' statements: it ends GracefulTimeout after
	// the stop. Ends bounds the ends of claims by lock, a little later.
	Writes, Ends context.Context
	// Stopping is closed when the run stops: open claims by lock end at
	// once, so their unstarted rows go back.
	Stopping <-chan struct{}

	// Hand puts claimed rows in the run's buffer.
	Hand func([]*lease.Delivery)
	// Outcomes takes the outcomes a claim by lock leaves to the lease
	// path: failures, and outcomes that came while its end was written.
	Outcomes chan<- lease.Outcome
	// Report emits the metrics and logs of outcomes whose writes landed:
	// all of os when matched is nil, else those whose lease it holds.
	Report func(os []lease.Outcome, matched map[lease.Lease]bool)
	// Wake asks the run's fetcher to claim now.
	Wake func()

	// Ring: the outbox has the log tier's ring beside its table (package
	// ring), and the run claims from both. RingTurnAge is how long
	// writers write into one partition (RingTurnAge when zero).
	Ring        bool
	RingTurnAge time.Duration
}

// bounded returns the queries on the pool, each bounded by QueryTimeout.
func (e *Env) bounded() *db.Queries {
	return e.Queries(dbx.Bounded{Inner: e.Pool, Timeout: e.QueryTimeout})
}

// New returns how a run with env claims; it is the one place that
// chooses.
//   - By lease, when the subscriber claims by lease (LockWindow negative,
//     a transactional handler) or the pool is too small to lock
//     (LocksRows).
//   - Else by lock after a claim that found MinLockedClaim rows or more,
//     and by lease after a smaller one: a claim by lock pays a
//     transaction and a record, which only claims of many rows amortise.
//     A MinLockedClaim of 0 (a test's) claims by lock only.
func New(env *Env) Claimer {
	// An expired lease is taken over LeaseTTL after its holder stopped
	// extending it; one that expired unseen by the bounded reads waits at
	// most as long again.
	byL := &byLease{env: env, q: env.bounded(), floors: newFloors(env.MaxFetchInterval, max(env.MaxFetchInterval, env.LeaseTTL))}
	state := newState(env, byL)
	if !env.Ring {
		return state
	}
	return &byRing{env: env, state: state, lock: &byLock{env: env, lease: byL, locks: make(chan struct{}, InFlight),
		freed: make(chan struct{}, 1)}}
}

// newState returns how a run with env claims from the outbox table.
func newState(env *Env, byL *byLease) Claimer {
	if !LocksRows(env.LockWindow, env.Pool.Config().MaxConns) {
		return byL
	}
	lock := &byLock{env: env, lease: byL, locks: make(chan struct{}, InFlight)}
	if env.MinLockedClaim <= 0 {
		return lock
	}
	return &mixed{lock: lock, lease: byL, min: env.MinLockedClaim, last: env.FetchBatchSize}
}

// LocksRows reports whether a subscriber with lockWindow, on a pool of
// maxConns connections, claims by lock at all.
func LocksRows(lockWindow time.Duration, maxConns int32) bool {
	return lockWindow > 0 && maxConns >= MinLockingPoolConns
}

// mixed claims by lock while claims find many rows, else by lease.
type mixed struct {
	lock  *byLock
	lease *byLease
	min   int
	// last is how many rows the last claim took.
	last int
}

// Claim claims by lock when the last claim found at least min rows.
func (m *mixed) Claim(ctx context.Context, n int32) (got int, err error) {
	var c Claimer = m.lease
	if m.last >= m.min {
		c = m.lock
	}
	got, err = c.Claim(ctx, n)
	m.last = got
	return got, err
}

// Ended waits for the claims by lock.
func (m *mixed) Ended() int { return m.lock.Ended() }

// HandedOn lowers the floors the two share.
func (m *mixed) HandedOn(os []lease.Outcome) { m.lease.HandedOn(os) }

// Behind asks the next claim of either to sweep.
func (m *mixed) Behind() { m.lease.Behind() }

// byLease claims by writing a lease on its rows, in one statement.
type byLease struct {
	env *Env
	q   *db.Queries
	// floors are where claims look from, shared with the claims by lock.
	floors *floors
}

// Ended returns at once: a claim by lease ends with its statement.
func (c *byLease) Ended() int { return 0 }

// HandedOn lowers the floors to the keys' next rows.
func (c *byLease) HandedOn(os []lease.Outcome) { c.floors.handedOn(os) }

// Behind asks the next claim to sweep.
func (c *byLease) Behind() { c.floors.behind() }

// Claim leases up to n rows of the subscriber's queues. A subscriber of
// one queue uses the claim without the ranking across queues.
//
// Its statements are not cancelled when ctx ends, only GracefulTimeout
// later (r.Writes), and each is bounded by QueryTimeout: a statement the
// client gives up on may still take rows on the server after the client
// went away, leaving them leased to nobody until their lease expires. The
// stop waits for the claim instead, and releases the rows it took with
// the other unstarted rows.
func (c *byLease) Claim(_ context.Context, n int32) (int, error) {
	r, sctx := c.env, c.env.Writes
	ttl := r.LeaseTTL.Seconds()
	token, err := newLeaseToken()
	if err != nil {
		return 0, err
	}
	sent := time.Now()
	l := c.floors.begin(sent, readsBoth)
	if len(r.Queues) > 1 {
		p := db.ClaimParams{Token: token, Queues: r.Queues, Floors: make([]time.Time, len(r.Queues)), MaxRows: n,
			LeaseTtlSeconds: ttl, ExpiredWithin: l.expiredWithin}
		for i, q := range r.Queues {
			p.Floors[i] = l.floorOr(q)
		}
		rows, err := c.q.Claim(sctx, p)
		due := func(r *db.ClaimRow) (string, time.Time) { return r.Queue, r.NextAttemptAt }
		if err == nil {
			c.floors.took(l, newestDue(rows, due), len(rows) < int(n))
		}
		rows = giveBackRecorded(c, rows, token, sent, func(r *db.ClaimRow) (int64, bool) { return r.ID, r.Recheck }, due)
		r.Hand(r.Leases.Add(r.HandlerCtx, rows, token, sent))
		return len(rows), err
	}
	queue := r.Queues[0]
	rows, err := c.q.ClaimQueue(sctx, db.ClaimQueueParams{Token: token, Queue: queue, Floor: l.floor(queue), MaxRows: n,
		LeaseTtlSeconds: ttl, ExpiredWithin: l.expiredWithin})
	due := func(r *db.ClaimQueueRow) (string, time.Time) { return queue, r.NextAttemptAt }
	if err == nil {
		c.floors.took(l, newestDue(rows, due), len(rows) < int(n))
	}
	rows = giveBackRecorded(c, rows, token, sent, func(r *db.ClaimQueueRow) (int64, bool) { return r.ID, r.Recheck }, due)
	fill := func(i int, c *db.ClaimRow) { fillClaimRow(c, &rows[i], queue) }
	r.Hand(r.Leases.AddEach(r.HandlerCtx, len(rows), fill, token, sent))
	return len(rows), err
}

// newestDue returns, per queue, the latest next_attempt_at among rows, as
// due reads a row's queue and next_attempt_at.
func newestDue[R any](rows []R, due func(*R) (queue string, at time.Time)) map[string]time.Time {
	newest := make(map[string]time.Time)
	for i := range rows {
		q, at := due(&rows[i])
		if t, ok := newest[q]; !ok || at.After(t) {
			newest[q] = at
		}
	}
	return newest
}

// giveBackRecorded returns rows, which a claim by lease took with token,
// without those that a record of a claim by lock names: of the rows whose
// recheck is set, it reads which a record names (RecordedAmong), and
// gives those back, which no handler may take yet. A read that fails
// (a serialization failure on a SERIALIZABLE pool, say) is tried again,
// up to recheckTries times while the claim's lease (stamped by a statement
// sent at sent) lasts; then every row to recheck is given back unhandled,
// for the next claim. Rows it fails to give back stay leased to no
// handler until their lease expires. The reads end with the lease: a row
// handed on after it would be another claim's (the tracker refuses it).
func giveBackRecorded[R any](c *byLease, rows []R, token pgtype.UUID, sent time.Time, row func(*R) (id int64, recheck bool),
	due func(*R) (queue string, at time.Time)) []R {
	var ids []int64
	for i := range rows {
		if id, recheck := row(&rows[i]); recheck {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return rows
	}
	r := c.env
	var (
		named []int64
		err   error
	)
	ctx, cancel := context.WithDeadline(r.Writes, sent.Add(r.LeaseTTL-lease.Margin(r.LeaseTTL)))
	errs := dbx.Backoff{Base: 10 * time.Millisecond, Max: 50 * time.Millisecond}
	for try := range recheckTries {
		if named, err = c.q.RecordedAmong(ctx, ids); err == nil || try == recheckTries-1 || !dbx.Sleep(ctx, errs.Next()) {
			break
		}
	}
	cancel()
	if err != nil {
		r.Log.Warn("outbox: checking claimed rows against the records of claims by lock failed; giving them back unhandled",
			slog.Int("rows", len(ids)), slog.Any("error", err))
		named = ids
	}
	if len(named) == 0 {
		return rows
	}
	tokens := make([]pgtype.UUID, len(named))
	for i := range tokens {
		tokens[i] = token
	}
	if _, err := c.q.ReleaseBatchWithLease(r.Writes, db.ReleaseBatchWithLeaseParams{Ids: named, Tokens: tokens}); err != nil {
		r.Log.Warn("outbox: giving back claimed rows failed; they are delivered again when their lease expires",
			slog.Int("rows", len(named)), slog.Any("error", err))
	} else {
		r.Log.Debug("outbox: gave back claimed rows that a claim by lock's record may hold", slog.Int("rows", len(named)))
	}
	drop := make(map[int64]bool, len(named))
	for _, id := range named {
		drop[id] = true
	}
	return slices.DeleteFunc(rows, func(x R) bool {
		id, _ := row(&x)
		if drop[id] {
			// Back behind the floor.
			c.floors.lower(due(&x))
		}
		return drop[id]
	})
}

// recheckTries bounds the reads of giveBackRecorded.
const recheckTries = 3

// claimExpired leases up to n rows of the subscriber's queues whose lease
// expired, and returns how many it claimed.
func (c *byLease) claimExpired(n int32) (int, error) {
	r := c.env
	token, err := newLeaseToken()
	if err != nil {
		return 0, err
	}
	sent := time.Now()
	l := c.floors.begin(sent, readsExpired)
	rows, err := c.q.ClaimExpired(r.Writes, db.ClaimExpiredParams{Queues: r.Queues, MaxRows: n, Token: token,
		LeaseTtlSeconds: r.LeaseTTL.Seconds(), ExpiredWithin: l.expiredWithin})
	if err == nil {
		c.floors.took(l, nil, len(rows) < int(n))
	}
	claimed := make([]db.ClaimRow, len(rows))
	for i := range rows {
		claimed[i] = db.ClaimRow(rows[i])
	}
	r.Hand(r.Leases.Add(r.HandlerCtx, claimed, token, sent))
	return len(rows), err
}

// newLeaseToken draws the lease token of one claim statement.
func newLeaseToken() (pgtype.UUID, error) {
	id, err := uuid.NewRandom()
	if err != nil {
		return pgtype.UUID{}, fmt.Errorf("drawing a lease token: %w", err)
	}
	return pgtype.UUID{Bytes: id, Valid: true}, nil
}

// fillClaimRow writes r, a row of queue, as Claim returns it.
func fillClaimRow(c *db.ClaimRow, r *db.ClaimQueueRow, queue string) {
	*c = db.ClaimRow{
		ID: r.ID, Queue: queue, Payload: r.Payload, Headers: r.Headers, OrderingKey: r.OrderingKey, TimerID: r.TimerID,
		CreatedAt: r.CreatedAt, AttemptsCount: r.AttemptsCount, DeliveriesCount: r.DeliveriesCount,
		SinceFirstAttemptSeconds: r.SinceFirstAttemptSeconds, NextAttemptAt: r.NextAttemptAt,
	}
}

// byLock claims by row lock (see lockedClaim), and by lease the rows
// whose lease expired (a holder stopped extending it), which it takes
// over every MaxFetchInterval and whenever a claim by lock finds nothing.
type byLock struct {
	env   *Env
	lease *byLease
	// locks admits claims by lock: one slot each, InFlight at most;
	// freed, when set (the ring's claims wait on it), is signalled when a
	// claim that held its rows ends.
	locks chan struct{}
	freed chan struct{}
	// lockEnds counts the claims by lock not yet ended.
	lockEnds sync.WaitGroup
	// lockUnwritten counts the outcomes of claims by lock whose end could
	// not be written before Env.Ends was done.
	lockUnwritten atomic.Int64
	// expiredTaken is when the claimer last took over expired leases.
	expiredTaken time.Time
	// lockedUpTo is where, in each queue, the last locked claim stopped,
	// set when it found as many rows as it asked for; frontLocked is when
	// a locked claim last looked from the queues' start.
	lockedUpTo  map[string]lockCursor
	frontLocked time.Time
	// turn is which queue a claim with fewer rows left than queues
	// locks first.
	turn int
}

// HandedOn lowers the floors to the keys' next rows.
func (c *byLock) HandedOn(os []lease.Outcome) { c.lease.HandedOn(os) }

// Behind asks the next claim to sweep.
func (c *byLock) Behind() { c.lease.Behind() }

// Ended waits for the ends of the claims by lock.
func (c *byLock) Ended() int {
	c.lockEnds.Wait()
	return int(c.lockUnwritten.Load())
}

// Claim claims by lock, and takes over expired leases every
// MaxFetchInterval and when a claim by lock finds nothing.
func (c *byLock) Claim(ctx context.Context, n int32) (int, error) {
	if time.Since(c.expiredTaken) >= c.env.MaxFetchInterval {
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

// Claims by row lock (SubscriberConfig.LockWindow, migration 7).
//
// A locked claim takes its rows with SELECT ... FOR UPDATE SKIP LOCKED in
// a transaction of its own and writes nothing to them. Before any of its
// handlers runs, the claim is recorded (transaction id and row ids) in a
// statement that commits on its own, so that a claim that aborts still
// counts as a delivery of its rows (see RecordLock). When every row has an
// outcome, or LockWindow has passed, or the forced stop came, one
// statement ends the claim in its transaction: it deletes the acknowledged
// rows, leases the others (rows whose handlers still run, and failed rows,
// whose retry or dead letter the lease path writes next) and deletes the
// record; then the transaction commits. From then on its leased rows are
// ordinary leased deliveries: heartbeats, lease-filtered writes. The
// outcomes of rows whose handlers finish while the end is being written
// wait for its commit: a lease-filtered write that ran before it would
// not see the lease, and would take the row for lost.

// InFlight caps the locked claims of one subscriber open at
// once: each holds a pool connection while its handlers run.
const InFlight = 2

// MinLockingPoolConns is the smallest pool a subscriber claims by lock
// from: its claims in flight, their records and the lease path's writes
// must not starve each other or the handlers.
const MinLockingPoolConns = 4

// errClaimEnded reports that a locked claim's transaction ended (its
// connection died) before the claim was recorded: its rows are not held.
var errClaimEnded = errors.New("outbox: the claim's transaction ended before it was recorded")

// errLocksLost reports that a locked claim's end matched fewer rows than
// it holds: its transaction no longer holds their locks.
var errLocksLost = errors.New("outbox: a locked claim's rows were not all held at its end")

// lockedClaim is the transaction of one locked claim and what it keeps
// until it ends.
type lockedClaim struct {
	tx  pgx.Tx
	xid int64
	// aborted are the rows whose aborted deliveries this claim counted;
	// at its end, those of them it handed to a handler.
	aborted []int64

	// dead is closed when the claim's connection failed while its
	// handlers ran; stopWatching stops watching it (see watch).
	dead         chan struct{}
	stopWatching func()

	mu   sync.Mutex
	open bool            // outcomes are kept here, to be written at the end
	left int             // rows not settled
	kept []lease.Outcome // outcomes of settled rows
	// gaveUp are the settled rows no handler started (GiveUp).
	gaveUp []*lease.Delivery
	// late are the outcomes of rows settled while the end was written:
	// they go the lease path's way once its transaction has ended, as a
	// write that ran before the commit would not see the end's lease.
	late  []lease.Outcome
	ended bool // the end's transaction has ended: outcomes go at once
	// settled is closed when every row has an outcome or was given up.
	settled chan struct{}
	// end writes the claim's end in its transaction; nil: a claim of
	// the outbox table's rows (byLock.writeLockEnd).
	end func(ctx context.Context, q *db.Queries, e *lockEnd, token pgtype.UUID) error
	// committed, when set, runs once the end's transaction committed e.
	committed func(e *lockEnd)
	// released, when set, runs once the claim's transaction has ended,
	// whether its end committed or not: what it held is free (release).
	released func()

	// A claim of a keyed lane of the ring hands a key's rows out one
	// after another (see chain): next is the row of its key that follows
	// each row; ready, those whose row before them was acknowledged;
	// unhanded, the rows not handed out yet; remove stops tracking a row.
	next     map[*lease.Delivery]*lease.Delivery
	ready    map[*lease.Delivery]*lease.Delivery
	unhanded map[*lease.Delivery]bool
	remove   func(*lease.Delivery)
	// acks, when set, makes a row's acknowledgement outlive the claim
	// before Next hands its key's next row out: should the claim's
	// transaction abort, that row is not delivered again after the next.
	acks *ackLog

	// A claim whose rows' handlers each run for longer than straggle
	// (when it is set) ends before LockWindow once every row left has
	// started (see straggling); took are how long its settled rows took,
	// from when the claim was held.
	straggle time.Duration
	held     time.Time
	took     []time.Duration
	// observe, when set, learns how long the claim's rows took (lasted)
	// when the claim ends.
	observe func(time.Duration)
}

// straggling reports whether c has been held for straggle, and every
// row of b without an outcome is running (started reports it of rows):
// ending the claim now leases them, and frees what the claim holds for
// rows that wait behind them. A row no worker has started yet, or a
// key's next row not yet handed out, keeps the claim open.
func (c *lockedClaim) straggling(b *lease.Batch, started func([]*lease.Delivery) bool) bool {
	c.mu.Lock()
	var running []*lease.Delivery
	for _, d := range b.Rows {
		if !d.Settled {
			running = append(running, d)
		}
	}
	waiting := len(c.unhanded) > 0 || time.Since(c.held) < c.straggle
	c.mu.Unlock()
	return !waiting && len(running) > 0 && started(running)
}

// lasted returns the median of how long the rows of b took: those
// without an outcome (still running, or given up) count as taking until
// now.
func (c *lockedClaim) lasted(b *lease.Batch) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	took := slices.Clone(c.took)
	for _, d := range b.Rows {
		if !d.Settled {
			took = append(took, time.Since(c.held))
		}
	}
	if len(took) == 0 {
		return 0
	}
	slices.Sort(took)
	return took[len(took)/2]
}

// chain makes c hand the keyed rows of ds, in id order, one key at a
// time: it returns the unkeyed rows and each key's first row, to be
// handed out now; each next row is handed out when the one before it is
// acknowledged (Next). remove stops tracking a row that will not be
// handed out.
func (c *lockedClaim) chain(ds []*lease.Delivery, remove func(*lease.Delivery)) (first []*lease.Delivery) {
	c.next = make(map[*lease.Delivery]*lease.Delivery)
	c.ready = make(map[*lease.Delivery]*lease.Delivery)
	c.unhanded = make(map[*lease.Delivery]bool)
	c.remove = remove
	type queueKey struct{ queue, key string }
	last := make(map[queueKey]*lease.Delivery)
	for _, d := range ds {
		if d.Row.OrderingKey == nil {
			first = append(first, d)
			continue
		}
		key := queueKey{queue: d.Row.Queue, key: *d.Row.OrderingKey}
		if before, ok := last[key]; ok {
			c.next[before] = d
			c.unhanded[d] = true
		} else {
			first = append(first, d)
		}
		last[key] = d
	}
	return first
}

// Next returns the row of d's key that follows d, when d was
// acknowledged while the claim is open (and, with acks, the
// acknowledgement was recorded to outlive the claim); the worker that
// ran d runs it. Nil otherwise: the claim's end gives the rest of the key
// up.
func (c *lockedClaim) Next(d *lease.Delivery) *lease.Delivery {
	c.mu.Lock()
	f := c.ready[d]
	if f == nil || !c.open {
		c.mu.Unlock()
		return nil
	}
	delete(c.ready, d)
	c.mu.Unlock()
	if c.acks != nil && !c.acks.record(d.Row.ID) {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.open {
		// The end began while the acknowledgement was written: it gives
		// f up with the rows no handler started.
		return nil
	}
	delete(c.unhanded, f)
	return f
}

// chained lets go the row that follows o's row, as o is kept: Next hands
// it out when o is an acknowledgement; any other outcome gives up the
// key's remaining rows, which the claim's end moves behind o's row.
// Call with mu held.
func (c *lockedClaim) chained(o lease.Outcome) {
	f := c.next[o.D]
	if f == nil {
		return
	}
	if o.Kind == lease.Ack || o.Kind == lease.Drop {
		c.ready[o.D] = f
		return
	}
	for ; f != nil; f = c.next[f] {
		delete(c.unhanded, f)
		c.remove(f)
		f.Settled = true
		c.gaveUp = append(c.gaveUp, f)
		c.settle()
	}
}

// dropUnhanded stops tracking the rows the claim never handed out, as
// its end gives them up. Call with mu held, once the claim is closed.
func (c *lockedClaim) dropUnhanded() {
	for d := range c.unhanded {
		c.remove(d)
	}
	c.unhanded = nil
}

// Keep keeps o, the outcome of a row of the claim, for the claim's end,
// or, while the end is being written, for after it (see ended); false
// means the claim has ended and o goes the lease path's way (its row was
// leased by then: o.D.Token is the lease's).
func (c *lockedClaim) Keep(o lease.Outcome) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return false
	}
	if !c.open {
		c.late = append(c.late, o)
		return true
	}
	c.kept = append(c.kept, o)
	if c.straggle > 0 {
		c.took = append(c.took, time.Since(c.held))
	}
	o.D.Settled = true
	c.settle()
	c.chained(o)
	return true
}

// GiveUp gives up d, a row no handler started (the subscriber is
// stopping): the claim's end leaves a row of the outbox table unwritten,
// so its lock is released at commit, and moves a row of the ring into the
// outbox table, unleased. False means the claim has ended and d holds a
// written lease.
func (c *lockedClaim) GiveUp(d *lease.Delivery) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.open {
		return false
	}
	d.Settled = true
	c.gaveUp = append(c.gaveUp, d)
	c.settle()
	return true
}

// endWritten marks the end's transaction ended (committed or rolled
// back) and returns the outcomes kept meanwhile, for the lease path.
func (c *lockedClaim) endWritten() []lease.Outcome {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ended = true
	late := c.late
	c.late = nil
	return late
}

// settle counts one more settled row. Call with mu held.
func (c *lockedClaim) settle() {
	c.left--
	if c.left == 0 {
		close(c.settled)
	}
}

// countAborted takes the deliveries of aborted claims that counted
// reports for the claimed rows ids: it returns the indexes in ids of the
// rows to hand to handlers, all but those an aborted claim still holds
// (its handlers may still run, so the claim gives them up, and they are
// handed to a handler only once that claim's lease would have expired),
// and the deliveries each row's count must add.
func (c *lockedClaim) countAborted(ids []int64, counted db.RecordLockRow) (handed []int, more map[int64]int32) {
	more = make(map[int64]int32, len(counted.AbortedIds))
	held := make(map[int64]bool)
	for i, id := range counted.AbortedIds {
		if i < len(counted.Held) && counted.Held[i] {
			held[id] = true
			continue
		}
		if i < len(counted.AbortedCounts) {
			more[id] = counted.AbortedCounts[i]
		}
		c.aborted = append(c.aborted, id)
	}
	handed = make([]int, 0, len(ids))
	for i, id := range ids {
		if !held[id] {
			handed = append(handed, i)
		}
	}
	return handed, more
}

// watch watches c's connection while b's handlers run: when the
// connection fails (its backend was terminated, the server restarted, a
// cut), the claim's locks are gone, so b's handlers are cancelled at once
// and its rows that have not started never do. stopWatching ends it
// before the connection is used again.
func (c *lockedClaim) watch(b *lease.Batch) {
	ctx, stop := context.WithCancel(context.Background())
	watched := make(chan struct{})
	c.stopWatching = func() {
		stop()
		<-watched
	}
	conn := c.tx.Conn().PgConn()
	go func() {
		defer close(watched)
		for {
			err := conn.WaitForNotification(ctx)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				b.Cancel(lease.ErrLeaseLost)
				close(c.dead)
				return
			}
		}
	}()
}

// claimLocked locks up to n rows of the subscriber's queues in a new
// transaction, records the claim, and puts the rows in buf; it returns how
// many it claimed. It waits, until ctx ends, while lockedClaimsInFlight
// claims are open; sctx bounds its statements (see claim). Its
// transaction runs at READ COMMITTED whatever the pool's default
// isolation: at REPEATABLE READ or SERIALIZABLE, locking or deleting a
// row another transaction changed since the claim began fails with a
// serialization failure, which no retry in the same transaction cures.
func (c *byLock) claimLocked(ctx context.Context, n int32) (int, error) {
	r, sctx := c.env, c.env.Writes
	select {
	case c.locks <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	ctx = sctx
	started := false
	defer func() {
		if !started {
			<-c.locks
		}
	}()
	tx, rollback, err := dbx.BeginReadCommitted(ctx, r.Pool, r.QueryTimeout)
	if err != nil {
		return 0, err
	}
	q := r.Queries(dbx.Bounded{Inner: tx, Timeout: r.QueryTimeout})
	idle := r.LeaseTTL.Milliseconds()
	sent := time.Now()
	got, err := c.lockRows(ctx, q, n, idle)
	defer putLockRows(got)
	ids := make([]int64, len(got))
	var xid int64
	for i := range got {
		ids[i], xid = got[i].ID, got[i].Xid
	}
	// The claimed rows go from the scanned slice straight to their
	// deliveries: fill writes row i as a claim row.
	fill := func(i int, row *db.ClaimRow) {
		g := &got[i]
		*row = db.ClaimRow{ID: g.ID, Queue: g.Queue, Payload: g.Payload, Headers: g.Headers, OrderingKey: g.OrderingKey,
			TimerID: g.TimerID, CreatedAt: g.CreatedAt, AttemptsCount: g.AttemptsCount, DeliveriesCount: g.DeliveriesCount,
			SinceFirstAttemptSeconds: g.SinceFirstAttemptSeconds, NextAttemptAt: g.NextAttemptAt}
	}
	if err != nil || len(ids) == 0 {
		rollback()
		return 0, err
	}
	lower, upper := Runs(ids)
	counted, err := r.bounded().RecordLock(ctx, db.RecordLockParams{Xid: xid, Lower: lower, Upper: upper,
		LeaseTtlSeconds: r.LeaseTTL.Seconds()})
	if err == nil && !counted.Recorded {
		err = errClaimEnded
	}
	if err == nil {
		// RecordLock found the transaction in progress before it
		// committed; one more statement in the transaction shows that it
		// still is, after the commit, so the record held the rows before
		// their locks could go.
		err = q.ConfirmLocked(ctx)
	}
	if err != nil {
		rollback()
		return 0, fmt.Errorf("recording a locked claim: %w", err)
	}
	lc := &lockedClaim{tx: tx, xid: xid, open: true, settled: make(chan struct{}), dead: make(chan struct{})}
	handed := len(ids)
	if len(counted.AbortedIds) > 0 {
		indexes, more := lc.countAborted(ids, counted)
		claimed := fill
		handed = len(indexes)
		fill = func(i int, row *db.ClaimRow) {
			claimed(indexes[i], row)
			row.DeliveriesCount = int32(min(int64(row.DeliveriesCount)+int64(more[row.ID]), math.MaxInt32))
		}
	}
	lc.left = handed
	lc.kept = make([]lease.Outcome, 0, handed)
	if handed == 0 {
		// Every row is still held by an aborted claim whose handlers may
		// run: give them all back.
		c.lockEnds.Add(1)
		started = true
		go c.endLocked(nil, lc)
		return 0, nil
	}
	ds := r.Leases.AddEach(r.HandlerCtx, handed, fill, pgtype.UUID{}, sent)
	started = true
	c.hold(ds, ds, lc)
	return len(ds), nil
}

// hold hands handed, of ds, the rows of locked claim lc, to the run (lc
// hands the others out later, see lockedClaim.chain): lc holds them
// until endLocked ends it, which frees lc's place among the claims in
// flight.
func (k *byLock) hold(ds, handed []*lease.Delivery, lc *lockedClaim) {
	ds[0].Batch.Hold = lc
	lc.held = time.Now()
	lc.watch(ds[0].Batch)
	k.lockEnds.Add(1)
	go k.endLocked(ds[0].Batch, lc)
	k.env.Hand(handed)
}

// release runs c.released, once; only endLocked calls it.
func (c *lockedClaim) release() {
	if c.released != nil {
		c.released()
		c.released = nil
	}
}

// endLocked ends the locked claim c of batch b when every row is settled,
// LockWindow has passed, or the subscriber stops, and frees its place
// among the claims in flight.
func (k *byLock) endLocked(b *lease.Batch, c *lockedClaim) {
	r := k.env
	defer k.lockEnds.Done()
	defer func() {
		c.release()
		<-k.locks
		select {
		case k.freed <- struct{}{}:
		default:
		}
	}()
	if b == nil {
		// Nothing was handed to a handler.
		if _, err := k.endLockTx(c, &lockEnd{}, nil, pgtype.UUID{}); err != nil && r.Ends.Err() == nil {
			r.Log.Warn("outbox: ending a locked claim failed", slog.Any("error", err))
		}
		return
	}
	window := time.NewTimer(r.LockWindow)
	var lag <-chan time.Time
	if c.straggle > 0 {
		t := time.NewTicker(c.straggle / 2)
		defer t.Stop()
		lag = t.C
	}
wait:
	for {
		select {
		case <-c.settled:
		case <-window.C:
		case <-r.Stopping:
		case <-c.dead:
		case <-lag:
			if !c.straggling(b, r.Leases.Started) {
				continue
			}
		}
		break wait
	}
	window.Stop()
	c.stopWatching()
	if c.observe != nil {
		c.observe(c.lasted(b))
	}

	token, err := newLeaseToken()
	c.mu.Lock()
	c.open = false
	kept := c.kept
	var (
		e     = lockEnd{deleted: make([]int64, 0, len(kept))}
		later []lease.Outcome                       // failures the lease path writes
		done  = make([]lease.Outcome, 0, len(kept)) // acknowledgements and terminal deletes
	)
	for _, o := range kept {
		switch o.Kind {
		case lease.Ack, lease.Drop:
			e.deleted = append(e.deleted, o.D.Row.ID)
			done = append(done, o)
		default:
			e.lease(o.D)
			later = append(later, o)
		}
	}
	var unsettled []*lease.Delivery
	for _, d := range b.Rows {
		if !d.Settled {
			unsettled = append(unsettled, d)
		}
	}
	// Rows whose handlers started are leased; rows no worker has started
	// are given up, so other subscribers may take them when the claim
	// commits. Every leased row takes the token before any write can use
	// it, and before the claim's handlers learn it has ended: should the
	// end fall back to leasing every row, the acknowledged ones are
	// written with it too.
	running := r.Leases.LeaseStarted(unsettled, deliveriesOf(kept), token)
	c.dropUnhanded()
	for _, d := range running {
		e.lease(d)
	}
	givenUp := slices.DeleteFunc(slices.Clone(unsettled), func(d *lease.Delivery) bool { return slices.Contains(running, d) })
	givenUp = append(givenUp, c.gaveUp...)
	for _, d := range givenUp {
		e.givenUp = append(e.givenUp, d.Row.ID)
	}
	// The deliveries of ended claims that this claim counted leave their
	// records only for the rows it handed to a handler: a row given back
	// keeps its count there, for the claim that takes it next.
	if len(c.aborted) > 0 {
		handed := make(map[int64]bool, len(kept)+len(running))
		for _, o := range kept {
			handed[o.D.Row.ID] = true
		}
		for _, d := range running {
			handed[d.Row.ID] = true
		}
		c.aborted = slices.DeleteFunc(c.aborted, func(id int64) bool { return !handed[id] })
	}
	c.mu.Unlock()

	sent := time.Now()
	fellBack := false
	if err == nil {
		fellBack, err = k.endLockTx(c, &e, done, token)
	}
	// The transaction has ended: what it held is free before the writes
	// and wake-ups that follow.
	c.release()
	if err != nil {
		if r.Ends.Err() != nil {
			k.lockUnwritten.Add(int64(len(kept)))
		} else {
			r.Log.Warn("outbox: ending a locked claim failed; its rows are delivered again",
				slog.Int("rows", len(b.Rows)), slog.Any("error", err))
			r.Report(kept, map[lease.Lease]bool{})
		}
		// Nothing was written: the rows are free again, and the handlers
		// still running hold no lease.
		k.lease.floors.gaveBack(b.Rows)
		b.Cancel(lease.ErrLeaseLost)
		for _, o := range c.endWritten() {
			r.Outcomes <- o
		}
		return
	}
	r.Leases.Renew(b, sent)
	k.lease.floors.gaveBack(givenUp)
	k.lease.floors.handedOn(done)
	if fellBack {
		later = kept
	} else {
		r.Report(done, nil)
	}
	later = append(later, c.endWritten()...)
	for _, o := range later {
		r.Outcomes <- o
	}
	if len(later) > 0 || lease.Keyed(done) {
		r.Wake()
	}
}

// lockEnd is what a locked claim's end writes: the rows it deletes, those
// it leases (with their delivery counts), and those no handler started,
// which it gives up.
type lockEnd struct {
	deleted, leased, givenUp []int64
	deliveries               []int32
}

// lease adds d's row to the rows the end leases.
func (e *lockEnd) lease(d *lease.Delivery) {
	e.leased = append(e.leased, d.Row.ID)
	e.deliveries = append(e.deliveries, d.Row.DeliveriesCount)
}

// endLockTx writes e, the end of locked claim c, in its transaction and
// commits it. A statement that fails is rolled back to a savepoint and
// retried with backoff until r.Ends is done, as the lease path retries
// its writes, while the transaction keeps the rows. When the database
// refuses the deletes for their values, whatever the SQLSTATE (a trigger
// refusing one row, say: dbx.Permanent), the end leases the rows of done
// as well and deletes none, and fellBack reports that every outcome is to
// be written the lease path's way, which isolates and gives up only the
// outcomes the database refuses. An error that dooms the transaction, or
// a refused fallback, ends the claim without writing. On error the
// transaction is rolled back: nothing was written.
func (k *byLock) endLockTx(c *lockedClaim, e *lockEnd, done []lease.Outcome, token pgtype.UUID) (fellBack bool, err error) {
	r := k.env
	ctx := r.Ends
	q := r.Queries(dbx.Bounded{Inner: c.tx, Timeout: r.QueryTimeout})
	defer func() {
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.QueryTimeout)
			defer cancel()
			_ = c.tx.Rollback(rctx)
		}
	}()
	if err := q.SavepointLockEnd(ctx); err != nil {
		return false, err
	}
	errs := dbx.Backoff{Base: 50 * time.Millisecond, Max: min(5*time.Second, r.MaxFetchInterval)}
	for {
		err = k.writeLockEnd(ctx, q, c, e, token)
		if err == nil {
			if err = c.tx.Commit(ctx); err == nil && c.committed != nil {
				c.committed(e)
			}
			return fellBack, err
		}
		if ctx.Err() != nil || c.tx.Conn().IsClosed() {
			return false, err
		}
		class := dbx.Classify(err)
		if class == dbx.Doomed || (class == dbx.Permanent && fellBack) {
			// Nothing more can be written in this transaction: roll it
			// back. Its record holds the rows until LeaseTTL after the
			// claim, and they are delivered again.
			return false, err
		}
		if rerr := q.RollbackToLockEnd(ctx); rerr != nil {
			return false, errors.Join(err, rerr)
		}
		if class == dbx.Permanent {
			fellBack = true
			for _, o := range done {
				e.lease(o.D)
			}
			e.deleted = nil
			continue
		}
		wait := errs.Next()
		r.Log.ErrorContext(ctx, "outbox: ending a locked claim failed; retrying",
			slog.Int("rows", len(e.deleted)+len(e.leased)), slog.Any("error", err), slog.Duration("backoff", wait))
		dbx.Sleep(ctx, wait)
	}
}

// writeLockEnd runs the statements of e in c's transaction: the deletes,
// the leases, and the end of the claim's record. Each is a statement of
// its own: one statement that did all three cost the server twice as
// much per row.
func (k *byLock) writeLockEnd(ctx context.Context, q *db.Queries, c *lockedClaim, e *lockEnd, token pgtype.UUID) error {
	if c.end != nil {
		return c.end(ctx, q, e, token)
	}
	r := k.env
	if len(e.deleted) > 0 {
		lower, upper := Runs(e.deleted)
		n, err := q.DeleteLocked(ctx, db.DeleteLockedParams{Lower: lower, Upper: upper})
		if err != nil {
			return err
		}
		if int(n) != len(e.deleted) {
			return errLocksLost
		}
	}
	if len(e.leased) > 0 {
		n, err := q.LeaseLocked(ctx, db.LeaseLockedParams{Ids: e.leased, Deliveries: e.deliveries, Token: token,
			LeaseTtlSeconds: r.LeaseTTL.Seconds()})
		if err != nil {
			return err
		}
		if int(n) != len(e.leased) {
			return errLocksLost
		}
	}
	if len(c.aborted) > 0 {
		if err := q.ForgetAborted(ctx, db.ForgetAbortedParams{Ids: c.aborted, Xid: c.xid}); err != nil {
			return err
		}
	}
	return q.EndLockRecord(ctx, db.EndLockRecordParams{Durable: len(e.leased) > 0, Xid: c.xid})
}

// lockCursor is a position in a queue's claim order: a row's
// next_attempt_at and id.
type lockCursor struct {
	at time.Time
	id int64
}

// lockRounds bounds the statements of one claim of several queues.
const lockRounds = 4

// lockRows locks up to n rows of the subscriber's queues. While the
// subscriber's last locked claim is still open and took all it asked for,
// it starts each queue past the last row that claim took there, instead
// of stepping over the rows that claim holds one lock at a time. Rows
// before that position that no claim holds (a row given back, a key's
// next row, a row its publisher's long transaction dated early) are found
// by a claim that looks from the start: the first claim made when no
// other is open, one that found nothing past the positions, and one at
// least every LockWindow.
func (c *byLock) lockRows(ctx context.Context, q *db.Queries, n int32, idle int64) ([]db.LockRow, error) {
	r := c.env
	var past map[string]lockCursor
	if c.lockedUpTo != nil && len(c.locks) > 1 && time.Since(c.frontLocked) < r.LockWindow {
		past = c.lockedUpTo
	}
	c.lockedUpTo = nil
	l := c.lease.floors.begin(time.Now(), readsDue)
	got, err := c.lockFrom(ctx, q, n, idle, past, l)
	if err == nil && len(got) == 0 && past != nil {
		past = nil
		got, err = c.lockFrom(ctx, q, n, idle, nil, l)
	}
	if err != nil {
		return nil, err
	}
	c.lease.floors.took(l, newestDue(got, func(r *db.LockRow) (string, time.Time) { return r.Queue, r.NextAttemptAt }), false)
	if past == nil {
		c.frontLocked = time.Now()
	}
	if len(got) == int(n) {
		c.lockedUpTo = make(map[string]lockCursor, len(r.Queues))
		for i := range got {
			// Within a queue the rows come in its order, so its last row is
			// its position.
			c.lockedUpTo[got[i].Queue] = lockCursor{at: got[i].NextAttemptAt, id: got[i].ID}
		}
	}
	return got, nil
}

// lockFrom locks up to n rows of the subscriber's queues, each past its
// position in past (a queue not in it from its floor in l). A subscriber of
// one queue locks in one statement. One of several locks no row it does
// not hand out: each statement (at most lockRounds) locks at most an
// equal share of what is left in each queue, and the next looks again,
// past what the claim has, in the queues that filled their share. With
// fewer rows left than queues, a statement reads as many queues as rows
// are left, a row each, the queues taking turns.
func (k *byLock) lockFrom(ctx context.Context, q *db.Queries, n int32, idle int64, past map[string]lockCursor, l look) ([]db.LockRow, error) {
	r := k.env
	got := getLockRows(int(n))
	pos := maps.Clone(past)
	if pos == nil {
		pos = make(map[string]lockCursor, len(r.Queues))
	}
	for _, name := range r.Queues {
		if _, ok := pos[name]; !ok {
			if f := l.floor(name); f != nil {
				// From the floor on: past every row due before it.
				pos[name] = lockCursor{at: *f, id: math.MinInt64 + 1}
			}
		}
	}
	if len(r.Queues) == 1 {
		p := db.LockQueueParams{Queue: r.Queues[0], MaxRows: n, IdleTimeoutMs: idle}
		if c, ok := pos[p.Queue]; ok {
			p.AfterAt, p.AfterID = &c.at, &c.id
		}
		return q.LockQueueAppend(ctx, p, got)
	}
	active := r.Queues
	for round := 0; round < lockRounds && len(active) > 0 && len(got) < int(n); round++ {
		left := n - int32(len(got))
		var rest []string
		if int(left) < len(active) {
			// Fewer rows left than queues: a row each from left of them,
			// taking turns, the others left for the next round. A
			// statement locks its share of every queue it reads and
			// hands out only left rows; a row locked and not handed out
			// would stay locked while the claim is open, and the claims
			// after it would start past it.
			from := k.turn % len(active)
			turned := append(slices.Clone(active[from:]), active[:from]...)
			active, rest = turned[:left], turned[left:]
			k.turn++
		}
		share := left / int32(len(active))
		p := db.LockParams{Queues: active, PerQueue: share, MaxRows: left, IdleTimeoutMs: idle,
			AfterAt: make([]time.Time, len(active)), AfterID: make([]int64, len(active))}
		for i, name := range active {
			p.AfterID[i] = math.MinInt64 // from the queue's start
			if c, ok := pos[name]; ok {
				p.AfterAt[i], p.AfterID[i] = c.at, c.id
			}
		}
		rows, err := q.Lock(ctx, p)
		if err != nil {
			return nil, err
		}
		took := make(map[string]int32, len(active))
		for i := range rows {
			took[rows[i].Queue]++
			pos[rows[i].Queue] = lockCursor{at: rows[i].NextAttemptAt, id: rows[i].ID}
		}
		got = append(got, rows...)
		var more []string
		for _, name := range active {
			if took[name] == share {
				more = append(more, name)
			}
		}
		active = append(more, rest...)
	}
	return got, nil
}

// lockRowsPool keeps the slices claims scan their rows into. A claim's
// rows move on to their deliveries and the slice is free once the claim
// has handed them over: thousands of rows a claim, each as large as its
// delivery, which a drain would otherwise allocate again for every claim.
var lockRowsPool sync.Pool

// getLockRows returns an empty slice with room for n rows.
func getLockRows(n int) []db.LockRow {
	if p, ok := lockRowsPool.Get().(*[]db.LockRow); ok && cap(*p) >= n {
		return (*p)[:0]
	}
	return make([]db.LockRow, 0, n)
}

// putLockRows gives rows back to the pool, cleared so that the pool
// holds on to no payload.
func putLockRows(rows []db.LockRow) {
	if cap(rows) == 0 {
		return
	}
	rows = rows[:cap(rows)]
	clear(rows)
	lockRowsPool.Put(&rows)
}

// Runs returns the runs of consecutive values in ids, as their first
// and last values: the fewest inclusive ranges that cover exactly ids.
func Runs(ids []int64) (lower, upper []int64) {
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	for i, id := range sorted {
		switch {
		case i > 0 && id == upper[len(upper)-1]:
		case i > 0 && id == upper[len(upper)-1]+1:
			upper[len(upper)-1] = id
		default:
			lower, upper = append(lower, id), append(upper, id)
		}
	}
	return lower, upper
}

// deliveriesOf returns the deliveries of os.
func deliveriesOf(os []lease.Outcome) []*lease.Delivery {
	ds := make([]*lease.Delivery, len(os))
	for i, o := range os {
		ds[i] = o.D
	}
	return ds
}
