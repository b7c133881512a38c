package main

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// claimTimer times the subscribers' claim statements, on the client: it is
// the pool's query tracer and keeps, for every statement whose text is one
// of the library's claims, the time from sending it to its end (round
// trip, execution, and reading the claimed rows). Every claim counts,
// those that find nothing included. It recognises a claim by the name
// sqlc gives it at the head of its text ("-- name: Claim :many",
// "-- name: ClaimQueue :many").
type claimTimer struct {
	durations
}

type claimStartKey struct{}

// TraceQueryStart implements pgx.QueryTracer.
func (c *claimTimer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !isClaim(data.SQL) {
		return ctx
	}
	return context.WithValue(ctx, claimStartKey{}, time.Now())
}

// TraceQueryEnd implements pgx.QueryTracer.
func (c *claimTimer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if start, ok := ctx.Value(claimStartKey{}).(time.Time); ok && data.Err == nil {
		c.add(time.Since(start))
	}
}

func isClaim(sql string) bool {
	return strings.HasPrefix(sql, "-- name: Claim :many") || strings.HasPrefix(sql, "-- name: ClaimQueue :many")
}
