// Package ring is the log tier's ring beside an outbox table: its schema
// (schema.sql, applied with Create), the cut of a batch's snapshot, and
// the ring's turns. Package claim reads it (claim.Env.Ring); writers
// INSERT into it like into the outbox table.
package ring

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
	"github.com/outboxgen/outboxgen/internal/naming"
)

//go:embed schema.sql
var schema string

// Create adds the ring to the outbox names n (whose migrations are
// applied), in one transaction of conn.
func Create(ctx context.Context, conn interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}, n naming.Names) error {
	sql, _, err := n.Render(schema)
	if err != nil {
		return err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol); err != nil {
		return fmt.Errorf("outbox: creating the ring: %w", err)
	}
	return tx.Commit(ctx)
}

// Cut returns the snapshot that ends a batch cut after transaction last:
// every transaction below last+1 that snapshot cur sees is done, those cur
// saw running stay running. cur is a pg_snapshot's text (xmin:xmax:xips).
func Cut(cur string, last int64) (string, error) {
	parts := strings.Split(cur, ":")
	if len(parts) != 3 {
		return "", fmt.Errorf("outbox: not a snapshot: %q", cur)
	}
	xmax := uint64(last) + 1
	lowest := xmax
	var xip []string
	if parts[2] != "" {
		for _, x := range strings.Split(parts[2], ",") {
			v, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				return "", fmt.Errorf("outbox: not a snapshot: %q", cur)
			}
			if v < xmax {
				xip = append(xip, x)
				lowest = min(lowest, v)
			}
		}
	}
	curMin, err := strconv.ParseUint(parts[0], 10, 64)
	if err != nil {
		return "", fmt.Errorf("outbox: not a snapshot: %q", cur)
	}
	return fmt.Sprintf("%d:%d:%s", min(lowest, curMin, xmax), xmax, strings.Join(xip, ",")), nil
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
		n, err = q.RingUnread(ctx)
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
