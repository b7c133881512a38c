package outbox

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/internal/engine"
)

// Defaults of [SubscriberConfig].
const (
	WorkersDefault             = 16
	FetchBatchSizeDefault      = 5000
	MinFetchIntervalDefault    = 50 * time.Millisecond
	MaxFetchIntervalDefault    = 5 * time.Second
	LeaseTTLDefault            = 30 * time.Second
	MaxDeliveriesDefault       = 25
	GracefulTimeoutDefault     = 30 * time.Second
	AckBatchSizeDefault        = 1000
	AckLingerDefault           = 5 * time.Millisecond
	ListenProbeIntervalDefault = 30 * time.Second
	ListenProbeTimeoutDefault  = 5 * time.Second
	QueryTimeoutDefault        = 30 * time.Second
	LockWindowDefault          = time.Second
)

// SubscriberConfig configures a [Subscriber]. A nil *SubscriberConfig means
// every default; a zero field means its default.
type SubscriberConfig[T any] struct {
	// Name identifies the subscriber in logs and metric events. Default:
	// the queues, comma-separated.
	Name string

	// Workers is how many handlers run at once. Default: WorkersDefault
	// (16); a transactional subscriber's depends on its pool (see
	// NewTxSubscriber). Run warns once when the pool, beside the
	// connections the running subscribers' claims, outcomes and
	// heartbeats take, has fewer than Workers left for handlers that use
	// it.
	Workers int

	// FetchBatchSize caps the rows one claim takes, and the rows claimed
	// but not yet handed to a worker. Large claims cost the database
	// least per row. A claim by lock (see LockWindow) gives up, when its
	// window ends, the rows no worker has started, so other subscribers
	// can take them; a claim that writes leases holds its rows until its
	// workers reach them, so with slow handlers and several subscribers
	// there a smaller batch shares a backlog more evenly. Default:
	// FetchBatchSizeDefault (5000).
	FetchBatchSize int

	// MinFetchInterval is the first wait after a claim finds nothing; each
	// further empty claim doubles it (with jitter) up to MaxFetchInterval.
	// A NOTIFY cuts the wait short, and it never runs past the earliest
	// scheduled row's due time. Defaults: 50 ms and 5 s.
	MinFetchInterval time.Duration
	// MaxFetchInterval caps the idle wait, and the wait before a failed
	// schema check at start, a failed claim, a failed write of outcomes
	// or of a claim's end (at most 5 s for those two), or a lost LISTEN
	// connection is tried again (at most 30 s), so
	// a subscriber claims again within about MaxFetchInterval of its
	// database's return after an outage or a failover. It also bounds how
	// long a row that landed behind where the subscriber's claims look
	// waits for a claim that reads its queue from the start (see
	// docs/claims.md, "Where claims look"). Default:
	// MaxFetchIntervalDefault (5 s).
	MaxFetchInterval time.Duration

	// LeaseTTL is how long a claim owns a row: the claim, and every
	// heartbeat after it, stamps the row with an expiry LeaseTTL ahead (on
	// the server's clock). Once that expiry passes, any subscriber claims
	// the row again, whatever its own LeaseTTL, and a handler still running
	// here has its context cancelled with cause ErrLeaseLost: a tenth of
	// LeaseTTL (at most 250 ms) before that expiry, counted from the
	// sending of the statement that stamped it, so the handler learns of
	// it before another claim can take the row. Subscribers with different
	// LeaseTTLs can share queues. Default: 30 s.
	LeaseTTL time.Duration

	// HeartbeatInterval is how often the leases of rows whose handlers
	// still run are extended, in one statement. At most LeaseTTL/2, so one
	// late or failed heartbeat does not lose a lease. Default: a third of
	// LeaseTTL. Negative disables heartbeats, so a
	// handler slower than LeaseTTL loses its row.
	HeartbeatInterval time.Duration

	// LockWindow is how long a claim may hold its rows by row lock. A
	// claim takes its rows in a transaction of its own (SELECT ... FOR
	// UPDATE SKIP LOCKED) and writes nothing to them; when their handlers
	// have run, one statement deletes the handled rows and commits. Rows
	// whose handlers are still running LockWindow after the claim get a
	// written lease (LeaseTTL, heartbeats) and the transaction commits, so
	// no claim holds its transaction open longer than about LockWindow.
	// A claim that dies (a crash, a dead connection) writes nothing, and its
	// rows are handed out again LeaseTTL after the claim, as an unextended
	// lease's would be; a subscriber whose connection stalls frees them
	// after LeaseTTL, when the server ends its idle transaction. Each claim in flight holds a pool connection
	// (at most two per subscriber). Default: LockWindowDefault (1 s), at
	// most LeaseTTL/2. Negative: every claim writes a lease on its rows,
	// holding no connection while handlers run; this is also what a
	// subscriber does when the pool has fewer than 4 connections, and
	// after a claim that found fewer than 32 rows, which a claim by lock
	// (a transaction and a record each) would cost more.
	LockWindow time.Duration

	// MaxDeliveries caps the claims of a row, checked before its handler
	// runs: a row claimed more often (its handler keeps crashing the
	// process, say) ends with reason max_deliveries. Default: 25.
	// Negative means no cap.
	MaxDeliveries int

	// Retry decides the delay after a failure. Default: DefaultRetry().
	Retry RetryStrategy

	// Codec decodes payloads. Default: DefaultCodec[T]().
	Codec Codec[T]

	// DisableDeadLetter deletes (and logs) terminal rows instead of moving
	// them to the dead-letter table. Default: false (dead-letter them).
	DisableDeadLetter bool

	// GracefulTimeout bounds everything Run does after its context is
	// done: waiting for running handlers, releasing unstarted rows and
	// writing the last outcomes. Handlers still running then have their
	// context cancelled with cause ErrSubscriberStopped and are abandoned,
	// and outcomes not yet written are given up; their rows keep their
	// leases. Run returns within GracefulTimeout plus StopSlack. Default:
	// 30 s.
	GracefulTimeout time.Duration

	// AckBatchSize and AckLinger batch outcome writes: a batch is written
	// when it holds AckBatchSize outcomes or its first is AckLinger old.
	// Defaults: 1000 and 5 ms.
	AckBatchSize int
	// AckLinger: see AckBatchSize.
	AckLinger time.Duration

	// QueryTimeout bounds each statement the subscriber runs: claims,
	// acknowledgements, retries, dead letters, heartbeats, hand-overs. A
	// statement that exceeds it is abandoned and its connection closed,
	// and the subscriber carries on as after any failed statement, so a
	// connection whose socket stalls (a network partition, a dead
	// middlebox) delays the subscriber by at most QueryTimeout. It must
	// leave room for the slowest honest claim or acknowledgement of a
	// batch. Default: QueryTimeoutDefault (30 s).
	QueryTimeout time.Duration

	// ListenProbeInterval is how often the LISTEN connection is probed with
	// SELECT 1, and ListenProbeTimeout bounds the probe, so a silently dead
	// socket becomes a reconnect. Subscribers that share a LISTEN
	// connection (see ListenDSN) probe it at the shortest of their
	// settings. Defaults: 30 s and 5 s.
	ListenProbeInterval time.Duration
	// ListenProbeTimeout: see ListenProbeInterval.
	ListenProbeTimeout time.Duration

	// ListenDSN connects the LISTEN connection, for setups whose pool goes
	// through a pooler that cannot LISTEN (PgBouncer in transaction mode).
	// The running subscribers of one Outbox with the same ListenDSN share
	// one LISTEN connection. The subscriber checks that a notification
	// sent through its pool reaches the LISTEN connection; when it does
	// not, it logs a warning naming this field and polls. Default: the
	// pool's own connection settings.
	ListenDSN string
	// ListenConnect, when set, opens the LISTEN connection instead; a
	// subscriber with ListenConnect has a LISTEN connection of its own.
	ListenConnect func(ctx context.Context) (*pgx.Conn, error)

	// Metrics receives the subscriber's metric events. Record must not
	// block; a panic in it is recovered and logged. Default: none.
	Metrics MetricsRecorder

	// Observer sees each delivery from before its handler starts (it may
	// give the handler a derived context, e.g. with a span) to the outcome
	// decided when the handler returns. Default: none. contrib/otel's
	// Observer traces deliveries.
	Observer DeliveryObserver

	// Logger receives the subscriber's logs. Default: slog.Default().
	Logger *slog.Logger

	// minLockedClaim is the fewest rows a claim must have found for the
	// next one to claim by lock (see LockWindow); after a smaller claim
	// the next leases. Zero means minLockedClaimDefault; negative, every
	// claim by lock (tests).
	minLockedClaim int
}

