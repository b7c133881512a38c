package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
)

// The kinds of held transaction (-hold-kind).
const (
	// holdXID is a forgotten session that wrote, or asked for its id:
	// BEGIN; SELECT txid_current(); its transaction id pins the horizon.
	holdXID = "xid"
	// holdSnapshot is a report or a backup reading one consistent view:
	// BEGIN ISOLATION LEVEL REPEATABLE READ and a first query, which takes
	// the snapshot that pins the horizon; it has no transaction id.
	holdSnapshot = "snapshot"
)

// holdResult says when the idle transaction was open, since the start.
type holdResult struct {
	opened, closed time.Duration
	xid            int64 // 0 for a snapshot, which has none
	xmin           int64 // the snapshot's xmin, for a snapshot
	err            error
}

// hold opens, at the start plus at, a transaction on a connection of its
// own, of the given kind, leaves it idle for span, and rolls it back.
// While it is open, vacuum must keep every row version deleted after it
// began: the outbox's dead tuples cannot be removed, and the claim's index
// scans step over them.
func hold(ctx context.Context, cfg *pgx.ConnConfig, start time.Time, at, span time.Duration, kind string, sm *sampler) holdResult {
	var h holdResult
	if !sleepUntil(ctx, start.Add(at)) {
		h.err = ctx.Err()
		return h
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		h.err = err
		fmt.Fprintln(os.Stderr, "soak: hold phase: connect:", err)
		return h
	}
	defer conn.Close(context.WithoutCancel(ctx))
	what := ""
	switch kind {
	case holdSnapshot:
		if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ"); err != nil {
			h.err = err
			return h
		}
		if err := conn.QueryRow(ctx, "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint").Scan(&h.xmin); err != nil {
			h.err = err
			return h
		}
		what = fmt.Sprintf("REPEATABLE READ transaction (snapshot xmin %d)", h.xmin)
	default:
		if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
			h.err = err
			return h
		}
		if err := conn.QueryRow(ctx, "SELECT txid_current()").Scan(&h.xid); err != nil {
			h.err = err
			return h
		}
		what = fmt.Sprintf("transaction %d", h.xid)
	}
	h.opened = time.Since(start)
	sm.holdOpened(h.opened)
	fmt.Printf("soak: %v: %s open and idle on its own connection, for %v\n", h.opened.Round(time.Second), what, span)
	sleepUntil(ctx, start.Add(at+span))
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := conn.Exec(rctx, "ROLLBACK"); err != nil {
		h.err = err
	}
	h.closed = time.Since(start)
	sm.holdClosed(h.closed)
	fmt.Printf("soak: %v: %s rolled back\n", h.closed.Round(time.Second), what)
	return h
}

// name says which transaction it was, for the summary.
func (h holdResult) name() string {
	if h.xid == 0 {
		return fmt.Sprintf("REPEATABLE READ transaction (snapshot xmin %d)", h.xmin)
	}
	return fmt.Sprintf("transaction %d", h.xid)
}
