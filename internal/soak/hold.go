package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
)

// holdResult says when the idle transaction was open, since the start.
type holdResult struct {
	opened, closed time.Duration
	xid            int64
	err            error
}

// hold opens, at the start plus at, a transaction on a connection of its
// own, as a forgotten session does (BEGIN; SELECT txid_current();), leaves
// it idle for span, and rolls it back. While it is open, vacuum must keep
// every row version deleted after it began: the outbox's dead tuples
// cannot be removed, and the claim's index scans step over them.
func hold(ctx context.Context, cfg *pgx.ConnConfig, start time.Time, at, span time.Duration, sm *sampler) holdResult {
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
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		h.err = err
		return h
	}
	if err := conn.QueryRow(ctx, "SELECT txid_current()").Scan(&h.xid); err != nil {
		h.err = err
		return h
	}
	h.opened = time.Since(start)
	sm.holdOpened(h.opened)
	fmt.Printf("soak: %v: transaction %d open and idle on its own connection, for %v\n", h.opened.Round(time.Second), h.xid, span)
	sleepUntil(ctx, start.Add(at+span))
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := conn.Exec(rctx, "ROLLBACK"); err != nil {
		h.err = err
	}
	h.closed = time.Since(start)
	sm.holdClosed(h.closed)
	fmt.Printf("soak: %v: transaction %d rolled back\n", h.closed.Round(time.Second), h.xid)
	return h
}
