package outbox

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/internal/dbx"
)

// listenHub keeps one dedicated connection LISTENing on the outbox's
// channels for every running subscriber of one Outbox that connects it
// alike (the same SubscriberConfig.ListenDSN, or none), and hands each
// notification to the subscribers of its queue. The first subscriber's
// Run starts it; it stops when the last one's Run stops. A subscriber
// with a ListenConnect function has a listener of its own, since two
// functions cannot be told to connect alike.
//
// It probes the connection with a bounded SELECT 1 every
// ListenProbeInterval (the shortest of its subscribers'), so a silently
// dead socket turns into a reconnect instead of subscribers that only
// poll. While it is down, the subscribers keep polling; after every
// (re)connect it wakes each of them once, since notifications sent while
// it was down are lost (so they also complete any recorded hand-overs of
// ordering keys).
type listenHub struct {
	ob      *Outbox
	key     string // its entry in ob's listeners; "" and shared: none
	shared  bool
	dsn     string
	connect func(context.Context) (*pgx.Conn, error)
	cancel  context.CancelFunc
	done    chan struct{}

	mu      sync.Mutex
	members []listenMember
	// deaf is set while a notification sent through the pool did not
	// reach the connection; members joining then learn it at once.
	deaf bool
}

// listenMember is a running subscriber as its listener sees it. Its
// methods never block: the listener calls them holding its lock.
type listenMember interface {
	// notified handles a notification on a channel of the outbox's.
	notified(channel, payload string)
	// listening is told that the connection (re)connected and LISTENs.
	listening()
	// setDeaf is told whether notifications sent through the pool reach
	// the connection (false) or not (true); waited is how long the probe
	// waited.
	setDeaf(ctx context.Context, deaf bool, waited time.Duration)
	// lost is told that the connection failed, and when it is tried again.
	lost(ctx context.Context, err error, backoff time.Duration)
	// listenSettings are the member's probe interval and timeout, and
	// its MaxFetchInterval.
	listenSettings() (interval, timeout, maxFetch time.Duration)
	// logger is the member's logger.
	logger() *slog.Logger
}

// joinListener adds m to the listener that serves subscribers connecting
// with dsn (or with connect, which gets a listener of its own), starting
// it when m is its first member. Every member must leave it.
func (o *Outbox) joinListener(ctx context.Context, m listenMember, dsn string, connect func(context.Context) (*pgx.Conn, error)) *listenHub {
	o.listenMu.Lock()
	defer o.listenMu.Unlock()
	shared := connect == nil
	if l := o.listeners[dsn]; shared && l != nil {
		l.mu.Lock()
		l.members = append(l.members, m)
		if l.deaf {
			m.setDeaf(ctx, true, l.settings().timeout)
		}
		l.mu.Unlock()
		return l
	}
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l := &listenHub{ob: o, key: dsn, shared: shared, dsn: dsn, connect: connect, cancel: cancel,
		done: make(chan struct{}), members: []listenMember{m}}
	if shared {
		if o.listeners == nil {
			o.listeners = map[string]*listenHub{}
		}
		o.listeners[dsn] = l
	}
	go func() {
		defer close(l.done)
		l.run(lctx)
	}()
	return l
}

// leave removes m from l; the last member to leave stops l and waits
// until its connection is closed.
func (l *listenHub) leave(m listenMember) {
	o := l.ob
	o.listenMu.Lock()
	l.mu.Lock()
	l.members = slices.DeleteFunc(l.members, func(x listenMember) bool { return x == m })
	last := len(l.members) == 0
	l.mu.Unlock()
	if last && l.shared && o.listeners[l.key] == l {
		delete(o.listeners, l.key)
	}
	o.listenMu.Unlock()
	if last {
		l.cancel()
		<-l.done
	}
}

// listenSettings are what a listener's members ask of it.
type listenSettings struct {
	interval, timeout, maxFetch time.Duration
}

// settings are the shortest of the members' settings. The shortest
// timeout is below the shortest interval, since each member's is below
// its own. Called with l.mu held.
func (l *listenHub) settings() listenSettings {
	s := listenSettings{ListenProbeIntervalDefault, ListenProbeTimeoutDefault, MaxFetchIntervalDefault}
	for i, m := range l.members {
		iv, to, mf := m.listenSettings()
		if i == 0 {
			s = listenSettings{iv, to, mf}
			continue
		}
		s.interval, s.timeout, s.maxFetch = min(s.interval, iv), min(s.timeout, to), min(s.maxFetch, mf)
	}
	return s
}

// current returns the members' settings now.
func (l *listenHub) current() listenSettings {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.settings()
}

// each calls f for every member, holding l's lock.
func (l *listenHub) each(f func(listenMember)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.members {
		f(m)
	}
}

// debug logs msg at debug level through the first member's logger.
func (l *listenHub) debug(ctx context.Context, msg string, attrs ...any) {
	l.mu.Lock()
	var log *slog.Logger
	if len(l.members) > 0 {
		log = l.members[0].logger()
	}
	l.mu.Unlock()
	if log != nil {
		log.DebugContext(ctx, msg, attrs...)
	}
}

