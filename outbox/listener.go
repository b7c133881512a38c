package outbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// listen keeps a dedicated connection LISTENing on the outbox's channels
// and wakes the fetcher on every notification for our queues. It probes
// the connection with a bounded SELECT 1 every ListenProbeInterval, so a
// silently dead socket turns into a reconnect instead of a subscriber that
// only polls. While it is down, the fetcher keeps polling; after every
// (re)connect it wakes the fetcher once, since notifications sent while it
// was down are lost (so it also has the fetcher complete any recorded
// hand-overs of ordering keys).
func (r *run[T]) listen(ctx context.Context) {
	// Reconnected at least every MaxFetchInterval, as the fetcher
	// retries its claims.
	errs := backoff{base: 100 * time.Millisecond, max: min(30*time.Second, r.s.cfg.MaxFetchInterval)}
	for ctx.Err() == nil {
		err := r.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		wait := errs.next()
		r.s.log.WarnContext(ctx, "outbox: LISTEN connection lost; polling until it is back",
			slog.Any("error", err), slog.Duration("backoff", wait))
		sleep(ctx, wait)
	}
}

func (r *run[T]) connectListener(ctx context.Context) (*pgx.Conn, error) {
	return dialListener(ctx, r.s.ob, r.s.cfg.ListenDSN, r.s.cfg.ListenConnect)
}

// listenOnce runs one LISTEN connection until it fails or ctx is done.
func (r *run[T]) listenOnce(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, r.s.cfg.ListenProbeTimeout)
	conn, err := r.connectListener(cctx)
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	// Every statement on it is bounded like the probe, so a stalled
	// socket during LISTEN is noticed too.
	q := r.s.ob.queries(boundedDBTX{inner: conn, timeout: r.s.cfg.ListenProbeTimeout})
	if err := q.KeepListening(ctx); err != nil {
		return err
	}
	if err := q.Listen(ctx); err != nil {
		return err
	}
	if err := q.ListenScheduled(ctx); err != nil {
		return err
	}
	if err := q.ListenHandoff(ctx); err != nil {
		return err
	}
	if err := q.ListenProbe(ctx); err != nil {
		return err
	}
	r.handoffs.pending.Store(true)
	r.wakeFetcher()
	var p notifyProbe
	r.sendProbe(ctx, &p)
	for {
		wait := r.s.cfg.ListenProbeInterval
		if p.payload != "" {
			wait = min(wait, max(time.Until(p.deadline), 0))
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil && n.Channel == r.s.ob.naming.probeChannel():
			r.probeHeard(ctx, &p, n.Payload)
		case err == nil:
			if r.wants(n.Payload) {
				if n.Channel == r.s.ob.naming.handoffChannel() {
					r.handoffs.pending.Store(true)
				}
				r.wakeFetcher()
			}
		case wctx.Err() != nil:
			if p.payload != "" && !time.Now().Before(p.deadline) {
				r.probeMissed(ctx, &p)
			}
			if _, err := q.Probe(ctx); err != nil {
				return err
			}
			if p.payload == "" && r.deaf.Load() {
				r.sendProbe(ctx, &p) // check again every ListenProbeInterval
			}
		default:
			return err
		}
	}
}

// notifyProbe checks that a notification sent through the pool reaches
// the LISTEN connection: through a pooler in transaction mode (PgBouncer)
// LISTEN succeeds but never hears anything.
type notifyProbe struct {
	payload  string // the probe in flight; empty when none is
	deadline time.Time
}

// sendProbe notifies the probe channel through the pool.
func (r *run[T]) sendProbe(ctx context.Context, p *notifyProbe) {
	cctx, cancel := context.WithTimeout(ctx, r.s.cfg.ListenProbeTimeout)
	defer cancel()
	payload, err := r.s.ob.sendProbe(cctx)
	if err != nil {
		if ctx.Err() == nil {
			r.s.log.DebugContext(ctx, "outbox: could not send the NOTIFY probe", slog.Any("error", err))
		}
		return
	}
	p.payload, p.deadline = payload, time.Now().Add(r.s.cfg.ListenProbeTimeout)
}

// probeHeard handles a notification on the probe channel.
func (r *run[T]) probeHeard(ctx context.Context, p *notifyProbe, payload string) {
	if payload != p.payload {
		return // another subscriber's or Health's
	}
	p.payload = ""
	if r.deaf.Swap(false) {
		r.s.log.InfoContext(ctx, "outbox: NOTIFY reaches the LISTEN connection again")
	}
}

// probeMissed handles a probe that did not arrive in time.
func (r *run[T]) probeMissed(ctx context.Context, p *notifyProbe) {
	p.payload = ""
	if !r.deaf.Swap(true) {
		r.s.log.WarnContext(ctx, "outbox: a NOTIFY sent through the pool did not reach the LISTEN connection; "+
			"polling every MinFetchInterval to MaxFetchInterval instead. Through a pooler in transaction mode (PgBouncer) "+
			"LISTEN never hears: give the subscriber a direct session connection (SubscriberConfig.ListenDSN)",
			slog.Duration("waited", r.s.cfg.ListenProbeTimeout), slog.Duration("max_fetch_interval", r.s.cfg.MaxFetchInterval))
	}
}
