// Package wakeup keeps the LISTEN connection that wakes an outbox's
// running subscribers: one connection per outbox and ListenDSN, shared by
// every subscriber that joins it, which fans each notification out to
// the subscribers of its queue, probes the connection, checks that a
// notification sent through the pool reaches it (a pooler in
// transaction mode never delivers), and reconnects. It imports the
// generated queries and dbx; it learns the rest (how to dial, the probe
// channel, how to send a probe) from its Source.
package wakeup

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
)

// Hub keeps one dedicated connection LISTENing on the outbox's
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
type Hub struct {
	hubs    *Hubs
	src     *Source
	key     string // its entry in hubs; "" and shared: none
	shared  bool
	dsn     string
	connect func(context.Context) (*pgx.Conn, error)
	cancel  context.CancelFunc
	done    chan struct{}

	mu      sync.Mutex
	members []Member
	// last are the members' settings when it last had members.
	last settings
	// deaf is set while a notification sent through the pool did not
	// reach the connection; members joining then learn it at once.
	deaf bool
}

// Source is what a hub needs of its outbox.
type Source struct {
	// Dial opens a LISTEN connection: through connect when set, else
	// dsn when set, else with the pool's connection settings.
	Dial func(ctx context.Context, dsn string, connect func(context.Context) (*pgx.Conn, error)) (*pgx.Conn, error)
	// Queries runs the outbox's statements on a connection.
	Queries func(db.DBTX) *db.Queries
	// ProbeChannel is the channel of NOTIFY probes.
	ProbeChannel string
	// SendProbe notifies ProbeChannel through the pool with a payload of
	// its own, and returns it.
	SendProbe func(ctx context.Context) (string, error)
}

// Hubs are an outbox's hubs, by ListenDSN ("" for the pool's settings).
// The zero Hubs is ready to use.
type Hubs struct {
	mu    sync.Mutex
	byDSN map[string]*Hub
}

// Member is a running subscriber as its hub sees it. Its
// methods never block: the listener calls them holding its lock.
type Member interface {
	// Notified handles a notification on a channel of the outbox's.
	Notified(channel, payload string)
	// Listening is told that the connection (re)connected and LISTENs.
	Listening()
	// SetDeaf is told whether notifications sent through the pool reach
	// the connection (false) or not (true); waited is how long the probe
	// waited.
	SetDeaf(ctx context.Context, deaf bool, waited time.Duration)
	// Lost is told that the connection failed, and when it is tried again.
	Lost(ctx context.Context, err error, backoff time.Duration)
	// ListenSettings are the member's probe interval and timeout, and
	// its MaxFetchInterval.
	ListenSettings() (interval, timeout, maxFetch time.Duration)
	// Logger is the member's logger.
	Logger() *slog.Logger
}

// Join adds m to the hub that serves subscribers connecting with dsn (or
// with connect, which gets a hub of its own), starting it when m is its
// first member. Every member must leave it.
func (h *Hubs) Join(ctx context.Context, src *Source, m Member, dsn string, connect func(context.Context) (*pgx.Conn, error)) *Hub {
	h.mu.Lock()
	defer h.mu.Unlock()
	shared := connect == nil
	if l := h.byDSN[dsn]; shared && l != nil {
		l.mu.Lock()
		l.members = append(l.members, m)
		if l.deaf {
			m.SetDeaf(ctx, true, l.settings().timeout)
		}
		l.mu.Unlock()
		return l
	}
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l := &Hub{hubs: h, src: src, key: dsn, shared: shared, dsn: dsn, connect: connect, cancel: cancel,
		done: make(chan struct{}), members: []Member{m}}
	if shared {
		if h.byDSN == nil {
			h.byDSN = map[string]*Hub{}
		}
		h.byDSN[dsn] = l
	}
	go func() {
		defer close(l.done)
		l.run(lctx)
	}()
	return l
}