// minLockedClaimDefault: claims of fewer rows cost more by lock (a
// transaction and a record each) than by lease.
const minLockedClaimDefault = 32

// resolve returns c with defaults applied, or a *ConfigError naming the
// first field that breaks a rule.
func (c *SubscriberConfig[T]) resolve(queues []string) (SubscriberConfig[T], error) {
	var r SubscriberConfig[T]
	if c != nil {
		r = *c
	}
	set := r.settings()
	if err := set.resolve(queues, c != nil); err != nil {
		return r, err
	}
	r.set(&set)
	if r.Codec == nil {
		r.Codec = DefaultCodec[T]()
	} else if v := reflect.ValueOf(r.Codec); v.Kind() == reflect.Pointer && v.IsNil() {
		return r, &ConfigError{Field: "SubscriberConfig.Codec", Value: fmt.Sprintf("%T(nil)", r.Codec), Rule: "must not be a nil pointer"}
	}
	return r, nil
}

// subscriberSettings are the fields of a SubscriberConfig that do not
// depend on its message type: what resolve checks and defaults, and what
// the engine runs with, compiled once rather than once per message type.
type subscriberSettings struct {
	Name                string
	Workers             int
	FetchBatchSize      int
	MinFetchInterval    time.Duration
	MaxFetchInterval    time.Duration
	LeaseTTL            time.Duration
	HeartbeatInterval   time.Duration
	LockWindow          time.Duration
	MaxDeliveries       int
	Retry               RetryStrategy
	DisableDeadLetter   bool
	GracefulTimeout     time.Duration
	AckBatchSize        int
	AckLinger           time.Duration
	QueryTimeout        time.Duration
	ListenProbeInterval time.Duration
	ListenProbeTimeout  time.Duration
	ListenDSN           string
	ListenConnect       func(ctx context.Context) (*pgx.Conn, error)
	Metrics             MetricsRecorder
	Observer            DeliveryObserver
	Logger              *slog.Logger
	minLockedClaim      int
}

