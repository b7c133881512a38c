package engine

import (
	"context"
	"log/slog"
	"time"
)

// The run of a subscriber is its listener's member.

func (r *run) Notified(channel, payload string) {
	if !r.wants(payload) {
		return
	}
	if channel == r.s.HandoffChannel {
		r.handoffs.pending.Store(true)
	}
	r.wakeFetcher()
}

func (r *run) Listening() {
	r.handoffs.pending.Store(true)
	r.wakeFetcher()
}

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

func (r *run) Lost(ctx context.Context, err error, wait time.Duration) {
	r.s.Log.WarnContext(ctx, "outbox: LISTEN connection lost; polling until it is back",
		slog.Any("error", err), slog.Duration("backoff", wait))
}

func (r *run) ListenSettings() (interval, timeout, maxFetch time.Duration) {
	c := r.s
	return c.ListenProbeInterval, c.ListenProbeTimeout, c.MaxFetchInterval
}

func (r *run) Logger() *slog.Logger { return r.s.Log }