func (l *listenHub) run(ctx context.Context) {
	// Reconnected at least every MaxFetchInterval, as the fetchers retry
	// their claims.
	errs := dbx.Backoff{Base: 100 * time.Millisecond, Max: min(30*time.Second, l.current().maxFetch)}
	for ctx.Err() == nil {
		err := l.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		errs.Max = min(30*time.Second, l.current().maxFetch)
		wait := errs.Next()
		l.each(func(m listenMember) { m.lost(ctx, err, wait) })
		dbx.Sleep(ctx, wait)
	}
}

// listenOnce runs one LISTEN connection until it fails or ctx is done.
func (l *listenHub) listenOnce(ctx context.Context) error {
	set := l.current()
	cctx, cancel := context.WithTimeout(ctx, set.timeout)
	conn, err := dialListener(cctx, l.ob, l.dsn, l.connect)
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
	q := l.ob.queries(dbx.Bounded{Inner: conn, Timeout: set.timeout})
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
	l.each(func(m listenMember) { m.listening() })
	var p notifyProbe
	l.sendProbe(ctx, &p, set.timeout)
	for {
		set = l.current()
		wait := set.interval
		if p.payload != "" {
			wait = min(wait, max(time.Until(p.deadline), 0))
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil && n.Channel == l.ob.naming.probeChannel():
			l.probeHeard(ctx, &p, n.Payload)
		case err == nil:
			l.each(func(m listenMember) { m.notified(n.Channel, n.Payload) })
		case wctx.Err() != nil:
			if p.payload != "" && !time.Now().Before(p.deadline) {
				l.probeMissed(ctx, &p, set.timeout)
			}
			if _, err := l.ob.queries(dbx.Bounded{Inner: conn, Timeout: set.timeout}).Probe(ctx); err != nil {
				return err
			}
			if p.payload == "" && l.isDeaf() {
				l.sendProbe(ctx, &p, set.timeout) // check again every ListenProbeInterval
			}
		default:
			return err
		}
	}
}

func (l *listenHub) isDeaf() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deaf
}

// notifyProbe checks that a notification sent through the pool reaches
// the LISTEN connection: through a pooler in transaction mode (PgBouncer)
// LISTEN succeeds but never hears anything.
type notifyProbe struct {
	payload  string // the probe in flight; empty when none is
	deadline time.Time
}

// sendProbe notifies the probe channel through the pool.
func (l *listenHub) sendProbe(ctx context.Context, p *notifyProbe, timeout time.Duration) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	payload, err := l.ob.sendProbe(cctx)
	if err != nil {
		if ctx.Err() == nil {
			l.debug(ctx, "outbox: could not send the NOTIFY probe", slog.Any("error", err))
		}
		return
	}
	p.payload, p.deadline = payload, time.Now().Add(timeout)
}

// probeHeard handles a notification on the probe channel.
func (l *listenHub) probeHeard(ctx context.Context, p *notifyProbe, payload string) {
	if payload != p.payload {
		return // another listener's or Health's
	}
	p.payload = ""
	l.setDeaf(ctx, false, 0)
}

// probeMissed handles a probe that did not arrive in time.
func (l *listenHub) probeMissed(ctx context.Context, p *notifyProbe, waited time.Duration) {
	p.payload = ""
	l.setDeaf(ctx, true, waited)
}

func (l *listenHub) setDeaf(ctx context.Context, deaf bool, waited time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deaf = deaf
	for _, m := range l.members {
		m.setDeaf(ctx, deaf, waited)
	}
}

// The run of a subscriber is its listener's member.

func (r *run) notified(channel, payload string) {
	if !r.wants(payload) {
		return
	}
	if channel == r.s.ob.naming.handoffChannel() {
		r.handoffs.pending.Store(true)
	}
	r.wakeFetcher()
}

func (r *run) listening() {
	r.handoffs.pending.Store(true)
	r.wakeFetcher()
}

func (r *run) setDeaf(ctx context.Context, deaf bool, waited time.Duration) {
	if !deaf {
		if r.deaf.Swap(false) {
			r.s.log.InfoContext(ctx, "outbox: NOTIFY reaches the LISTEN connection again")
		}
		return
	}
	if !r.deaf.Swap(true) {
		r.s.log.WarnContext(ctx, "outbox: a NOTIFY sent through the pool did not reach the LISTEN connection; "+
			"polling every MinFetchInterval to MaxFetchInterval instead. Through a pooler in transaction mode (PgBouncer) "+
			"LISTEN never hears: give the subscriber a direct session connection (SubscriberConfig.ListenDSN)",
			slog.Duration("waited", waited), slog.Duration("max_fetch_interval", r.s.cfg.MaxFetchInterval))
	}
}

func (r *run) lost(ctx context.Context, err error, wait time.Duration) {
	r.s.log.WarnContext(ctx, "outbox: LISTEN connection lost; polling until it is back",
		slog.Any("error", err), slog.Duration("backoff", wait))
}

func (r *run) listenSettings() (interval, timeout, maxFetch time.Duration) {
	c := &r.s.cfg
	return c.ListenProbeInterval, c.ListenProbeTimeout, c.MaxFetchInterval
}

func (r *run) logger() *slog.Logger { return r.s.log }
