package claim

import (
	"sync"
	"time"

	"github.com/outboxgen/outboxgen/internal/lease"
)

// FloorMargin is how far before the newest row its last claims of a queue
// took (by next_attempt_at) a claim of the queue looks at least every
// floorWideEvery, and how far before the last complete read of expired
// leases. A row dated up to this long before where the claims stopped
// (by its publisher's transaction, which began earlier) is found within
// floorWideEvery.
const FloorMargin = time.Second

// floorNear is how far before where the claims stopped the other claims
// look: a publisher's transaction shorter than that is found at once.
// Every claim walks the entries of the rows taken in its margin again (a
// held snapshot keeps them), so the margin of most claims is short.
const (
	floorNear      = 50 * time.Millisecond
	floorWideEvery = 100 * time.Millisecond
)

// floors is where a subscriber's claims look from in each queue.
//
// A held vacuum horizon (a long query, pg_dump, a replica's feedback)
// keeps the index entries of every row claimed or deleted since it
// began, and an index scan cannot even mark them dead: a claim that
// reads a queue from its start walks every one of them. So each claim
// reads a queue from its floor, floorNear (FloorMargin every
// floorWideEvery) before the newest row that the subscriber's claims of
// the queue took, and reads expired leases from as long before its last
// claim that read them all.
//
// A row can land behind a floor: a publisher's transaction open longer
// than FloorMargin, a row given back, a key's next row unblocked by a
// hand-over, a lease that expired before it was written, a row dated in
// the past by another client. Those the subscriber itself puts there
// lower the floor (lower); a hand-over recorded for the subscribers
// asks for a sweep (behind); and every MaxFetchInterval one claim looks
// from every queue's start, so a row behind a floor waits at most that
// long.
type floors struct {
	// every is how often rows due are swept, expiredEvery expired leases.
	every, expiredEvery time.Duration

	mu sync.Mutex
	// at is, per queue, the newest next_attempt_at its claims took; a
	// queue without one is read from its start.
	at map[string]time.Time
	// low is how far the floors go back before the next claim.
	low map[string]time.Time
	// wide is when a claim last looked FloorMargin back.
	wide time.Time
	// swept is when a claim last read every queue from its start; sweep
	// asks the next claim to.
	swept time.Time
	sweep bool
	// expiredSwept is when a claim last read every expired lease;
	// expired is when the last claim that read every expired lease it
	// could began (zero: none since that sweep).
	expiredSwept, expired time.Time
}

// reads is what a claim reads: a queue's rows due, expired leases, or
// both.
type reads int

const (
	readsDue reads = 1 << iota
	readsExpired
	readsBoth = readsDue | readsExpired
)

// newFloors returns floors that sweep rows due every every, and expired
// leases every expiredEvery.
func newFloors(every, expiredEvery time.Duration) *floors {
	return &floors{every: every, expiredEvery: expiredEvery, at: map[string]time.Time{}, low: map[string]time.Time{}}
}

// look is where one claim reads from.
type look struct {
	reads reads
	// sweep: every queue from its start; from is each queue's floor
	// otherwise (absent: its start).
	sweep bool
	from  map[string]time.Time
	// sweepExpired: every expired lease; expiredWithin bounds how long
	// ago the expired leases it reads expired otherwise, in seconds (nil:
	// every one).
	sweepExpired  bool
	expiredWithin *float64
	started       time.Time
}

// begin returns where a claim that starts now and reads r reads from.
// Rows due and expired leases are swept each on their own clock, so a
// claim that reads only one of them leaves the other's sweep to the next
// claim that reads it.
func (f *floors) begin(now time.Time, r reads) look {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := look{reads: r, started: now}
	margin := floorNear
	if now.Sub(f.wide) >= floorWideEvery {
		margin, f.wide = FloorMargin, now
	}
	if r&readsDue != 0 {
		for q, t := range f.low {
			if at, ok := f.at[q]; ok && t.Before(at) {
				f.set(q, t)
			}
		}
		clear(f.low)
		if f.sweep || f.swept.IsZero() || now.Sub(f.swept) >= f.every {
			f.sweep, f.swept, l.sweep = false, now, true
		} else {
			l.from = make(map[string]time.Time, len(f.at))
			for q, t := range f.at {
				l.from[q] = t.Add(-margin)
			}
		}
	}
	if r&readsExpired != 0 {
		if f.expiredSwept.IsZero() || now.Sub(f.expiredSwept) >= f.expiredEvery {
			f.expiredSwept, f.expired, l.sweepExpired = now, time.Time{}, true
		} else if !f.expired.IsZero() {
			within := (now.Sub(f.expired) + margin).Seconds()
			l.expiredWithin = &within
		}
	}
	return l
}

// floor returns queue's floor in l, nil when l reads it from its start.
func (l look) floor(queue string) *time.Time {
	if t, ok := l.from[queue]; ok {
		return &t
	}
	return nil
}

// floorOr returns queue's floor in l, the zero time (read by the claim
// statements as the queue's start) when it has none.
func (l look) floorOr(queue string) time.Time {
	return l.from[queue]
}

// took records what a claim that read from l found: newest is, per
// queue, the latest next_attempt_at of the rows it took; all says whether
// it took fewer rows than it asked for, and so every row it could.
func (f *floors) took(l look, newest map[string]time.Time, all bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l.reads&readsDue != 0 {
		for q, t := range newest {
			if at, ok := f.at[q]; l.sweep || !ok || t.After(at) {
				f.set(q, t)
			}
		}
	}
	if l.reads&readsExpired != 0 && all && (l.sweepExpired || !f.expired.IsZero()) {
		f.expired = l.started
	}
}

// set makes t queue's floor; a floor in year 1 or before (a row dated
// -infinity by another client is read as year 1) reads the queue from its
// start.
func (f *floors) set(queue string, t time.Time) {
	if t.Year() <= 1 {
		delete(f.at, queue)
		return
	}
	f.at[queue] = t
}

// lower makes the next claim of queue look from at (less its margin),
// or earlier: a row due at at went back behind the floor.
func (f *floors) lower(queue string, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lowerLocked(queue, at)
}

// lowerLocked is lower with f.mu held.
func (f *floors) lowerLocked(queue string, at time.Time) {
	if t, ok := f.low[queue]; !ok || at.Before(t) {
		f.low[queue] = at
	}
}

// behind makes the next claim read every queue from its start.
func (f *floors) behind() {
	f.mu.Lock()
	f.sweep = true
	f.mu.Unlock()
}

// gaveBack lowers the floors to the rows of ds, given back unhandled.
func (f *floors) gaveBack(ds []*lease.Delivery) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range ds {
		f.lowerLocked(d.Row.Queue, d.Row.NextAttemptAt)
	}
}

// handedOn lowers the floors for the keys whose rows os deleted: each
// key's next row, which the deleting statement unblocked, was published
// after the row deleted, so it is due from the deleted row's creation on
// (unless its publisher dated it otherwise).
func (f *floors) handedOn(os []lease.Outcome) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, o := range os {
		if r := &o.D.Row; r.OrderingKey != nil && o.Kind != lease.Retry {
			at := r.NextAttemptAt
			if r.CreatedAt.Before(at) {
				at = r.CreatedAt
			}
			f.lowerLocked(r.Queue, at)
		}
	}
}