// settings copies c's fields but Codec.
func (c *SubscriberConfig[T]) settings() subscriberSettings {
	return subscriberSettings{
		Name:                c.Name,
		Workers:             c.Workers,
		FetchBatchSize:      c.FetchBatchSize,
		MinFetchInterval:    c.MinFetchInterval,
		MaxFetchInterval:    c.MaxFetchInterval,
		LeaseTTL:            c.LeaseTTL,
		HeartbeatInterval:   c.HeartbeatInterval,
		LockWindow:          c.LockWindow,
		MaxDeliveries:       c.MaxDeliveries,
		Retry:               c.Retry,
		DisableDeadLetter:   c.DisableDeadLetter,
		GracefulTimeout:     c.GracefulTimeout,
		AckBatchSize:        c.AckBatchSize,
		AckLinger:           c.AckLinger,
		QueryTimeout:        c.QueryTimeout,
		ListenProbeInterval: c.ListenProbeInterval,
		ListenProbeTimeout:  c.ListenProbeTimeout,
		ListenDSN:           c.ListenDSN,
		ListenConnect:       c.ListenConnect,
		Metrics:             c.Metrics,
		Observer:            c.Observer,
		Logger:              c.Logger,
		minLockedClaim:      c.minLockedClaim,
	}
}

// set copies r's fields into c, whose Codec it leaves.
func (c *SubscriberConfig[T]) set(r *subscriberSettings) {
	c.Name = r.Name
	c.Workers = r.Workers
	c.FetchBatchSize = r.FetchBatchSize
	c.MinFetchInterval = r.MinFetchInterval
	c.MaxFetchInterval = r.MaxFetchInterval
	c.LeaseTTL = r.LeaseTTL
	c.HeartbeatInterval = r.HeartbeatInterval
	c.LockWindow = r.LockWindow
	c.MaxDeliveries = r.MaxDeliveries
	c.Retry = r.Retry
	c.DisableDeadLetter = r.DisableDeadLetter
	c.GracefulTimeout = r.GracefulTimeout
	c.AckBatchSize = r.AckBatchSize
	c.AckLinger = r.AckLinger
	c.QueryTimeout = r.QueryTimeout
	c.ListenProbeInterval = r.ListenProbeInterval
	c.ListenProbeTimeout = r.ListenProbeTimeout
	c.ListenDSN = r.ListenDSN
	c.ListenConnect = r.ListenConnect
	c.Metrics = r.Metrics
	c.Observer = r.Observer
	c.Logger = r.Logger
	c.minLockedClaim = r.minLockedClaim
}

