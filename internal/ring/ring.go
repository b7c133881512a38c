// Package ring is the log tier's ring beside an outbox table (schema 13,
// sql/migrations/00013_log_ring.sql): the grants it needs, the cut of a
// batch's snapshot, the ring's turns, and its rebase after a restore.
// Package claim reads it (claim.Env.Ring); writers INSERT into it like
// into the outbox table.
package ring

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
	"github.com/outboxgen/outboxgen/internal/naming"
)

// Rebased is what Rebase did.
type Rebased struct {
	// Consumed counts the rows it deleted, which their lanes had read;
	// Kept the rows left, which every lane now reads from the start.
	Consumed, Kept int64
}

// Rebase makes the ring of outbox n readable in the cluster it was
// restored into (from a pg_dump, or by a cut-over to a logical replica),
// in one transaction of conn, as the ring's owner, before writers and
// subscribers start there. The ring's rows, progress and records of
// claims hold transaction ids and snapshots of the cluster that wrote
// them: where that cluster's counter was ahead, no snapshot would see
// the rows until this one's passed them, and asking for a record's
// transaction status fails. Rebase deletes the rows their lanes had
// consumed (judged in the other cluster's numbering, which rows and
// progress share), gives the rows left its own transaction's id, forgets
// the progress, the records of claims and their acknowledgements, and
// has every lane read the ring from its start. A row a claim held when
// the dump was taken is delivered again, without that delivery counted.
func Rebase(ctx context.Context, conn dbx.Beginner, n naming.Names) (r Rebased, err error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return r, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	q := naming.Queries(n)(tx)
	err = q.RingRebaseLock(ctx)
	if err == nil {
		r.Consumed, err = q.RingRebaseDeleteConsumed(ctx)
	}
	if err == nil {
		r.Kept, err = q.RingRebaseRows(ctx)
	}
	if err == nil {
		err = q.RingRebaseForget(ctx)
	}
	if err != nil {
		return r, fmt.Errorf("outbox: rebasing the ring: %w", err)
	}
	return r, tx.Commit(ctx)
}

// Grants returns the GRANT statements that give roles what they need of
// the ring of outbox n, beside what outbox.Grants gives them on the
// outbox, in the order to run them (as the ring's owner): publisher
// writes into the ring with plain INSERTs of the columns a writer
// chooses (never id, txid or slot, which place a row), and subscriber
// reads, claims and turns it. An empty name gets nothing. The function
// that empties a partition and the triggers' run as the owner: no role
// needs a privilege on what they touch.
func Grants(n naming.Names, publisher, subscriber string) []string {
	rel := func(suffix string) string { return n.Qualified(n.Table + suffix) }
	var out []string
	if publisher != "" {
		p := pgx.Identifier{publisher}.Sanitize()
		out = append(out,
			"GRANT INSERT (queue, payload, headers, ordering_key, created_at, next_attempt_at), SELECT (id) ON "+rel("_ring")+" TO "+p,
			// The defaults of id and slot, and the wake trigger's WHEN.
			"GRANT USAGE ON SEQUENCE "+rel("_id_seq")+" TO "+p,
			"GRANT SELECT ON SEQUENCE "+rel("_ring_slot")+", "+rel("_sleep_horizon")+" TO "+p,
			"GRANT EXECUTE ON FUNCTION "+rel("_ring_slot_now")+"() TO "+p,
		)
	}
	if subscriber != "" {
		s := pgx.Identifier{subscriber}.Sanitize()
		out = append(out,
			"GRANT SELECT ON "+rel("_ring")+" TO "+s,
			// Lanes are made by claimers and locked (FOR UPDATE), never
			// updated; progress, the records of claims and their
			// acknowledgements are appended, and pruned behind the newest.
			"GRANT SELECT, INSERT, UPDATE ON "+rel("_ring_lanes")+" TO "+s,
			"GRANT SELECT, INSERT, DELETE ON "+rel("_ring_progress")+", "+rel("_ring_claims")+", "+rel("_ring_acks")+" TO "+s,
			"GRANT SELECT, UPDATE ON "+rel("_ring_turns")+" TO "+s,
			// A turn moves writers on to the next partition.
			"GRANT USAGE, SELECT ON SEQUENCE "+rel("_ring_slot")+" TO "+s,
			"GRANT EXECUTE ON FUNCTION "+rel("_ring_slot_now")+"(), "+rel("_ring_since")+"(pg_snapshot, pg_snapshot), "+
				rel("_ring_read_past")+"(smallint), "+rel("_ring_truncate")+"(smallint) TO "+s,
		)
	}
	return out
}

// Cut returns the snapshot that ends a batch cut after transaction
// last: the batch held the rows that snapshot cur sees and prev (the
// lane's progress) did not, in transaction order, up to and including
// last's. The cut sees what prev saw, and what cur sees up to last: a
// transaction above last stays unseen only if prev did not see it. (A
// batch that starts at a transaction prev saw running can end below
// prev's xmax; a cut that forgot what prev saw above last would have
// the lane read those rows again.) Snapshots are pg_snapshot's text
// (xmin:xmax:xips), prev taken before cur.
func Cut(prev, cur string, last int64) (string, error) {
	_, pmax, pxip, err := parseSnapshot(prev)
	if err != nil {
		return "", err
	}
	_, _, cxip, err := parseSnapshot(cur)
	if err != nil {
		return "", err
	}
	end := uint64(last) + 1
	xmax := max(end, pmax)
	// Unseen by the cut: what cur saw running up to last (which prev
	// saw running too, or had not seen begin), and what prev saw running
	// above it.
	var xip []uint64
	for _, x := range cxip {
		if x < end {
			xip = append(xip, x)
		}
	}
	for _, x := range pxip {
		if x >= end {
			xip = append(xip, x)
		}
	}
	slices.Sort(xip)
	xip = slices.Compact(xip)
	xmin := xmax
	if len(xip) > 0 {
		xmin = xip[0]
	}
	xs := make([]string, len(xip))
	for i, x := range xip {
		xs[i] = strconv.FormatUint(x, 10)
	}
	return fmt.Sprintf("%d:%d:%s", xmin, xmax, strings.Join(xs, ",")), nil
}

