package claim

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
	"github.com/outboxgen/outboxgen/internal/lease"
	"github.com/outboxgen/outboxgen/internal/ring"
)

// Claims from the log tier's ring (package ring), beside the outbox
// table, which holds the rows that need per-row state.
//
// Unkeyed lanes (0-3) are claimed like a claim by lock: a READ COMMITTED
// transaction locks its share of the lanes that have rows, reads their
// batches (the rows its snapshot sees that each lane's newest progress
// did not), records the claim on its own (autocommit), and holds the
// lanes while the batches' handlers run. Its end, in the same
// transaction, inserts the lanes' progress, which acknowledges every row
// of the batches at once, and moves into the outbox table the rows that
// need state there: leased, the rows whose handlers run on or failed
// (the lease path writes their retry or dead letter, as after a claim by
// lock); unleased, the rows no handler started. A claim whose
// transaction aborted (its subscriber crashed, its connection died)
// leaves its record: each lane's next reader moves that lane's batch
// into the outbox table, each row counting the deliveries that claims
// made of it and due when the claim's lease would have expired (its
// handlers may still run), and the outbox table's claims deliver them
// from there.
//
// A keyed lane (4-7) is claimed the same way when claims lock (a claim
// may take keyed and unkeyed lanes together), but read
// in id order, which within a key is commit order, and its progress
// holds the batch's largest id as well as its snapshot (see
// RingReadKeyed): a batch cut at a transaction could hand a key's later
// row out before its earlier one. A key's rows go to handlers one after
// another: its first row of the batch at once, each next one when the
// one before it is acknowledged, and the acknowledgement recorded to
// outlive the claim (lockedClaim.Next, RingAck: a claim that dies is
// not followed by the key's acknowledged rows again); a row that fails,
// or runs past the claim's end, takes the key's remaining rows of the
// batch with it into the outbox table, behind it. Keys the outbox table
// already holds, and a key's rows from its first one not yet due, go
// there at the claim, behind the key's rows there. Moved keyed rows keep
// their ids (the ring's key trigger). Claims by lease move keyed lanes
// whole into the outbox table by one statement per claim, through its
// key trigger, and the outbox table's claims deliver them.

// ringIdleProgress is how old a lane's newest progress may be before a
// claim that found nothing writes a new one: the ring turns only past
// partitions every lane has progressed past.
const ringIdleProgress = time.Second

// RingTurnAge is how long writers write into one partition of the ring
// before a claim moves them on (Env.RingTurnAge, when zero).
const RingTurnAge = 10 * time.Second

// RingProbeEvery is how often a busy claimer whose queues have not used
// the ring asks whether they do now (RingInUse): until then it claims
// from the outbox table alone, as on an outbox without the ring, and a
// row written into the ring waits at most this long (and the claim after
// it) for its first claim. A claim that follows one that found nothing
// (it follows a poll or a writer's notification) asks at once.
const RingProbeEvery = time.Second

// ringStraggleMin is the least time a claim of lanes holds them for
// rows that run on, before their handlers' outcomes go the lease path's
// way (see lockedClaim.straggling): a claim holds its lanes, and rows
// written into them wait for its end.
const ringStraggleMin = 20 * time.Millisecond

// ringStraggleRatio is how many times the median time its rows take a
// claim of lanes waits for its slowest ones (at least ringStraggleMin).
const ringStraggleRatio = 4

// The outbox table's claims that find nothing may take one
// ringStateShare-th of a claimer's time, when a claim of the ring leaves
// room for them (see byRing.stateDue): after such a claim, the next waits
// ringStateShare - 1 times as long as it took, at most MinFetchInterval.
// While the vacuum horizon is held, the table's claim can take ten times
// its usual time, and running it after every claim of the ring slowed
// the ring's claims with it.
const ringStateShare = 10

// byRing claims from the ring, and from the outbox table with state, the
// claimer New would choose without the ring.
type byRing struct {
	env   *Env
	lock  *byLock
	state Claimer
	// stateAt is when the outbox table's next claim may run, after one
	// that found nothing (see stateDue); stateNews, set when rows may have
	// come to the table (a claim of the ring moved some there, a key was
	// handed on), lets it run at once.
	stateAt   time.Time
	stateNews atomic.Bool
	// turn is where the search for a free lane starts: a position among
	// the (queue, lane) pairs (RingTakeLanes).
	turn int32
	// turned is when the claimer last tried to turn the ring.
	turned time.Time
	// typical is a moving average of the median time the rows of a
	// claim of lanes take, in nanoseconds (see straggle).
	typical atomic.Int64
	// full reports that the last claim of lanes filled its batch;
	// filled, that the last claim of the ring did (by lanes or by lease);
	// empty, that the last Claim found nothing in either tier.
	full, filled, empty bool
	// laned reports that the claimer's queues have their lanes
	// (RingAddLanes, before its first claim of the ring).
	laned bool
	// inUse reports that the claimer's queues use the ring (RingInUse);
	// probed is when the claimer last asked.
	inUse  bool
	probed time.Time
	// mine are the positions of the lanes this claimer's claims in
	// flight hold (see free).
	mu   sync.Mutex
	mine map[int32]bool
}

