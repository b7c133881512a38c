// Package lease tracks the deliveries a subscriber's run holds, from the
// claim that took each row to its outcome: the row, the lease token of
// its claim, the local lease deadline (which ends a margin before the
// server's), the handler's context, and the outcome decided for it. It
// knows nothing of how rows are claimed or written; it imports only the
// generated queries' row type and pgx's UUID.
package lease

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
)

// Hold is a claim that holds its batch's rows by row lock until it ends
// (a claim by lock, in package claim): outcomes and rows given up go to
// it while it is open.
type Hold interface {
	// Keep keeps o for the claim's end; false means the claim has ended
	// and o goes the lease path's way.
	Keep(o Outcome) bool
	// GiveUp gives up d, whose handler never started; false means the
	// claim has ended and d holds a written lease.
	GiveUp(d *Delivery) bool
}

// Chain is a Hold that hands a key's rows out one after another: Next
// returns the row that follows d, once d's outcome let it go (nil when
// none does), for the worker that ran d to run next.
type Chain interface {
	Next(d *Delivery) *Delivery
}

// ErrLeaseLost is the cause of a handler's context cancellation when the
// row's lease expired or was taken by a newer claim: the handler's outcome
// will not be recorded, the newer delivery decides. Check it with
// context.Cause(ctx).
var ErrLeaseLost = errors.New("outbox: lease lost")

// Kind is what an outcome writes.
type Kind int

// The kinds of outcome.
const (
	Ack        Kind = iota // delete: the handler succeeded
	Retry                  // reschedule after delay
	DeadLetter             // move to the dead-letter table
	Drop                   // delete a terminal row (no DLQ)
)

// Writes names each kind's write in logs and lease_lost events.
var Writes = [...]string{"ack", "retry", "dead_letter", "delete"}

// Outcome is what became of one delivery.
type Outcome struct {
	D         *Delivery
	Kind      Kind
	Delay     time.Duration // Retry
	Reason    string        // DeadLetter, Drop
	Text      string        // the error's storable text (dbx.ErrorText)
	Attempted bool          // the handler ran
	Ran       time.Duration // how long it ran
}

// Delivery is one claim of a row, from claim to outcome. The rows of one
// claim share its lease token. A row can be claimed twice by one run (its
// lease expired while a heartbeat could not reach the database, and the
// run's next claim took it back): the two deliveries share the row id and
// differ in their lease token.
type Delivery struct {
	Row   db.ClaimRow
	Token pgtype.UUID
	// Claimed is when the claim returned, on this process's clock.
	Claimed time.Time
	// Batch is the claim statement that leased the row.
	Batch *Batch

	// Ctx is the handler's context, made when the handler starts (see
	// Tracker.StartIn), under Batch.Ctx: cancelled with ErrLeaseLost
	// when the lease expires unextended or a heartbeat finds it taken, and
	// with the forced stop's cause. Both are nil until then.
	Ctx    context.Context
	Cancel context.CancelCauseFunc
	lost   bool // guarded by Tracker.mu
	done   bool // guarded by Tracker.mu: no longer tracked
	// acking: a transactional handler's transaction is deleting the row,
	// so heartbeats leave it be. Guarded by Tracker.mu.
	acking bool
	// Settled: a claim by lock keeps the row's outcome, or gave the row
	// up. Guarded by the batch's Hold.
	Settled bool
}

// Batch is the rows one claim statement leased. They share their
// local lease deadline (counted from the statement's sending) and every
// heartbeat moves it for all of them, so one timer keeps it.
type Batch struct {
	// Ctx is cancelled with ErrLeaseLost when the batch's lease runs out
	// unextended; it parents the handlers' contexts.
	Ctx    context.Context
	Cancel context.CancelCauseFunc
	expiry *time.Timer
	// deadline is when expiry fires, on this process's monotonic clock:
	// Start refuses a handler from then on, whether or not the timer's
	// goroutine has run yet. Guarded by Tracker.mu.
	deadline time.Time
	Rows     []*Delivery // guarded by Tracker.mu
	held     int         // rows not done; guarded by Tracker.mu
	// Hold is the claim's transaction when the claim holds its rows by
	// row lock, until it ends; nil for a leased claim.
	Hold Hold
	// ending is set while a locked claim's end writes the leases its rows
	// take, until it commits: a heartbeat on another connection would not
	// find them yet, and take the rows' leases for lost. Guarded by
	// Tracker.mu.
	ending bool
}

// Context is the context of logs about d: its handler's once it started,
// else its batch's.
func (d *Delivery) Context() context.Context {
	if d.Ctx != nil {
		return d.Ctx
	}
	return d.Batch.Ctx
}

// SinceFirstAttempt is the time from the row's first handled attempt to
// now: what the server measured at the claim plus the time since, on this
// process's monotonic clock, so clock skew between the two does not count.
// It is 0 when the row was never attempted, and saturates rather than
// overflow for a first attempt another client wrote as ±infinity.
func (d *Delivery) SinceFirstAttempt() time.Duration {
	s := d.Row.SinceFirstAttemptSeconds
	if s == 0 {
		return 0
	}
	elapsed, more := dbx.Seconds(s), time.Since(d.Claimed)
	if elapsed > math.MaxInt64-more {
		return math.MaxInt64
	}
	return elapsed + more
}