// parseSnapshot reads a pg_snapshot's text: xmin, xmax and the
// transactions in progress.
func parseSnapshot(snap string) (xmin, xmax uint64, xip []uint64, err error) {
	bad := fmt.Errorf("outbox: not a snapshot: %q", snap)
	parts := strings.Split(snap, ":")
	if len(parts) != 3 {
		return 0, 0, nil, bad
	}
	if xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return 0, 0, nil, bad
	}
	if xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil || xmax < xmin {
		return 0, 0, nil, bad
	}
	if parts[2] != "" {
		for _, f := range strings.Split(parts[2], ",") {
			x, err := strconv.ParseUint(f, 10, 64)
			if err != nil || x < xmin || x >= xmax {
				return 0, 0, nil, bad
			}
			xip = append(xip, x)
		}
	}
	return xmin, xmax, xip, nil
}

// Turned is what one Turn did.
type Turned struct {
	// Moved: writers moved to the next partition.
	Moved bool
	// Truncated and Busy count the partitions every lane had read past
	// that were emptied, and those that were kept (they are tried
	// again): by a lock, or by rows found unread once it was taken.
	Truncated, Busy int
}

// Pool is what Turn runs on: a pgxpool.Pool.
type Pool interface {
	db.DBTX
	dbx.Beginner
}

// Turn moves writers to the next partition when the one they write into
// is older than age and the next is open, then empties every partition
// that every lane has read past, and deletes the progress and claim
// records behind each lane's newest. Each statement runs on its own on
// pool, within timeout (queries renders them for the outbox): a reader
// must see a partition open before a writer can write into it. The
// search for the partitions every lane has read past runs with JIT off
// (withoutJIT): compiling it took 0.6 s where it runs in a millisecond.
func Turn(ctx context.Context, pool Pool, queries func(db.DBTX) *db.Queries, timeout, age time.Duration) (Turned, error) {
	var t Turned
	q := queries(dbx.Bounded{Inner: pool, Timeout: timeout})
	st, err := q.RingTurnState(ctx)
	if err != nil {
		return t, err
	}
	if st.AgeSeconds >= age.Seconds() && st.NextOpen {
		next, err := q.RingNextSlot(ctx, st.Slot)
		if err != nil {
			return t, err
		}
		if next.Turned {
			t.Moved = true
			if err := q.RingCloseSlot(ctx, st.Slot); err != nil {
				return t, err
			}
		}
	}
	done, err := doneSlots(ctx, pool, queries, timeout)
	if err != nil {
		return t, err
	}
	for _, s := range done {
		ok, err := q.RingTruncate(ctx, s)
		if err != nil {
			return t, err
		}
		if ok {
			t.Truncated++
		} else {
			t.Busy++
		}
	}
	if t.Truncated > 0 {
		err = q.RingPrune(ctx)
	}
	return t, err
}

// doneSlots returns the partitions every lane has read past.
func doneSlots(ctx context.Context, pool Pool, queries func(db.DBTX) *db.Queries, timeout time.Duration) (done []int16, err error) {
	err = withoutJIT(ctx, pool, queries, timeout, func(q *db.Queries) error {
		done, err = q.RingDoneSlots(ctx)
		return err
	})
	return done, err
}

// Unread returns how many committed rows of the ring the newest progress
// of their lane has not seen: the rows still to be read.
func Unread(ctx context.Context, pool Pool, queries func(db.DBTX) *db.Queries, timeout time.Duration) (n int64, err error) {
	err = withoutJIT(ctx, pool, queries, timeout, func(q *db.Queries) error {
		qs, err := q.RingQueueDepths(ctx, math.MaxInt64)
		for _, d := range qs {
			n += d.Ready + d.Scheduled
		}
		return err
	})
	return n, err
}

// withoutJIT runs fn in a transaction of its own with JIT off: the
// planner has no statistics of the ring's small tables (they are never
// vacuumed), and its estimates of statements that join them pass
// jit_above_cost, whose compilation takes longer than they run.
func withoutJIT(ctx context.Context, pool Pool, queries func(db.DBTX) *db.Queries, timeout time.Duration, fn func(q *db.Queries) error) error {
	tx, rollback, err := dbx.BeginReadCommitted(ctx, pool, timeout)
	if err != nil {
		return err
	}
	defer rollback()
	q := queries(dbx.Bounded{Inner: tx, Timeout: timeout})
	if err := q.NoJIT(ctx); err != nil {
		return err
	}
	return fn(q)
}

// ReadyLanes returns the positions (as RingTakeLanes counts them) of the
// lanes of queues below toLane that hold committed rows their newest
// progress has not consumed, or whose newest progress is older than idle:
// the lanes a claim should take. It is one statement in a transaction of
// its own (autocommit), which holds no partition once it returns; its
// probes are bounded by indexes, and cost too little for JIT.
func ReadyLanes(ctx context.Context, pool Pool, queries func(db.DBTX) *db.Queries, timeout time.Duration, queues []string,
	toLane int16, idle time.Duration) ([]int32, error) {
	return queries(dbx.Bounded{Inner: pool, Timeout: timeout}).RingReadyLanes(ctx, db.RingReadyLanesParams{Queues: queues,
		FromLane: 0, ToLane: toLane, IdleProgressSeconds: idle.Seconds()})
}