// Leave removes m from l; the last member to leave stops l and waits
// until its connection is closed.
func (l *Hub) Leave(m Member) {
	h := l.hubs
	h.mu.Lock()
	l.mu.Lock()
	l.members = slices.DeleteFunc(l.members, func(x Member) bool { return x == m })
	last := len(l.members) == 0
	l.mu.Unlock()
	if last && l.shared && h.byDSN[l.key] == l {
		delete(h.byDSN, l.key)
	}
	h.mu.Unlock()
	if last {
		l.cancel()
		<-l.done
	}
}

// settings are what a hub's members ask of it.
type settings struct {
	interval, timeout, maxFetch time.Duration
}

// settings are the shortest of the members' settings, or the last
// members' when none is left. The shortest timeout is below the shortest
// interval, since each member's is below its own. Called with l.mu held.
func (l *Hub) settings() settings {
	for i, m := range l.members {
		iv, to, mf := m.ListenSettings()
		if i == 0 {
			l.last = settings{iv, to, mf}
			continue
		}
		l.last = settings{min(l.last.interval, iv), min(l.last.timeout, to), min(l.last.maxFetch, mf)}
	}
	return l.last
}

// current returns the members' settings now.
func (l *Hub) current() settings {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.settings()
}

// each calls f for every member, holding l's lock.
func (l *Hub) each(f func(Member)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.members {
		f(m)
	}
}

// debug logs msg at debug level through the first member's logger.
func (l *Hub) debug(ctx context.Context, msg string, attrs ...any) {
	l.mu.Lock()
	var log *slog.Logger
	if len(l.members) > 0 {
		log = l.members[0].Logger()
	}
	l.mu.Unlock()
	if log != nil {
		log.DebugContext(ctx, msg, attrs...)
	}
}

func (l *Hub) run(ctx context.Context) {
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
		l.each(func(m Member) { m.Lost(ctx, err, wait) })
		dbx.Sleep(ctx, wait)
	}
}

// listenOnce runs one LISTEN connection until it fails or ctx is done.
func (l *Hub) listenOnce(ctx context.Context) error {
	set := l.current()
	cctx, cancel := context.WithTimeout(ctx, set.timeout)
	conn, err := l.src.Dial(cctx, l.dsn, l.connect)
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
	q := l.src.Queries(dbx.Bounded{Inner: conn, Timeout: set.timeout})
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
	l.each(func(m Member) { m.Listening() })
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
		case err == nil && n.Channel == l.src.ProbeChannel:
			l.probeHeard(ctx, &p, n.Payload)
		case err == nil:
			l.each(func(m Member) { m.Notified(n.Channel, n.Payload) })
		case wctx.Err() != nil:
			if p.payload != "" && !time.Now().Before(p.deadline) {
				l.probeMissed(ctx, &p, set.timeout)
			}
			if _, err := l.src.Queries(dbx.Bounded{Inner: conn, Timeout: set.timeout}).Probe(ctx); err != nil {
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

func (l *Hub) isDeaf() bool {
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
func (l *Hub) sendProbe(ctx context.Context, p *notifyProbe, timeout time.Duration) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	payload, err := l.src.SendProbe(cctx)
	if err != nil {
		if ctx.Err() == nil {
			l.debug(ctx, "outbox: could not send the NOTIFY probe", slog.Any("error", err))
		}
		return
	}
	p.payload, p.deadline = payload, time.Now().Add(timeout)
}

// probeHeard handles a notification on the probe channel.
func (l *Hub) probeHeard(ctx context.Context, p *notifyProbe, payload string) {
	if payload != p.payload {
		return // another listener's or Health's
	}
	p.payload = ""
	l.setDeaf(ctx, false, 0)
}

// probeMissed handles a probe that did not arrive in time.
func (l *Hub) probeMissed(ctx context.Context, p *notifyProbe, waited time.Duration) {
	p.payload = ""
	l.setDeaf(ctx, true, waited)
}

func (l *Hub) setDeaf(ctx context.Context, deaf bool, waited time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deaf = deaf
	for _, m := range l.members {
		m.SetDeaf(ctx, deaf, waited)
	}
}