// Attempts reads an attempt count: a negative one, written by another
// client, is 0.
func Attempts(n int32) int { return max(int(n), 0) }

// Tracker tracks every delivery a run holds, batch by batch, for
// heartbeats and expiry.
type Tracker struct {
	ttl     time.Duration
	mu      sync.Mutex
	batches map[*Batch]struct{}
	n       int // deliveries held
}

// NewTracker returns an empty tracker of leases of the given TTL.
func NewTracker(ttl time.Duration) Tracker {
	return Tracker{ttl: ttl, batches: map[*Batch]struct{}{}}
}

// Add starts tracking rows claimed by a statement sent at sent; their
// contexts are children of parent. The lease ends LeaseTTL after sent, not
// after the rows arrived: the server stamped the expiry when it ran the
// statement, after sent, so the local deadline never outlives the
// server's however late the answer comes (a loaded client, a slow
// network), and no handler starts on a lease another claim may own.
func (l *Tracker) Add(parent context.Context, rows []db.ClaimRow, token pgtype.UUID, sent time.Time) []*Delivery {
	return l.AddEach(parent, len(rows), func(i int, r *db.ClaimRow) { *r = rows[i] }, token, sent)
}

// AddEach is add for n rows that fill writes in place, so rows read in
// another shape are not copied twice.
func (l *Tracker) AddEach(parent context.Context, n int, fill func(i int, r *db.ClaimRow), token pgtype.UUID, sent time.Time) []*Delivery {
	if n == 0 {
		return nil
	}
	ctx, cancel := context.WithCancelCause(parent)
	b := &Batch{Ctx: ctx, Cancel: cancel, Rows: make([]*Delivery, n), held: n}
	now := time.Now()
	ds := make([]Delivery, n)
	for i := range ds {
		ds[i] = Delivery{Token: token, Claimed: now, Batch: b}
		fill(i, &ds[i].Row)
		b.Rows[i] = &ds[i]
	}
	b.expiry = time.AfterFunc(l.until(b, sent), func() { cancel(ErrLeaseLost) })
	l.mu.Lock()
	l.batches[b] = struct{}{}
	l.n += n
	l.mu.Unlock()
	return b.Rows
}

// StartIn makes d's handler context, a child of parent (d's batch's
// context or a context under it, a worker's Scope), or reports false
// when d's lease is already gone (expired, or found taken by a
// heartbeat): another claim may own the row, so its handler must not run.
// Expiry is read from the clock, not only from the batch's context: the
// timer that cancels it runs on a goroutine of its own, which a loaded
// scheduler may run after a worker has taken the row.
func (l *Tracker) StartIn(d *Delivery, parent context.Context) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d.lost || d.Batch.Ctx.Err() != nil || !time.Now().Before(d.Batch.deadline) {
		return false
	}
	d.Ctx, d.Cancel = context.WithCancelCause(parent)
	return true
}

// Scope is one worker's place in the batch whose rows it runs: a context
// under the batch's, which the handler contexts of those rows are
// children of (see StartIn). A batch's context then has one child per
// worker rather than one per row, and the workers do not take its lock
// for every row they start and end: with thousands of rows a batch,
// that was most of what a handler context cost. A cancelled batch
// cancels its scopes, and through them their handlers' contexts, with
// its cause. The zero Scope is ready for use; one worker uses it.
//
// A scope knows its batch by the batch's context, not by the batch: a
// worker left idle after its last row holds no batch, and so none of its
// rows.
type Scope struct {
	batch  context.Context // the batch's context
	ctx    context.Context
	cancel context.CancelFunc
}

// In returns the scope's context in b, the worker's next row's batch: a
// scope moving on from another batch releases that batch's context.
func (s *Scope) In(b *Batch) context.Context {
	if s.batch != b.Ctx {
		s.Close()
		s.batch = b.Ctx
		s.ctx, s.cancel = context.WithCancel(b.Ctx)
	}
	return s.ctx
}

// Close releases the scope's context; its worker is done.
func (s *Scope) Close() {
	if s.cancel != nil {
		s.cancel()
	}
	*s = Scope{}
}

// Remove stops tracking d and releases its resources.
func (l *Tracker) Remove(d *Delivery) {
	l.mu.Lock()
	if d.done {
		l.mu.Unlock()
		return
	}
	d.done = true
	l.n--
	b := d.Batch
	b.held--
	last := b.held == 0
	if last {
		delete(l.batches, b)
		b.expiry.Stop()
	}
	cancel := d.Cancel
	l.mu.Unlock()
	if cancel != nil {
		cancel(nil)
	}
	if last {
		b.Cancel(nil)
	}
}

// Started reports whether the handlers of every row of ds have started.
func (l *Tracker) Started(ds []*Delivery) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, d := range ds {
		if d.Ctx == nil {
			return false
		}
	}
	return true
}