// resolve applies the defaults to r, and returns a *ConfigError naming
// the first field that breaks a rule. given is whether the caller passed
// a config at all.
func (r *subscriberSettings) resolve(queues []string, given bool) error {
	bad := func(field string, v any, rule string) error {
		return &ConfigError{Field: "SubscriberConfig." + field, Value: fmt.Sprint(v), Rule: rule}
	}
	setInt := func(p *int, def int) { *p = cmp.Or(*p, def) }
	setDur := func(p *time.Duration, def time.Duration) { *p = cmp.Or(*p, def) }
	for _, f := range []struct {
		name string
		v    int
	}{{"Workers", r.Workers}, {"FetchBatchSize", r.FetchBatchSize}, {"AckBatchSize", r.AckBatchSize}} {
		if f.v < 0 {
			return bad(f.name, f.v, "must not be negative")
		}
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{
		{"MinFetchInterval", r.MinFetchInterval}, {"MaxFetchInterval", r.MaxFetchInterval}, {"LeaseTTL", r.LeaseTTL},
		{"GracefulTimeout", r.GracefulTimeout}, {"AckLinger", r.AckLinger},
		{"ListenProbeInterval", r.ListenProbeInterval}, {"ListenProbeTimeout", r.ListenProbeTimeout},
		{"QueryTimeout", r.QueryTimeout},
	} {
		if f.v < 0 {
			return bad(f.name, f.v, "must not be negative")
		}
	}
	if r.Name == "" {
		for i, q := range queues {
			if i > 0 {
				r.Name += ","
			}
			r.Name += q
		}
	}
	setInt(&r.Workers, WorkersDefault)
	setInt(&r.FetchBatchSize, FetchBatchSizeDefault)
	setInt(&r.AckBatchSize, AckBatchSizeDefault)
	setInt(&r.MaxDeliveries, MaxDeliveriesDefault)
	setDur(&r.MinFetchInterval, MinFetchIntervalDefault)
	setDur(&r.MaxFetchInterval, MaxFetchIntervalDefault)
	setDur(&r.LeaseTTL, LeaseTTLDefault)
	setDur(&r.GracefulTimeout, GracefulTimeoutDefault)
	setDur(&r.AckLinger, AckLingerDefault)
	setDur(&r.ListenProbeInterval, ListenProbeIntervalDefault)
	setDur(&r.ListenProbeTimeout, ListenProbeTimeoutDefault)
	setDur(&r.QueryTimeout, QueryTimeoutDefault)
	setDur(&r.HeartbeatInterval, r.LeaseTTL/3)
	setDur(&r.LockWindow, min(LockWindowDefault, r.LeaseTTL/2))
	if !given || r.minLockedClaim == 0 {
		r.minLockedClaim = minLockedClaimDefault
	} else {
		r.minLockedClaim = max(r.minLockedClaim, 0)
	}
	if r.FetchBatchSize > 10000 {
		return bad("FetchBatchSize", r.FetchBatchSize, "must be at most 10000")
	}
	if r.MinFetchInterval > r.MaxFetchInterval {
		return bad("MinFetchInterval", r.MinFetchInterval, fmt.Sprintf("must not exceed MaxFetchInterval (%v)", r.MaxFetchInterval))
	}
	if r.LeaseTTL < time.Second/10 {
		return bad("LeaseTTL", r.LeaseTTL, "must be at least 100ms")
	}
	if r.HeartbeatInterval > 0 && r.HeartbeatInterval > r.LeaseTTL/2 {
		return bad("HeartbeatInterval", r.HeartbeatInterval, fmt.Sprintf("must be at most LeaseTTL/2 (%v), or negative to disable heartbeats", r.LeaseTTL/2))
	}
	if r.LockWindow > r.LeaseTTL/2 {
		return bad("LockWindow", r.LockWindow, fmt.Sprintf("must be at most LeaseTTL/2 (%v), or negative to write leases at every claim", r.LeaseTTL/2))
	}
	if r.ListenProbeTimeout >= r.ListenProbeInterval {
		return bad("ListenProbeTimeout", r.ListenProbeTimeout, fmt.Sprintf("must be below ListenProbeInterval (%v)", r.ListenProbeInterval))
	}
	if r.ListenDSN != "" && r.ListenConnect != nil {
		return bad("ListenDSN", r.ListenDSN, "set ListenDSN or ListenConnect, not both")
	}
	if r.ListenDSN != "" {
		if _, err := pgx.ParseConfig(r.ListenDSN); err != nil {
			return bad("ListenDSN", "(redacted)", "cannot be parsed: "+err.Error())
		}
	}
	if r.Retry == nil {
		r.Retry = DefaultRetry()
	} else if v := reflect.ValueOf(r.Retry); v.Kind() == reflect.Pointer && v.IsNil() {
		return bad("Retry", fmt.Sprintf("%T(nil)", r.Retry), "must not be a nil pointer")
	} else if err := validateRetry(r.Retry, "SubscriberConfig.Retry"); err != nil {
		return err
	} else if e, ok := r.Retry.(*ExponentialRetry); ok {
		d := e.withDefaults() // so Config shows the waits it runs with
		r.Retry = &d
	}
	if r.Logger == nil {
		r.Logger = slog.Default()
	}
	return nil
}

// engine returns what the engine runs for a subscriber of queues on ob
// with c, which is resolved.
func (c *subscriberSettings) engine(ob *Outbox, queues []string) engine.Subscriber {
	s := engine.Subscriber{
		Name: c.Name, Queues: slices.Clone(queues), Workers: c.Workers, FetchBatchSize: c.FetchBatchSize,
		MinFetchInterval: c.MinFetchInterval, MaxFetchInterval: c.MaxFetchInterval,
		LeaseTTL: c.LeaseTTL, HeartbeatInterval: c.HeartbeatInterval, LockWindow: c.LockWindow,
		// Schema 13 on (which Run checks for) has the ring: a subscriber
		// claims from it once its queues use it (claim.RingProbeEvery).
		Ring: true, MaxDeliveries: c.MaxDeliveries, DisableDeadLetter: c.DisableDeadLetter,
		GracefulTimeout: c.GracefulTimeout, AckBatchSize: c.AckBatchSize, AckLinger: c.AckLinger, QueryTimeout: c.QueryTimeout,
		ListenProbeInterval: c.ListenProbeInterval, ListenProbeTimeout: c.ListenProbeTimeout,
		ListenDSN: c.ListenDSN, ListenConnect: c.ListenConnect, MinLockedClaim: c.minLockedClaim,
		Retry: retryOf{c.Retry}, Log: c.Logger.With(slog.String("subscriber", c.Name)),
		Pool: ob.pool, Queries: ob.queries, Hubs: &ob.hubs, Wake: ob.wakeSource(), HandoffChannel: ob.naming.HandoffChannel(),
	}
	if c.Metrics != nil {
		s.Metrics = recorderOf{c.Metrics}
	}
	if c.Observer != nil {
		s.Observer = observerOf{c.Observer}
	}
	return s
}
