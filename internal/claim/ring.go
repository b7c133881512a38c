package claim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
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
// An unkeyed lane (0-3) is claimed like a claim by lock: a READ COMMITTED
// transaction locks the lane, reads its batch (the rows its snapshot sees
// that the lane's newest progress did not), records the claim on its own
// (autocommit), and holds the lane while the batch's handlers run. Its
// end, in the same transaction, inserts the lane's progress, which
// acknowledges every row of the batch at once, and moves into the outbox
// table the rows that need state there: leased, the rows whose handlers
// run on or failed (the lease path writes their retry or dead letter, as
// after a claim by lock); unleased, the rows no handler started. A claim
// whose transaction aborted (its subscriber crashed, its connection died)
// leaves its record: the lane's next reader moves that batch into the
// outbox table, each row counting the deliveries that claims made of it,
// and the outbox table's claims deliver them from there.
//
// A keyed lane (4-7) is claimed the same way when claims lock, but read
// in id order, which within a key is commit order, and its progress
// holds the batch's largest id as well as its snapshot (see
// RingReadKeyed): a batch cut at a transaction could hand a key's later
// row out before its earlier one. A key's rows go to handlers one after
// another: its first row of the batch at once, each next one when the
// one before it is acknowledged (lockedClaim.Next); a row that fails,
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

// byRing claims from the ring, and from the outbox table with state, the
// claimer New would choose without the ring.
type byRing struct {
	env   *Env
	lock  *byLock
	state Claimer
	// turn is where the search for a free lane starts: a position among
	// the (queue, lane) pairs (RingTakeLane).
	turn int32
	// turned is when the claimer last tried to turn the ring.
	turned time.Time
}

// Ended waits for the claims of the ring and of the outbox table.
func (c *byRing) Ended() int { return c.state.Ended() + c.lock.Ended() }

// HandedOn lowers the outbox table's floors to the keys' next rows.
func (c *byRing) HandedOn(os []lease.Outcome) { c.state.HandedOn(os) }

// Behind asks the outbox table's next claim to sweep.
func (c *byRing) Behind() { c.state.Behind() }