// free returns the positions of ready that none of the claimer's claims
// in flight holds: RingReadyLanes names every lane with rows, and a
// claim that found only held lanes would begin a transaction to take
// none.
func (c *byRing) free(ready []int32) []int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.DeleteFunc(ready, func(at int32) bool { return c.mine[at] })
}

// hold records that a claim in flight holds lanes ls, and returns what
// releases them as it ends.
func (c *byRing) hold(ls []*lane) (release func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mine == nil {
		c.mine = make(map[int32]bool)
	}
	for _, l := range ls {
		c.mine[l.at] = true
	}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, l := range ls {
			delete(c.mine, l.at)
		}
	}
}

// straggle is how long a claim of lanes waits for its slowest rows once
// the others have outcomes: ringStraggleRatio times the typical median
// time of a claim's rows, at least ringStraggleMin.
func (c *byRing) straggle() time.Duration {
	return max(ringStraggleMin, ringStraggleRatio*time.Duration(c.typical.Load()))
}

// observe moves typical an eighth of the way to a claim's median.
func (c *byRing) observe(median time.Duration) {
	t := c.typical.Load()
	c.typical.Store(t + (int64(median)-t)/8)
}

// Ended waits for the claims of the ring and of the outbox table.
func (c *byRing) Ended() int { return c.state.Ended() + c.lock.Ended() }

// HandedOn lowers the outbox table's floors to the keys' next rows.
func (c *byRing) HandedOn(os []lease.Outcome) {
	c.state.HandedOn(os)
	c.stateNews.Store(true)
}

// Behind asks the outbox table's next claim to sweep.
func (c *byRing) Behind() {
	c.state.Behind()
	c.stateNews.Store(true)
}

// stateDue reports whether the outbox table's claim runs now, after a
// claim of the ring that left room: when rows may have come to the table
// since its last claim, or that claim found rows, or the pace after one
// that found nothing has passed (ringStateShare), or the last Claim found
// nothing at all. The pace spares the table's claims while the ring keeps
// the claimer busy; after a Claim that found nothing, the fetcher waits
// (MinFetchInterval, a writer's notification, its sleep record) before it
// claims again, and then rows may be in the table: the claim that follows
// a sleep record must see every row committed before it, and one that
// follows a writer's notification the notified row.
func (c *byRing) stateDue() bool {
	news := c.stateNews.Swap(false)
	return news || c.empty || !time.Now().Before(c.stateAt)
}

// stateClaim runs the outbox table's claim of up to n rows, and sets the
// pace of the next from what it found and how long it took.
func (c *byRing) stateClaim(ctx context.Context, n int32) (int, error) {
	start := time.Now()
	got, err := c.state.Claim(ctx, n)
	c.stateAt = time.Time{}
	if got == 0 && err == nil {
		took := time.Since(start)
		c.stateAt = start.Add(took + min(c.env.MinFetchInterval, (ringStateShare-1)*took))
	}
	return got, err
}

// moved tells the outbox table's next claim that a claim of the ring
// moved rows into the table (its transaction committed).
func (c *byRing) moved() { c.stateNews.Store(true) }

// Claim claims a batch of a lane, and from the outbox table the rows
// the batch left room for (claims by lease first move the keyed lanes'
// new rows into the outbox table, and take unkeyed lanes only); after a
// claim of the ring that filled its batch, the outbox table's claim comes
// first. The table's claims that find nothing keep to their pace
// (stateDue). Every RingTurnAge/4 it turns the ring.
func (c *byRing) Claim(ctx context.Context, n int32) (int, error) {
	got, err := c.claim(ctx, n)
	c.empty = got == 0
	return got, err
}

