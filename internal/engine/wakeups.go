package engine

import (
	"context"
	"log/slog"
	"time"
)

// The run of a subscriber is a member of its outbox's LISTEN hub
// (internal/wakeup): the hub tells it of notifications, reconnects and
// deafness.

// Notified wakes the fetcher for a notification about one of its queues,
// and runs the hand-overs first when it announces one. A hand-over, or a
// row given back (announced on the same channel), puts a row behind
// where the claims look: the next claim reads from the queues' start.
func (r *run) Notified(channel, payload string) {
	if !r.wants(payload) {
		return
	}
	if channel == r.s.HandoffChannel {
		r.handoffs.pending.Store(true)
		r.claims.Behind()
	}
	r.wakeFetcher()
}

// Listening runs the hand-overs and claims at once, from the queues'
// start, after a (re)connect: notifications sent while the hub was down
// are lost.
func (r *run) Listening() {
	r.handoffs.pending.Store(true)
	r.claims.Behind()
	r.wakeFetcher()
}

// SetDeaf records whether notifications sent through the pool reach the
// hub, and logs when that changes.
func (r *run) SetDeaf(ctx context.Context, deaf bool, waited time.Duration) {
	if !deaf {
		if r.deaf.Swap(false) {
			r.s.Log.InfoContext(ctx, "outbox: NOTIFY reaches the LISTEN connection again")
		}
		return
	}
	if !r.deaf.Swap(true) {
		r.s.Log.WarnContext(ctx, "outbox: a NOTIFY sent through the pool did not reach the LISTEN connection; "+
			"polling every MinFetchInterval to MaxFetchInterval instead. Through a pooler in transaction mode (PgBouncer) "+
			"LISTEN never hears: give the subscriber a direct session connection (SubscriberConfig.ListenDSN)",
			slog.Duration("waited", waited), slog.Duration("max_fetch_interval", r.s.MaxFetchInterval))
	}
}

// Lost logs that the hub's connection failed.
func (r *run) Lost(ctx context.Context, err error, wait time.Duration) {
	r.s.Log.WarnContext(ctx, "outbox: LISTEN connection lost; polling until it is back",
		slog.Any("error", err), slog.Duration("backoff", wait))
}

// ListenSettings are the subscriber's probe interval and timeout, and
// its MaxFetchInterval.
func (r *run) ListenSettings() (interval, timeout, maxFetch time.Duration) {
	c := r.s
	return c.ListenProbeInterval, c.ListenProbeTimeout, c.MaxFetchInterval
}

// Logger is the subscriber's logger.
func (r *run) Logger() *slog.Logger { return r.s.Log }