// LeaseStarted splits unsettled, rows of a locked claim that is ending
// without an outcome: it returns those whose handlers started, which take
// token, the token of the lease the claim's end writes, and gives up the
// others, whose handlers will never start (start refuses them). The rows
// of settled, which have outcomes, take token too.
func (l *Tracker) LeaseStarted(unsettled, settled []*Delivery, token pgtype.UUID) (started []*Delivery) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, d := range append(unsettled, settled...) {
		d.Batch.ending = true
	}
	for _, d := range unsettled {
		if d.Ctx == nil {
			d.lost = true
			continue
		}
		d.Token = token
		started = append(started, d)
	}
	for _, d := range settled {
		d.Token = token
	}
	return started
}

// Renew restarts b's expiry from sent, when a statement sent then leased
// its rows and committed: heartbeats extend them from now on.
func (l *Tracker) Renew(b *Batch, sent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b.ending = false
	if b.held > 0 {
		b.expiry.Reset(l.until(b, sent))
	}
}

// Snapshot returns every held delivery with a written lease, with its id
// and token (rows a locked claim holds have none yet).
func (l *Tracker) Snapshot() ([]*Delivery, []int64, []pgtype.UUID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ds := make([]*Delivery, 0, l.n)
	ids := make([]int64, 0, l.n)
	tokens := make([]pgtype.UUID, 0, l.n)
	for b := range l.batches {
		for _, d := range b.Rows {
			if !d.done && !d.acking && d.Token.Valid && !b.ending {
				ds = append(ds, d)
				ids = append(ids, d.Row.ID)
				tokens = append(tokens, d.Token)
			}
		}
	}
	return ds, ids, tokens
}

// marginMax caps leaseMargin.
const marginMax = 250 * time.Millisecond

// Margin is how long before a lease ends (counted from the sending
// of the statement that stamped it) its handlers' contexts are cancelled:
// a tenth of the lease, at most marginMax. Cancelling a context only
// asks; the handler's goroutine learns of it when the scheduler runs it,
// which on a loaded machine can be milliseconds later. The margin makes
// the cancellation reach the handler before another claim can take the
// row, not merely be issued before.
func Margin(ttl time.Duration) time.Duration { return min(ttl/10, marginMax) }

// until sets b's deadline for a lease stamped by a statement sent at
// sent, and returns the time left to it, for b's expiry timer. Call with
// mu held, or before b is tracked.
func (l *Tracker) until(b *Batch, sent time.Time) time.Duration {
	left := l.left(sent)
	b.deadline = time.Now().Add(left)
	return left
}

// left is how much of a lease stamped by a statement sent at sent is
// left, less the margin.
func (l *Tracker) left(sent time.Time) time.Duration {
	return max(l.ttl-Margin(l.ttl)-time.Since(sent), 0)
}

// Extended restarts the expiry of the batches whose deliveries a
// heartbeat sent at sent extended, counting from sent like add, and
// returns the deliveries of tried it did not extend: their leases are
// gone. Their handlers' contexts, if made, are cancelled with
// ErrLeaseLost.
func (l *Tracker) Extended(extended []Lease, tried []*Delivery, sent time.Time) []*Delivery {
	ok := make(map[Lease]bool, len(extended))
	for _, e := range extended {
		ok[e] = true
	}
	var lost []*Delivery
	reset := map[*Batch]bool{}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, d := range tried {
		if d.done || d.acking {
			continue // finished, or being acknowledged, while the heartbeat ran
		}
		if ok[d.Lease()] {
			reset[d.Batch] = true
			continue
		}
		if !d.lost {
			d.lost = true
			if d.Cancel != nil {
				d.Cancel(ErrLeaseLost)
			}
			lost = append(lost, d)
		}
	}
	for b := range reset {
		if b.held > 0 {
			b.expiry.Reset(l.until(b, sent))
		}
	}
	return lost
}

// Settle stops heartbeats of d, whose row a transactional handler's
// transaction is deleting: their statement would wait for its commit.
func (l *Tracker) Settle(d *Delivery) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d.acking = true
}

// IsLost reports whether a heartbeat found d's lease gone.
func (l *Tracker) IsLost(d *Delivery) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return d.lost
}

// Held counts the deliveries this run holds.
func (l *Tracker) Held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// Lease names one delivery: its row and its claim's token.
type Lease struct {
	ID    int64
	Token pgtype.UUID
}

// Lease returns d's lease.
func (d *Delivery) Lease() Lease { return Lease{d.Row.ID, d.Token} }

// LeasesOf reads the leases a batch write returns.
func LeasesOf[R any](rows []R, pair func(R) (int64, pgtype.UUID)) []Lease {
	out := make([]Lease, len(rows))
	for i, r := range rows {
		out[i].ID, out[i].Token = pair(r)
	}
	return out
}

// Keyed reports whether any of os is a row with an ordering key.
func Keyed(os []Outcome) bool {
	for _, o := range os {
		if o.D.Row.OrderingKey != nil {
			return true
		}
	}
	return false
}