// claim is Claim, but for recording whether it found anything. Until
// the claimer's queues use the ring, it runs the outbox table's claim
// alone.
func (c *byRing) claim(ctx context.Context, n int32) (int, error) {
	r := c.env
	if !c.inUse {
		// A claim that follows one that found nothing follows a wait (a
		// poll, a writer's notification): it asks at once.
		if time.Since(c.probed) < RingProbeEvery && !c.empty {
			return c.state.Claim(ctx, n)
		}
		c.probed = time.Now()
		used, err := r.bounded().RingInUse(r.Writes, r.Queues)
		if err != nil {
			return 0, fmt.Errorf("asking whether the queues use the ring: %w", err)
		}
		if c.inUse = used; !used {
			return c.state.Claim(ctx, n)
		}
	}
	age := r.RingTurnAge
	if age <= 0 {
		age = RingTurnAge
	}
	if !c.laned {
		if err := r.bounded().RingAddLanes(r.Writes, r.Queues); err != nil {
			return 0, fmt.Errorf("giving the queues their lanes of the ring: %w", err)
		}
		c.laned = true
	}
	if time.Since(c.turned) >= age/4 {
		c.turned = time.Now()
		if t, err := ring.Turn(r.Writes, r.Pool, r.Queries, r.QueryTimeout, age); err != nil {
			r.Log.Warn("outbox: turning the ring failed", slog.Any("error", err))
		} else if t.Busy > 0 {
			r.Log.Debug("outbox: a lock kept the ring from emptying a partition", slog.Int("partitions", t.Busy))
		}
	}
	// When the ring filled the last batch, the outbox table's rows
	// (retries, keys' next rows, rows moved there) go first: after the
	// ring's claims, they would wait for its whole backlog.
	first := 0
	if c.filled && c.stateDue() {
		var err error
		if first, err = c.stateClaim(ctx, n); err != nil || first >= int(n) {
			return first, err
		}
		n -= int32(first)
	}
	var got int
	var busy bool
	var err error
	if LocksRows(r.LockWindow, r.Pool.Config().MaxConns) {
		got, busy, err = c.claimLanes(ctx, n, age)
	} else {
		got, err = c.leaseLanes(n, age)
		if err != nil {
			return first, err
		}
	}
	c.filled = got >= int(n)
	if got += first; err != nil || c.filled {
		return got, err
	}
	if c.stateDue() {
		more, err := c.stateClaim(ctx, n+int32(first)-int32(got))
		if got += more; err != nil {
			return got, err
		}
	}
	if got > 0 || !busy {
		return got, nil
	}
	// Every lane with rows is held, one of them by another of this
	// subscriber's claims: wait up to MinFetchInterval for a claim to
	// end, and try the lanes again. Returning nothing at once would send
	// the fetcher to wait for as long, or for a writer's notification,
	// while the lanes it waits for come free.
	t := time.NewTimer(r.MinFetchInterval)
	defer t.Stop()
	select {
	case <-c.lock.freed:
	case <-t.C:
		return 0, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	got, _, err = c.claimLanes(ctx, n, age)
	return got, err
}

// moveKeyed moves the new rows of the free keyed lanes into the outbox
// table, in a transaction of its own: one statement locks the lanes, the
// next moves their rows. In one statement, the snapshot would be taken
// before the locks, and a lane whose last mover committed in between
// would have its rows moved twice.
func (c *byRing) moveKeyed() error {
	r := c.env
	ctx := r.Writes
	tx, rollback, err := dbx.BeginReadCommitted(ctx, r.Pool, r.QueryTimeout)
	if err != nil {
		return err
	}
	defer rollback()
	q := r.Queries(dbx.Bounded{Inner: tx, Timeout: r.QueryTimeout})
	lanes, err := q.RingLockKeyedLanes(ctx, r.Queues)
	if err != nil || len(lanes) == 0 {
		return err
	}
	p := db.RingMoveKeyedParams{IdleProgressSeconds: ringIdleProgress.Seconds()}
	for _, l := range lanes {
		p.LaneQueues, p.Lanes = append(p.LaneQueues, l.Queue), append(p.Lanes, l.Lane)
	}
	moved, err := q.RingMoveKeyed(ctx, p)
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	if moved.Moved > 0 {
		c.moved()
	}
	return nil
}

// claimTx is a claim's transaction as its statements run in it: with the
// plans PostgreSQL caches, and, for the statements that read the ring's
// partitions (ring), planned for their parameters at every execution
// (dbx.OneShot): planned for the partitions they name, they lock only
// those, so an open claim does not keep the ring from turning past the
// others, and every other statement of the claim is planned once.
type claimTx struct {
	*db.Queries
	ring *db.Queries
}

// claimTx returns tx's statements, each bounded by QueryTimeout.
func (c *byRing) claimTx(tx pgx.Tx) claimTx {
	r := c.env
	b := dbx.Bounded{Inner: tx, Timeout: r.QueryTimeout}
	return claimTx{Queries: r.Queries(b), ring: r.Queries(dbx.OneShot{Inner: b})}
}

// unkeyedBelow is the id bound of an unkeyed lane's progress: none, the
// snapshot says it all.
const unkeyedBelow = math.MaxInt64

// firstKeyedLane is the first of a queue's lanes that hold keyed rows.
const firstKeyedLane = 4

// lane is a lane's batch as read in its claim's transaction.
type lane struct {
	queue string
	lane  int16
	// stands is where the lane stood as the claim took it; pos is stands
	// once the claim reads the lane (read), and empty for a lane taken
	// but not read, which the claim leaves as it found it.
	stands db.RingPositionsRow
	pos    db.RingPositionsRow
	// end is the snapshot the batch ends at: pos.Cur, or the cut after
	// its last transaction when it filled; below is the largest id the
	// batch consumes (unkeyedBelow for an unkeyed lane).
	end   string
	below int64
	rows  []db.RingReadRow
	// keys are the rows' ordering keys, of a keyed lane's batch.
	keys []*string
	// at is the lane's position among the claim's (queue, lane) pairs
	// (RingTakeLanes); due are the indexes of the rows to hand out.
	at  int32
	due []int
	// later are the rows of the batch the claim does not hand out (due),
	// which it moves into the outbox table as it ends (spill).
	later moves
	// spilled reports that the claim moved rows of the lane into the
	// outbox table unleased (move, RingMoveCrashed): rows not yet due,
	// rows behind their keys there, rows no handler started, or the
	// batches of claims that died.
	spilled bool
}

// keyed reports whether l holds keyed rows.
func (l *lane) keyed() bool { return l.lane >= firstKeyedLane }

// unchanged reports whether l's claim has no progress to write: its
// batch ends where the lane stood, or found nothing while the lane's
// newest progress is younger than ringIdleProgress.
func (l *lane) unchanged() bool {
	return (l.end == l.pos.Prev && l.below == l.pos.Below) ||
		(len(l.rows) == 0 && len(l.pos.Crashed) == 0 && l.pos.AgeSeconds < ringIdleProgress.Seconds())
}

// progress writes the progress of lanes ls in q's transaction, in one
// statement.
func progress(ctx context.Context, q *db.Queries, ls ...*lane) error {
	var p db.RingProgressParams
	for _, l := range ls {
		p.Queues, p.Lanes = append(p.Queues, l.queue), append(p.Lanes, l.lane)
		p.Snaps, p.Belows = append(p.Snaps, l.end), append(p.Belows, l.below)
	}
	return q.RingProgress(ctx, p)
}

// take begins a claim's transaction, locks in it up to most free lanes
// below toLane at the positions ready (any, when ready is nil), from
// where the last claim stopped (RingTakeLanes), and reads where they
// stand (RingPositions), in one round trip (dbx.BeginBatch): the
// positions of every lane it may take are read, in a statement that
// follows the locks. It returns the transaction, what rolls it back, and
// the lanes it took. Its caller moves the turn past the
// lanes it reads.
func (c *byRing) take(ctx context.Context, toLane int16, ready []int32, most int) (pgx.Tx, func(), []*lane, error) {
	r := c.env
	var at db.RingPositionsParams
	for p := range int32(len(r.Queues)) * int32(toLane) {
		if ready == nil || slices.Contains(ready, p) {
			at.Queues, at.Lanes = append(at.Queues, r.Queues[p/int32(toLane)]), append(at.Lanes, int16(p%int32(toLane)))
		}
	}
	var taken []db.RingTakeLanesRow
	var pos []db.RingPositionsRow
	tx, rollback, err := dbx.BeginBatch(ctx, r.Pool, r.QueryTimeout,
		func(d db.DBTX) (err error) {
			taken, err = r.Queries(d).RingTakeLanes(ctx, db.RingTakeLanesParams{Queues: r.Queues, FromLane: 0, ToLane: toLane,
				Turn: c.turn, Ready: ready, MaxLanes: int32(most), IdleTimeoutMs: r.LeaseTTL.Milliseconds()})
			return err
		},
		func(d db.DBTX) (err error) {
			pos, err = r.Queries(d).RingPositions(ctx, at)
			return err
		})
	if err != nil {
		return nil, nil, nil, err
	}
	ls := make([]*lane, len(taken))
	for i, t := range taken {
		ls[i] = &lane{queue: t.Queue, lane: t.Lane, at: t.Pos}
		j := slices.IndexFunc(pos, func(p db.RingPositionsRow) bool { return p.Queue == t.Queue && p.Lane == t.Lane })
		if j < 0 {
			rollback()
			return nil, nil, nil, fmt.Errorf("no position read for lane %d of queue %q", t.Lane, t.Queue)
		}
		ls[i].stands = pos[j]
	}
	return tx, rollback, ls, nil
}

// read reads up to n rows of lane l's batch in q's transaction, which
// holds the lane. A lane whose last claims aborted has no batch (rows
// nil): what it has not consumed moves into the outbox table (spill).
func (c *byRing) read(ctx context.Context, q claimTx, l *lane, n int32) (err error) {
	l.pos = l.stands
	l.end, l.below = l.pos.Cur, unkeyedBelow
	if l.keyed() {
		l.below = l.pos.Below
	}
	if len(l.pos.Crashed) > 0 {
		return nil
	}
	if l.keyed() {
		return c.readKeyed(ctx, q, l, n)
	}
	l.rows, err = q.ring.RingRead(ctx, db.RingReadParams{Prev: l.pos.Prev, Cur: l.pos.Cur, Slots: l.pos.Slots, Queue: l.queue,
		Lane: l.lane, MaxRows: n})
	if err != nil || len(l.rows) < int(n) {
		return err
	}
	last := l.rows[len(l.rows)-1]
	rest, err := q.ring.RingReadRest(ctx, db.RingReadRestParams{Slots: l.pos.Slots, Queue: l.queue, Lane: l.lane,
		Txid: fmt.Sprint(last.Txid), AfterID: last.ID})
	if err != nil {
		return err
	}
	for _, x := range rest {
		l.rows = append(l.rows, db.RingReadRow(x))
	}
	l.end, err = ring.Cut(l.pos.Prev, l.pos.Cur, int64(last.Txid))
	return err
}

// readKeyed reads up to n rows of keyed lane l's batch, in id order,
// and the bound they take the lane's progress to.
func (c *byRing) readKeyed(ctx context.Context, q claimTx, l *lane, n int32) error {
	rows, err := q.ring.RingReadKeyed(ctx, db.RingReadKeyedParams{Prev: l.pos.Prev, Cur: l.pos.Cur, Below: l.pos.Below,
		Slots: l.pos.Slots, Queue: l.queue, Lane: l.lane, MaxRows: n})
	if err != nil {
		return err
	}
	l.rows, l.keys = make([]db.RingReadRow, len(rows)), make([]*string, len(rows))
	for i, x := range rows {
		l.rows[i] = db.RingReadRow{ID: x.ID, Payload: x.Payload, Headers: x.Headers, CreatedAt: x.CreatedAt,
			NextAttemptAt: x.NextAttemptAt, Txid: x.Txid}
		l.keys[i] = x.OrderingKey
		if x.Above {
			l.below = max(l.below, x.ID)
		}
	}
	return nil
}

// heldKeys returns the keys of keyed lane l's batch of which the outbox
// table holds rows (none for an unkeyed lane): one probe per batch. (In
// the batch's read, the probe cost a keyed drain about a quarter more
// server CPU per row: the read's rows had to be materialized and joined.)
func (c *byRing) heldKeys(ctx context.Context, q claimTx, l *lane) ([]string, error) {
	if len(l.keys) == 0 {
		return nil, nil
	}
	keys := make([]string, 0, len(l.keys))
	for _, k := range l.keys {
		keys = append(keys, *k)
	}
	slices.Sort(keys)
	return q.RingHeldKeys(ctx, db.RingHeldKeysParams{Keys: slices.Compact(keys), Queue: l.queue})
}

// due returns the indexes of l's rows to hand out now, and keeps the
// others in l.later, for the claim to move into the outbox table,
// unleased (spill): rows not yet due and, in a keyed lane, the rows of
// keys the outbox table holds, which go behind the key's rows there, and
// a key's rows from its first one not yet due. A paused queue's rows all
// move: they wait in the outbox table, which no claim of a paused queue
// reads, and the ring turns past them.
func (c *byRing) due(ctx context.Context, q claimTx, l *lane) ([]int, error) {
	if l.pos.Paused {
		m := moves{}
		for i := range l.rows {
			m.add(l.rows[i].ID, int64(l.rows[i].Txid), 0, false)
		}
		l.later = m
		return nil, nil
	}
	held, err := c.heldKeys(ctx, q, l)
	if err != nil {
		return nil, err
	}
	later := make(map[string]bool, len(held))
	for _, k := range held {
		later[k] = true
	}
	now := time.Now()
	due := make([]int, 0, len(l.rows))
	m := moves{}
	for i := range l.rows {
		x := &l.rows[i]
		wait := x.NextAttemptAt.After(now)
		if l.keys != nil {
			k := *l.keys[i]
			wait = wait || later[k]
			later[k] = wait
		}
		if wait {
			m.add(x.ID, int64(x.Txid), 0, false)
		} else {
			due = append(due, i)
		}
	}
	l.later = m
	return due, nil
}

// moves are ring rows to move into the outbox table.
type moves struct {
	ids, txids []int64
	deliveries []int32
	// leased: the row moves leased (its handler runs on, or the lease
	// path writes its failure); else it waits for a claim.
	leased []bool
}

func (m *moves) add(id, txid int64, deliveries int32, leased bool) {
	m.ids = append(m.ids, id)
	m.txids = append(m.txids, txid)
	m.deliveries = append(m.deliveries, deliveries)
	m.leased = append(m.leased, leased)
}

// move moves m's rows of l into the outbox table in q's transaction, in
// one statement (in id order, so that a key's rows keep theirs), the
// leased ones with token; l spilled the others.
func (c *byRing) move(ctx context.Context, q claimTx, l *lane, m moves, token pgtype.UUID) error {
	if len(m.ids) == 0 {
		return nil
	}
	l.spilled = l.spilled || slices.Contains(m.leased, false)
	n, err := q.ring.RingMove(ctx, db.RingMoveParams{Token: token, LeaseTtlSeconds: c.env.LeaseTTL.Seconds(), Ids: m.ids,
		Txids: m.txids, Deliveries: m.deliveries, Leased: m.leased, Slots: l.pos.Slots, Queue: l.queue, Lane: l.lane})
	if err == nil && int(n) != len(m.ids) {
		err = fmt.Errorf("outbox: moved %d of %d rows of the ring: %w", n, len(m.ids), errLocksLost)
	}
	return err
}

// spill moves into the outbox table, unleased, in q's transaction, what
// lane l has not consumed when the claims that read it last died
// (RingMoveCrashed), else, with the rows of m (leased ones with token),
// the rows of l's batch that due kept back. A claim spills as it ends
// (or, when it hands nothing out, before it commits at once): a move of
// a key's rows takes the key's lock, which a claim's transaction would
// otherwise hold while its handlers run, and the outbox table's writes
// of the key would wait for it.
func (c *byRing) spill(ctx context.Context, q claimTx, l *lane, m moves, token pgtype.UUID) error {
	if len(l.pos.Crashed) == 0 {
		for i := range l.later.ids {
			m.add(l.later.ids[i], l.later.txids[i], l.later.deliveries[i], l.later.leased[i])
		}
		return c.move(ctx, q, l, m, token)
	}
	if l.keyed() {
		if err := q.RingWaitAcks(ctx, l.pos.CrashedXids); err != nil {
			return err
		}
	}
	moved, err := q.ring.RingMoveCrashed(ctx, db.RingMoveCrashedParams{Crashed: l.pos.Crashed,
		CrashedBelow: l.pos.CrashedBelow, CrashedUntil: l.pos.CrashedUntil, CrashedXids: l.pos.CrashedXids, Prev: l.pos.Prev,
		Cur: l.pos.Cur, Below: l.pos.Below, Slots: l.pos.Slots, Queue: l.queue, Lane: l.lane})
	if err != nil {
		return err
	}
	l.spilled = true
	if l.keyed() {
		l.below = max(l.below, moved.LastID)
	}
	c.env.Log.Info("outbox: moved the rows of ring claims that ended without an outcome to the outbox table",
		slog.String("queue", l.queue), slog.Int("lane", int(l.lane)), slog.Int64("rows", moved.Moved))
	return nil
}

// claimRow writes ring row x of queue, of ordering key key (nil for
// none), as a claim row: its first delivery.
func claimRow(row *db.ClaimRow, x *db.RingReadRow, queue string, key *string) {
	*row = db.ClaimRow{ID: x.ID, Queue: queue, Payload: x.Payload, Headers: x.Headers, OrderingKey: key, CreatedAt: x.CreatedAt,
		NextAttemptAt: x.NextAttemptAt, DeliveriesCount: 1}
}

// claimLanes claims from the ring's lanes (claimFreeLanes), and once
// more when its first try took only lanes that had nothing to read: it
// wrote their progress (a lane whose progress is older than a turn's age
// is ready), and the lanes with rows come next. busy reports that no
// lane was free while another of the subscriber's claims held lanes.
func (c *byRing) claimLanes(ctx context.Context, n int32, age time.Duration) (got int, busy bool, err error) {
	got, read, busy, err := c.claimFreeLanes(ctx, n, age)
	if err != nil || got > 0 || busy || read != 0 {
		return got, busy, err
	}
	got, _, busy, err = c.claimFreeLanes(ctx, n, age)
	return got, busy, err
}

// claimFreeLanes claims up to n rows of the free lanes that have rows
// to hand out, among those RingReadyLanes finds (lanes with rows to read,
// or whose progress is older than a turn's age), in one transaction that
// holds them while the rows' handlers run (see byLock.claimLocked). It
// takes a share of those lanes (the claims in flight share them), from
// where the last claim stopped, and reads them one after another until
// the batch is full: a claim of one lane each made a row wait for a
// round of claims of every lane that had rows. read is how many rows it
// read (-1 when it took no lane); busy reports that it took none while
// another of the subscriber's claims held lanes.
func (c *byRing) claimFreeLanes(ctx context.Context, n int32, age time.Duration) (got, read int, busy bool, err error) {
	k, r := c.lock, c.env
	select {
	case k.locks <- struct{}{}:
	case <-ctx.Done():
		return 0, -1, false, ctx.Err()
	}
	started := false
	defer func() {
		if !started {
			<-k.locks
		}
	}()
	ready, err := ring.ReadyLanes(r.Writes, r.Pool, r.Queries, r.QueryTimeout, r.Queues, 2*firstKeyedLane, age)
	if err != nil || len(ready) == 0 {
		return 0, -1, false, err
	}
	// A claim takes its share of the lanes with rows, or one lane while
	// claims fill their batches: a lane taken after the batch filled
	// would be held unread.
	most := (len(ready) + InFlight - 1) / InFlight
	if c.full {
		most = 1
	}
	if ready = c.free(ready); len(ready) == 0 {
		return 0, -1, true, nil
	}
	ctx = r.Writes
	sent := time.Now()
	tx, rollback, ls, err := c.take(ctx, 2*firstKeyedLane, ready, most)
	if err != nil {
		return 0, 0, false, err
	}
	q := c.claimTx(tx)
	if len(ls) == 0 {
		rollback()
		return 0, -1, len(k.locks) > 1, nil
	}
	if err := c.readLanes(ctx, q, n, ls); err != nil {
		rollback()
		return 0, 0, false, err
	}
	var changed, handing []*lane
	for _, l := range ls {
		if !l.unchanged() {
			changed = append(changed, l)
		}
		if len(l.due) > 0 {
			handing = append(handing, l)
		}
	}
	if len(handing) == 0 {
		// Nothing to hand out: the progress (with the moves, if any)
		// commits at once.
		if len(changed) == 0 {
			rollback()
			return 0, rowsRead(ls), false, nil
		}
		for _, l := range ls {
			if err == nil {
				err = c.spill(ctx, q, l, moves{}, pgtype.UUID{})
			}
		}
		if err == nil {
			err = progress(ctx, q.Queries, changed...)
		}
		if err == nil {
			err = tx.Commit(ctx)
		}
		if err != nil {
			rollback()
		} else if spilled(ls) {
			c.moved()
		}
		return 0, rowsRead(ls), false, err
	}
	rec := db.RingRecordParams{Xid: handing[0].pos.Xid, LeaseTtlSeconds: r.LeaseTTL.Seconds()}
	for _, l := range handing {
		rec.Queues, rec.Lanes = append(rec.Queues, l.queue), append(rec.Lanes, l.lane)
		rec.AfterSeqs, rec.Snaps, rec.Belows = append(rec.AfterSeqs, l.pos.Seq), append(rec.Snaps, l.end), append(rec.Belows, l.below)
	}
	recorded, err := r.bounded().RingRecord(ctx, rec)
	if err == nil && !recorded {
		err = errClaimEnded
	}
	if err == nil {
		err = q.RingConfirm(ctx)
	}
	if err != nil {
		rollback()
		return 0, 0, false, fmt.Errorf("recording a ring claim: %w", err)
	}
	type at struct {
		l   *lane
		row int
	}
	var rows []at
	keyed := false
	for _, l := range handing {
		keyed = keyed || l.keyed()
		for _, i := range l.due {
			rows = append(rows, at{l, i})
		}
	}
	lc := &lockedClaim{tx: tx, open: true, settled: make(chan struct{}), dead: make(chan struct{}), left: len(rows),
		kept: make([]lease.Outcome, 0, len(rows))}
	// The end runs in the claim's transaction, its other statements on the
	// queries the locked claim's end gives it.
	ring := q.ring
	lc.end = func(ctx context.Context, q *db.Queries, e *lockEnd, token pgtype.UUID) error {
		return c.endLanes(ctx, claimTx{Queries: q, ring: ring}, ls, changed, e, token)
	}
	lc.committed = func(e *lockEnd) {
		if spilled(ls) || len(e.leased) > 0 {
			c.moved()
		}
	}
	lc.straggle, lc.observe = c.straggle(), c.observe
	lc.released = c.hold(ls)
	if keyed {
		xid := rec.Xid
		lc.acks = &ackLog{log: r.Log, write: func(ids []int64) (bool, error) {
			return r.bounded().RingAck(r.Writes, db.RingAckParams{Xid: xid, Ids: ids})
		}}
	}
	ds := r.Leases.AddEach(r.HandlerCtx, len(rows), func(i int, row *db.ClaimRow) {
		x := rows[i]
		var key *string
		if x.l.keys != nil {
			key = x.l.keys[x.row]
		}
		claimRow(row, &x.l.rows[x.row], x.l.queue, key)
	}, pgtype.UUID{}, sent)
	handed := ds
	if keyed {
		handed = lc.chain(ds, r.Leases.Remove)
	}
	started = true
	k.hold(ds, handed, lc)
	return len(handed), rowsRead(ls), false, nil
}

// spilled reports whether a claim of lanes ls moved rows of any of them
// into the outbox table unleased.
func spilled(ls []*lane) bool {
	return slices.ContainsFunc(ls, func(l *lane) bool { return l.spilled })
}

// rowsRead returns how many rows the claim of lanes ls read, the
// batches of dead claims it moved counting as one each.
func rowsRead(ls []*lane) int {
	n := 0
	for _, l := range ls {
		n += len(l.rows)
		if len(l.pos.Crashed) > 0 {
			n++
		}
	}
	return n
}

// readLanes reads the batches of lanes ls, taken in q's transaction, one
// after another, until n rows are due; it keeps the rows not yet due for
// the claim's end (due). A lane taken after the batch filled is held,
// unread, until the claim ends, and the next claim starts from it.
func (c *byRing) readLanes(ctx context.Context, q claimTx, n int32, ls []*lane) error {
	for _, l := range ls {
		if n <= 0 {
			break
		}
		if err := c.read(ctx, q, l, n); err != nil {
			return err
		}
		var err error
		if l.due, err = c.due(ctx, q, l); err != nil {
			return err
		}
		n -= int32(len(l.due))
		// The next claim starts after the last lane read, so that a lane
		// taken but not read is not passed over.
		c.turn = l.at + 1
	}
	c.full = n <= 0
	return nil
}

// endLanes writes the end of a claim of lanes ls in its transaction: the
// moves of their rows that need state into the outbox table, then the
// progress of the lanes changed, which acknowledges the rest.
func (c *byRing) endLanes(ctx context.Context, q claimTx, ls, changed []*lane, e *lockEnd, token pgtype.UUID) error {
	type at struct {
		l    *lane
		txid int64
	}
	rows := make(map[int64]at)
	for _, l := range ls {
		for i := range l.rows {
			rows[l.rows[i].ID] = at{l, int64(l.rows[i].Txid)}
		}
	}
	ms := make(map[*lane]*moves)
	add := func(id int64, deliveries int32, leased bool) {
		x := rows[id]
		m := ms[x.l]
		if m == nil {
			m = &moves{}
			ms[x.l] = m
		}
		m.add(id, x.txid, deliveries, leased)
	}
	for i, id := range e.leased {
		add(id, e.deliveries[i], true)
	}
	for _, id := range e.givenUp {
		add(id, 0, false)
	}
	for _, l := range ls {
		m := moves{}
		if ms[l] != nil {
			m = *ms[l]
		}
		if err := c.spill(ctx, q, l, m, token); err != nil {
			return err
		}
	}
	return progress(ctx, q.Queries, changed...)
}

// leaseLanes claims from the ring by lease, among the lanes
// RingReadyLanes finds (lanes with rows to read, or whose progress is
// older than a turn's age): it moves the keyed lanes' new rows into the
// outbox table when a keyed lane is ready (moveKeyed), and claims a
// batch of a ready unkeyed lane (leaseLane). With no lane ready, as on
// an outbox whose writers write into the table alone, it sends nothing
// more: the claim of the table follows at once.
func (c *byRing) leaseLanes(n int32, age time.Duration) (int, error) {
	r := c.env
	ready, err := ring.ReadyLanes(r.Writes, r.Pool, r.Queries, r.QueryTimeout, r.Queues, 2*firstKeyedLane, age)
	if err != nil {
		return 0, err
	}
	var unkeyed []int32
	keyed := false
	for _, p := range ready {
		// ReadyLanes counts a queue's lanes 0-7; take counts its
		// unkeyed lanes 0-3.
		if lane := p % (2 * firstKeyedLane); lane < firstKeyedLane {
			unkeyed = append(unkeyed, p/(2*firstKeyedLane)*firstKeyedLane+lane)
		} else {
			keyed = true
		}
	}
	if keyed {
		if err := c.moveKeyed(); err != nil {
			return 0, fmt.Errorf("moving keyed rows of the ring: %w", err)
		}
	}
	if len(unkeyed) == 0 {
		return 0, nil
	}
	return c.leaseLane(n, unkeyed)
}

// leaseLane claims a batch of up to n rows of a free unkeyed lane among
// those at positions ready, by lease: it moves the batch into the outbox
// table leased, writes the lane's progress and commits, and hands the
// rows out as a claim by lease does.
func (c *byRing) leaseLane(n int32, ready []int32) (int, error) {
	r := c.env
	ctx := r.Writes
	token, err := newLeaseToken()
	if err != nil {
		return 0, err
	}
	sent := time.Now()
	tx, rollback, ls, err := c.take(ctx, firstKeyedLane, ready, 1)
	if err != nil {
		return 0, err
	}
	defer rollback()
	q := c.claimTx(tx)
	if len(ls) == 0 {
		return 0, nil
	}
	l := ls[0]
	c.turn = l.at + 1
	if err := c.read(ctx, q, l, n); err != nil {
		return 0, err
	}
	due, err := c.due(ctx, q, l)
	if err != nil {
		return 0, err
	}
	if l.unchanged() {
		return 0, nil
	}
	m := moves{}
	for _, i := range due {
		m.add(l.rows[i].ID, int64(l.rows[i].Txid), 1, true)
	}
	if err := c.spill(ctx, q, l, m, token); err != nil {
		return 0, err
	}
	if err := progress(ctx, q.Queries, l); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	if l.spilled {
		c.moved()
	}
	ds := r.Leases.AddEach(r.HandlerCtx, len(due), func(i int, row *db.ClaimRow) { claimRow(row, &l.rows[due[i]], l.queue, nil) },
		token, sent)
	r.Hand(ds)
	return len(ds), nil
}

// ackLog records a claim of keyed lanes' acknowledgements of rows whose
// keys' next rows it hands out (RingAck), each in a statement of its own
// that commits before the next row runs. Rows acknowledged while a
// statement runs go together in the next one.
type ackLog struct {
	write func(ids []int64) (bool, error)
	log   *slog.Logger

	mu      sync.Mutex
	busy    bool
	pending []int64
	waiting []chan bool
}

// record records the acknowledgement of row id, and reports whether it
// was recorded while the claim's transaction was in progress: only then
// may the key's next row run.
func (a *ackLog) record(id int64) bool {
	done := make(chan bool, 1)
	a.mu.Lock()
	a.pending = append(a.pending, id)
	a.waiting = append(a.waiting, done)
	if a.busy {
		a.mu.Unlock()
		return <-done
	}
	a.busy = true
	for len(a.pending) > 0 {
		ids, waiting := a.pending, a.waiting
		a.pending, a.waiting = nil, nil
		a.mu.Unlock()
		recorded, err := a.write(ids)
		if err != nil {
			a.log.Warn("outbox: recording acknowledgements of a ring claim failed; the keys' next rows wait for its end",
				slog.Int("rows", len(ids)), slog.Any("error", err))
		}
		for _, w := range waiting {
			w <- recorded && err == nil
		}
		a.mu.Lock()
	}
	a.busy = false
	a.mu.Unlock()
	return <-done
}