// Claim claims a batch of a lane, and from the outbox table the rows
// the batch left room for (claims by lease first move the keyed lanes'
// new rows into the outbox table, and take unkeyed lanes only). Every
// RingTurnAge/4 it turns the ring.
func (c *byRing) Claim(ctx context.Context, n int32) (int, error) {
	r := c.env
	age := r.RingTurnAge
	if age <= 0 {
		age = RingTurnAge
	}
	if time.Since(c.turned) >= age/4 {
		c.turned = time.Now()
		if t, err := ring.Turn(r.Writes, r.Pool, r.Queries, r.QueryTimeout, age); err != nil {
			r.Log.Warn("outbox: turning the ring failed", slog.Any("error", err))
		} else if t.Busy > 0 {
			r.Log.Debug("outbox: a lock kept the ring from emptying a partition", slog.Int("partitions", t.Busy))
		}
	}
	var got int
	var err error
	if LocksRows(r.LockWindow, r.Pool.Config().MaxConns) {
		got, err = c.claimLanes(ctx, n, age)
	} else {
		if err := c.moveKeyed(); err != nil {
			return 0, fmt.Errorf("moving keyed rows of the ring: %w", err)
		}
		got, err = c.leaseLane(n)
	}
	if err != nil || got >= int(n) {
		return got, err
	}
	more, err := c.state.Claim(ctx, n-int32(got))
	return got + more, err
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
	if _, err := q.RingMoveKeyed(ctx, p); err != nil {
		return err
	}
	return tx.Commit(ctx)
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
	pos   db.RingPositionRow
	// end is the snapshot the batch ends at: pos.Cur, or the cut after
	// its last transaction when it filled; below is the largest id the
	// batch consumes (unkeyedBelow for an unkeyed lane).
	end   string
	below int64
	rows  []db.RingReadRow
	// keys are the rows' ordering keys, of a keyed lane's batch.
	keys []*string
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

// progress writes l's progress in q's transaction.
func (l *lane) progress(ctx context.Context, q *db.Queries) error {
	return q.RingProgress(ctx, db.RingProgressParams{Queue: l.queue, Lane: l.lane, Snap: l.end, Below: l.below})
}

// read takes a free lane below toLane, at one of the positions ready
// when it is not nil, and reads up to n rows of its batch in q's
// transaction; ok is false when no lane was free. A lane whose last
// claims aborted has its batch moved into the outbox table instead
// (rows nil).
func (c *byRing) read(ctx context.Context, q *db.Queries, n int32, toLane int16, ready []int32) (l lane, ok bool, err error) {
	r := c.env
	taken, err := q.RingTakeLane(ctx, db.RingTakeLaneParams{Queues: r.Queues, FromLane: 0, ToLane: toLane, Turn: c.turn,
		Ready: ready})
	if errors.Is(err, pgx.ErrNoRows) {
		return l, false, nil
	} else if err != nil {
		return l, false, err
	}
	c.turn = taken.Pos + 1
	l = lane{queue: taken.Queue, lane: taken.Lane}
	if l.pos, err = q.RingPosition(ctx, db.RingPositionParams{Queue: l.queue, Lane: l.lane}); err != nil {
		return l, true, err
	}
	l.end, l.below = l.pos.Cur, unkeyedBelow
	if l.keyed() {
		l.below = l.pos.Below
	}
	if len(l.pos.Crashed) > 0 {
		moved, err := q.RingMoveCrashed(ctx, db.RingMoveCrashedParams{Crashed: l.pos.Crashed, CrashedBelow: l.pos.CrashedBelow,
			Prev: l.pos.Prev, Cur: l.pos.Cur, Below: l.pos.Below, Slots: l.pos.Slots, Queue: l.queue, Lane: l.lane})
		if err == nil {
			if l.keyed() {
				l.below = max(l.below, moved.LastID)
			}
			r.Log.Info("outbox: moved the rows of ring claims that ended without an outcome to the outbox table",
				slog.String("queue", l.queue), slog.Int("lane", int(l.lane)), slog.Int64("rows", moved.Moved))
		}
		return l, true, err
	}
	if l.keyed() {
		return l, true, c.readKeyed(ctx, q, &l, n)
	}
	l.rows, err = q.RingRead(ctx, db.RingReadParams{Prev: l.pos.Prev, Cur: l.pos.Cur, Slots: l.pos.Slots, Queue: l.queue,
		Lane: l.lane, MaxRows: n})
	if err != nil || len(l.rows) < int(n) {
		return l, true, err
	}
	last := l.rows[len(l.rows)-1]
	rest, err := q.RingReadRest(ctx, db.RingReadRestParams{Slots: l.pos.Slots, Queue: l.queue, Lane: l.lane,
		Txid: fmt.Sprint(last.Txid), AfterID: last.ID})
	if err != nil {
		return l, true, err
	}
	for _, x := range rest {
		l.rows = append(l.rows, db.RingReadRow(x))
	}
	l.end, err = ring.Cut(l.pos.Cur, int64(last.Txid))
	return l, true, err
}

// readKeyed reads up to n rows of keyed lane l's batch, in id order,
// and the bound they take the lane's progress to.
func (c *byRing) readKeyed(ctx context.Context, q *db.Queries, l *lane, n int32) error {
	rows, err := q.RingReadKeyed(ctx, db.RingReadKeyedParams{Prev: l.pos.Prev, Cur: l.pos.Cur, Below: l.pos.Below,
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
// table holds rows (none for an unkeyed lane): one probe per batch.
func (c *byRing) heldKeys(ctx context.Context, q *db.Queries, l *lane) ([]string, error) {
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

// due returns the indexes of l's rows to hand out now, and moves the
// others into the outbox table, unleased, in q's transaction: rows not
// yet due and, in a keyed lane, the rows of keys the outbox table holds,
// which go behind the key's rows there, and a key's rows from its first
// one not yet due.
func (c *byRing) due(ctx context.Context, q *db.Queries, l *lane) ([]int, error) {
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
			m.add(x.ID, int64(x.Txid), 0)
		} else {
			due = append(due, i)
		}
	}
	return due, c.move(ctx, q, l, m, pgtype.UUID{})
}

// moves are ring rows to move into the outbox table.
type moves struct {
	ids, txids []int64
	deliveries []int32
}

func (m *moves) add(id, txid int64, deliveries int32) {
	m.ids = append(m.ids, id)
	m.txids = append(m.txids, txid)
	m.deliveries = append(m.deliveries, deliveries)
}

// move moves m's rows of l into the outbox table in q's transaction,
// leased with token when it is valid.
func (c *byRing) move(ctx context.Context, q *db.Queries, l *lane, m moves, token pgtype.UUID) error {
	if len(m.ids) == 0 {
		return nil
	}
	n, err := q.RingMove(ctx, db.RingMoveParams{Token: token, LeaseTtlSeconds: c.env.LeaseTTL.Seconds(), Ids: m.ids,
		Txids: m.txids, Deliveries: m.deliveries, Slots: l.pos.Slots, Queue: l.queue, Lane: l.lane})
	if err == nil && int(n) != len(m.ids) {
		err = fmt.Errorf("outbox: moved %d of %d rows of the ring: %w", n, len(m.ids), errLocksLost)
	}
	return err
}

// claimRow writes ring row x of queue, of ordering key key (nil for
// none), as a claim row: its first delivery.
func claimRow(row *db.ClaimRow, x *db.RingReadRow, queue string, key *string) {
	*row = db.ClaimRow{ID: x.ID, Queue: queue, Payload: x.Payload, Headers: x.Headers, OrderingKey: key, CreatedAt: x.CreatedAt,
		NextAttemptAt: x.NextAttemptAt, DeliveriesCount: 1}
}

// claimLanes claims a batch of up to n rows of the first free lane that
// has rows to hand out, among those RingReadyLanes finds (lanes with
// rows to read, or whose progress is older than a turn's age), trying
// each at most once: taking lanes that have nothing, one transaction
// each, made a row wait for a round of every queue's lanes.
func (c *byRing) claimLanes(ctx context.Context, n int32, age time.Duration) (int, error) {
	r := c.env
	ready, err := ring.ReadyLanes(r.Writes, r.Pool, r.Queries, r.QueryTimeout, r.Queues, 2*firstKeyedLane, age)
	if err != nil || len(ready) == 0 {
		return 0, err
	}
	for range ready {
		got, took, err := c.claimLane(ctx, n, ready)
		if err != nil || got > 0 || !took {
			return got, err
		}
	}
	return 0, nil
}

// claimLane claims a batch of up to n rows of a free lane and holds the
// lane while its handlers run (see byLock.claimLocked); took reports
// whether it took a lane.
func (c *byRing) claimLane(ctx context.Context, n int32, ready []int32) (got int, took bool, err error) {
	k, r := c.lock, c.env
	select {
	case k.locks <- struct{}{}:
	case <-ctx.Done():
		return 0, false, ctx.Err()
	}
	ctx = r.Writes
	started := false
	defer func() {
		if !started {
			<-k.locks
		}
	}()
	tx, rollback, err := dbx.BeginReadCommitted(ctx, r.Pool, r.QueryTimeout)
	if err != nil {
		return 0, false, err
	}
	q := r.Queries(dbx.Bounded{Inner: tx, Timeout: r.QueryTimeout})
	sent := time.Now()
	l, ok, err := c.read(ctx, q, n, 2*firstKeyedLane, ready)
	if err != nil || !ok {
		rollback()
		return 0, ok, err
	}
	due, err := c.due(ctx, q, &l)
	if err != nil {
		rollback()
		return 0, true, err
	}
	if len(due) == 0 {
		// Nothing to hand out: the progress (with the moves, if any)
		// commits at once.
		if l.unchanged() {
			rollback()
			return 0, true, nil
		}
		err = l.progress(ctx, q)
		if err == nil {
			err = tx.Commit(ctx)
		}
		if err != nil {
			rollback()
		}
		return 0, true, err
	}
	recorded, err := r.bounded().RingRecord(ctx, db.RingRecordParams{Xid: l.pos.Xid, Queue: l.queue, Lane: l.lane,
		AfterSeq: l.pos.Seq, Snap: l.end, Below: l.below})
	if err == nil && !recorded {
		err = errClaimEnded
	}
	if err == nil {
		err = q.RingConfirm(ctx)
	}
	if err != nil {
		rollback()
		return 0, true, fmt.Errorf("recording a ring claim: %w", err)
	}
	lc := &lockedClaim{tx: tx, open: true, settled: make(chan struct{}), dead: make(chan struct{}), left: len(due),
		kept: make([]lease.Outcome, 0, len(due))}
	lc.end = func(ctx context.Context, q *db.Queries, e *lockEnd, token pgtype.UUID) error {
		return c.endLane(ctx, q, &l, e, token)
	}
	ds := r.Leases.AddEach(r.HandlerCtx, len(due), func(i int, row *db.ClaimRow) {
		j := due[i]
		var key *string
		if l.keys != nil {
			key = l.keys[j]
		}
		claimRow(row, &l.rows[j], l.queue, key)
	}, pgtype.UUID{}, sent)
	handed := ds
	if l.keyed() {
		handed = lc.chain(ds, r.Leases.Remove)
	}
	started = true
	k.hold(ds, handed, lc)
	return len(handed), true, nil
}

// endLane writes the end of a lane's claim in its transaction: the moves
// of its rows that need state into the outbox table, then the lane's
// progress, which acknowledges the rest.
func (c *byRing) endLane(ctx context.Context, q *db.Queries, l *lane, e *lockEnd, token pgtype.UUID) error {
	txids := make(map[int64]int64, len(l.rows))
	for i := range l.rows {
		txids[l.rows[i].ID] = int64(l.rows[i].Txid)
	}
	var leased, givenUp moves
	for i, id := range e.leased {
		leased.add(id, txids[id], e.deliveries[i])
	}
	for _, id := range e.givenUp {
		givenUp.add(id, txids[id], 0)
	}
	if err := c.move(ctx, q, l, leased, token); err != nil {
		return err
	}
	if err := c.move(ctx, q, l, givenUp, pgtype.UUID{}); err != nil {
		return err
	}
	return l.progress(ctx, q)
}

// leaseLane claims a batch of up to n rows of a free unkeyed lane by
// lease: it moves the batch into the outbox table leased, writes the
// lane's progress and commits, and hands the rows out as a claim by
// lease does.
func (c *byRing) leaseLane(n int32) (int, error) {
	r := c.env
	ctx := r.Writes
	token, err := newLeaseToken()
	if err != nil {
		return 0, err
	}
	tx, rollback, err := dbx.BeginReadCommitted(ctx, r.Pool, r.QueryTimeout)
	if err != nil {
		return 0, err
	}
	defer rollback()
	q := r.Queries(dbx.Bounded{Inner: tx, Timeout: r.QueryTimeout})
	sent := time.Now()
	l, ok, err := c.read(ctx, q, n, firstKeyedLane, nil)
	if err != nil || !ok {
		return 0, err
	}
	due, err := c.due(ctx, q, &l)
	if err != nil {
		return 0, err
	}
	if l.unchanged() {
		return 0, nil
	}
	m := moves{}
	for _, i := range due {
		m.add(l.rows[i].ID, int64(l.rows[i].Txid), 1)
	}
	if err := c.move(ctx, q, &l, m, token); err != nil {
		return 0, err
	}
	if err := l.progress(ctx, q); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	ds := r.Leases.AddEach(r.HandlerCtx, len(due), func(i int, row *db.ClaimRow) { claimRow(row, &l.rows[due[i]], l.queue, nil) },
		token, sent)
	r.Hand(ds)
	return len(ds), nil
}
