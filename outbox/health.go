package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
)

// HealthOptions configures [Outbox.Health]. A nil *HealthOptions means
// every default.
type HealthOptions struct {
	// ListenDSN and ListenConnect open the connection the NOTIFY probe
	// listens on, as SubscriberConfig's fields of the same names do for a
	// subscriber: pass the subscriber's, so the probe tests its path.
	// Default: the pool's own connection settings.
	ListenDSN     string
	ListenConnect func(ctx context.Context) (*pgx.Conn, error)
	// NotifyTimeout bounds the wait for the probe's notification, from
	// when it is sent. Connecting the LISTEN connection, LISTEN and the
	// NOTIFY itself have 10 s of their own, so that a busy server slow
	// to answer them is not taken for one whose notifications never
	// arrive. Default: 2 s.
	NotifyTimeout time.Duration
	// The thresholds past which a condition is a problem; zero means the
	// default of the same name (HealthNotifyQueueUsage, ...).
	NotifyQueueUsage float64
	XminAge          int64
	XminDuration     time.Duration
	XidAge           int64
	DeadTuples       int64
	RingStuck        time.Duration
	ReadyWait        time.Duration
	Unclaimed        time.Duration
}

// withDefaults fills every zero field of o with its default.
func (o HealthOptions) withDefaults() HealthOptions {
	if o.NotifyTimeout <= 0 {
		o.NotifyTimeout = 2 * time.Second
	}
	if o.NotifyQueueUsage <= 0 {
		o.NotifyQueueUsage = HealthNotifyQueueUsage
	}
	if o.XminAge <= 0 {
		o.XminAge = HealthXminAge
	}
	if o.XminDuration <= 0 {
		o.XminDuration = HealthXminDuration
	}
	if o.XidAge <= 0 {
		o.XidAge = HealthXidAge
	}
	if o.DeadTuples <= 0 {
		o.DeadTuples = HealthDeadTuples
	}
	if o.RingStuck <= 0 {
		o.RingStuck = HealthRingStuck
	}
	if o.ReadyWait <= 0 {
		o.ReadyWait = HealthReadyWait
	}
	if o.Unclaimed <= 0 {
		o.Unclaimed = HealthUnclaimed
	}
	return o
}

// Default thresholds past which [Outbox.Health] reports a problem.
const (
	// HealthNotifyQueueUsage: writers stop notifying at half, and a full
	// queue fails every notifying transaction at commit.
	HealthNotifyQueueUsage = 0.25
	// HealthXminAge and HealthXminDuration: a snapshot horizon this old
	// (in transactions), or a transaction open this long, keeps every row
	// deleted since in the outbox's table and indexes.
	HealthXminAge      = 10_000_000
	HealthXminDuration = 10 * time.Minute
	// HealthXidAge: the outbox table's oldest unfrozen row is this old (in
	// transactions); at about 2 billion the server stops writing.
	HealthXidAge = 1_000_000_000
	// HealthDeadTuples: dead row versions past this many, and more than
	// the live ones, slow every claim that scans past them.
	HealthDeadTuples = 100_000
	// HealthRingStuck: writers have written into one partition of the log
	// tier's ring this long, and the next is not yet empty, so they cannot
	// move on (a subscriber's turn moves them every 10 s when it can).
	HealthRingStuck = 5 * time.Minute
	// HealthReadyWait: a queue's oldest ready row (due, not leased, not
	// behind its key) has waited this long: its subscribers fall behind,
	// are stuck, or do not run. Paused queues are left out.
	HealthReadyWait = 5 * time.Minute
	// HealthUnclaimed: a queue has had a ready row this long and no
	// running subscriber of it has a presence record (schema 14): nobody
	// claims it. Paused queues are left out.
	HealthUnclaimed = time.Minute
)

// healthDepthCap is where Health's counts of each queue's rows stop: it
// reads them to judge the queues' waits, and must stay cheap.
const healthDepthCap = 1000

// Health is what [Outbox.Health] found: the conditions that break
// PostgreSQL queues in production.
type Health struct {
	// SchemaVersion is the schema's version (0: no outbox table), and
	// LibraryVersion the version this library needs.
	SchemaVersion, LibraryVersion int64
	// NotifyHeard reports that a notification sent through the pool was
	// heard on a LISTEN connection within NotifyTimeout, and NotifyTook
	// how long it took. A pooler in transaction mode (PgBouncer) passes
	// LISTEN but never delivers its notifications; subscribers then find
	// rows only by polling. NotifyError is why the probe could not run.
	NotifyHeard bool
	NotifyTook  time.Duration
	NotifyError string
	// NotificationQueueUsage is pg_notification_queue_usage(), 0 to 1.
	NotificationQueueUsage float64
	// OldestXmin is what holds back vacuum in the cluster, if anything.
	OldestXmin *XminHolder
	// LiveTuples and DeadTuples count the outbox table's row versions (the
	// statistics collector's estimates), SinceVacuum is the time since it
	// was last vacuumed (-1: never), and XidAge the age in transactions of
	// its oldest unfrozen row.
	LiveTuples, DeadTuples int64
	SinceVacuum            time.Duration
	XidAge                 int64
	// Ring is the state of the log tier's ring beside the outbox table;
	// nil when it has none.
	Ring *RingHealth
	// Paused lists the paused queues ([Outbox.PauseQueue]); a pause is
	// an operator's choice, not a problem. Empty before schema 14.
	Paused []QueuePause
	// Queues are the queues' depths, each count stopping at 1,000 (see
	// [Outbox.QueueDepths]), and Subscribers the running subscribers'
	// presence records ([Outbox.Subscribers]): a queue whose oldest ready
	// row has waited ReadyWait, or that has ready rows and no running
	// subscriber for Unclaimed, is a problem. Empty before schema 14.
	Queues      []QueueDepth
	Subscribers []SubscriberInfo
	// Problems names each condition past its threshold, with its fix; empty
	// when all is well.
	Problems []string
}

// XminHolder is a session, replication slot or prepared transaction that
// holds back vacuum.
type XminHolder struct {
	// Kind is "session", "replication slot" or "prepared transaction".
	Kind string
	// Name identifies it: "pid 123 (user, application)", the slot's name,
	// or the prepared transaction's gid.
	Name string
	// Age is its snapshot horizon's age in transactions.
	Age int64
	// Open is how long its transaction has been open (sessions and
	// prepared transactions).
	Open time.Duration
	// State is a session's state (e.g. "idle in transaction"), a slot's
	// "active" or "inactive", or "prepared".
	State string
	// Hidden is true for a session of another role whose activity the
	// role Health connects as may not read (it has neither that role's
	// privileges nor pg_read_all_stats): its Open and State are unknown
	// and read as zero, and Health judges it on its Age alone. Grant
	// pg_read_all_stats to the role Health connects as to judge it on
	// how long it has been open too.
	Hidden bool
}

// RingHealth is the state of the log tier's ring beside an outbox table:
// writers write into one of its partitions until a subscriber's turn
// moves them on to the next, which it may once every lane has read that
// one past and it has been emptied.
type RingHealth struct {
	// Partition is the partition writers write into, and WritingFor how
	// long since they moved there.
	Partition  int
	WritingFor time.Duration
	// NextEmptied reports that the next partition is empty, so that a
	// turn may move writers on to it.
	NextEmptied bool
	// Behind lists the lanes that have not read the next partition past
	// (at most five, the longest waiting first), and Locks the sessions
	// that hold a lock on it, which keeps a turn from emptying it: an open
	// writer of it, a pg_dump, a transaction that read it. Both are read
	// only while it is not emptied. Behind is empty, with BehindUnread
	// set, when a session held the partition exclusively for a second.
	Behind       []RingLaneBehind
	BehindUnread bool
	Locks        []RingLockHolder
}

// RingLaneBehind is a lane of the ring that has not read a partition past.
type RingLaneBehind struct {
	// Queue and Lane name the lane.
	Queue string
	Lane  int
	// Waiting is the age of its first row there that it has not consumed.
	Waiting time.Duration
}

// RingLockHolder is a session that holds a lock on a partition of the
// ring.
type RingLockHolder struct {
	// Name identifies it: "pid 123 (user, application)".
	Name string
	// Modes are the locks it holds on the partition (AccessShareLock: a
	// reader such as pg_dump; RowExclusiveLock: a writer).
	Modes string
	// Open is how long its transaction has been open, and State its
	// state; unknown (zero) when Hidden, as for XminHolder.
	Open   time.Duration
	State  string
	Hidden bool
}

// Health reads the outbox's health: its schema version, whether NOTIFY
// reaches a LISTEN connection, the server's notification queue, what
// holds back vacuum, and the table's dead rows and transaction-id age. It
// fails only when the database cannot be queried; what it finds wrong is
// in Health.Problems. It runs a few catalog queries and one notification:
// cheap enough for a health endpoint polled every few seconds.
func (o *Outbox) Health(ctx context.Context, opts *HealthOptions) (Health, error) {
	var opt HealthOptions
	if opts != nil {
		opt = *opts
	}
	opt = opt.withDefaults()
	h := Health{LibraryVersion: o.latest}
	v, err := o.SchemaVersion(ctx)
	if err != nil {
		return h, wrapOp("Health", err)
	}
	h.SchemaVersion = v
	q := o.queries(o.pool)
	t, err := q.TableHealth(ctx, o.naming.Qualified(o.naming.Table))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return h, wrapOp("Health", err)
	default:
		h.LiveTuples, h.DeadTuples, h.XidAge = t.LiveTuples, t.DeadTuples, t.XidAge
		h.SinceVacuum = -1
		if t.SinceVacuumSeconds >= 0 {
			h.SinceVacuum = dbx.Seconds(t.SinceVacuumSeconds)
		}
		h.NotificationQueueUsage = t.NotificationQueueUsage
	}
	holders, err := q.OldestXmin(ctx)
	if err != nil {
		return h, wrapOp("Health", err)
	}
	if len(holders) > 0 {
		x := holders[0]
		h.OldestXmin = &XminHolder{Kind: x.Kind, Name: x.Name, Age: x.XminAge, Open: dbx.Seconds(x.XactSeconds), State: x.State, Hidden: x.Hidden}
	}
	if h.Ring, err = o.ringHealth(ctx); err != nil {
		return h, wrapOp("Health", err)
	}
	if v >= pausesSchema {
		if h.Paused, err = o.PausedQueues(ctx); err != nil {
			return h, wrapOp("Health", err)
		}
		if h.Queues, err = o.QueueDepths(ctx, &DepthOptions{Cap: healthDepthCap}); err != nil {
			return h, wrapOp("Health", err)
		}
		if h.Subscribers, err = o.Subscribers(ctx); err != nil {
			return h, wrapOp("Health", err)
		}
	}
	h.NotifyTook, err = o.probeNotify(ctx, &opt)
	h.NotifyHeard = err == nil
	if err != nil {
		h.NotifyError = err.Error()
	}
	h.Problems = h.problems(o, &opt)
	return h, nil
}

// ringHealth reads the state of the ring beside the outbox table (nil
// without one), in a read-only transaction of its own: where writers
// write, and, when the next partition is not emptied, what keeps it.
func (o *Outbox) ringHealth(ctx context.Context) (h *RingHealth, err error) {
	q := o.queries(o.pool)
	present, err := q.RingPresent(ctx)
	if err != nil || !present {
		return nil, err
	}
	tx, err := o.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	q = o.queries(tx)
	if err := q.RingHealthSettings(ctx); err != nil {
		return nil, err
	}
	st, err := q.RingTurnState(ctx)
	if err != nil {
		return nil, err
	}
	h = &RingHealth{Partition: int(st.Slot), WritingFor: dbx.Seconds(st.AgeSeconds), NextEmptied: st.NextOpen}
	if st.NextOpen {
		return h, nil
	}
	next := (st.Slot + 1) % 4
	locks, err := q.RingPartitionLocks(ctx, next)
	if err != nil {
		return nil, err
	}
	for _, l := range locks {
		h.Locks = append(h.Locks, RingLockHolder{Name: l.Name, Modes: l.Modes, Open: dbx.Seconds(l.XactSeconds), State: l.State, Hidden: l.Hidden})
	}
	behind, err := q.RingLanesBehind(ctx, db.RingLanesBehindParams{Slot: next, MaxRows: 5})
	switch {
	case dbx.SQLState(err) == "55P03": // lock_not_available (lock_timeout)
		h.BehindUnread = true
	case err != nil:
		return nil, err
	}
	for _, b := range behind {
		h.Behind = append(h.Behind, RingLaneBehind{Queue: b.Queue, Lane: int(b.Lane), Waiting: dbx.Seconds(b.AgeSeconds)})
	}
	return h, nil
}

// errNotHeard is the NOTIFY probe's failure when the listener heard nothing.
var errNotHeard = errors.New("the LISTEN connection heard nothing")

// notifySetupTimeout bounds what the NOTIFY probe does before it waits:
// connecting its LISTEN connection, LISTEN and NOTIFY.
const notifySetupTimeout = 10 * time.Second

// probeNotify listens on the probe channel, sends a notification through
// the pool and waits for it, and returns how long it took.
func (o *Outbox) probeNotify(ctx context.Context, opt *HealthOptions) (time.Duration, error) {
	sctx, cancelSetup := context.WithTimeout(ctx, notifySetupTimeout)
	defer cancelSetup()
	conn, err := dialListener(sctx, o, opt.ListenDSN, opt.ListenConnect)
	if err != nil {
		return 0, fmt.Errorf("connecting the LISTEN connection: %w", err)
	}
	defer func() {
		c, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(c)
	}()
	if err := o.queries(conn).ListenProbe(sctx); err != nil {
		return 0, fmt.Errorf("LISTEN: %w", err)
	}
	start := time.Now()
	payload, err := o.sendProbe(sctx)
	if err != nil {
		return 0, fmt.Errorf("NOTIFY: %w", err)
	}
	cctx, cancel := context.WithDeadline(ctx, start.Add(opt.NotifyTimeout))
	defer cancel()
	for {
		n, err := conn.WaitForNotification(cctx)
		if err != nil {
			if cctx.Err() != nil && ctx.Err() == nil {
				return 0, fmt.Errorf("%w within %v", errNotHeard, opt.NotifyTimeout)
			}
			return 0, err
		}
		if n.Payload == payload {
			return time.Since(start), nil
		}
	}
}

// problems lists what h found past its thresholds.
func (h *Health) problems(o *Outbox, opt *HealthOptions) []string {
	var out []string
	table := o.naming.Qualified(o.naming.Table)
	if e := o.schemaMismatch(h.SchemaVersion); e != nil {
		out = append(out, strings.TrimPrefix(e.Error(), "outbox: "))
	}
	if !h.NotifyHeard {
		out = append(out, fmt.Sprintf("NOTIFY did not reach a LISTEN connection within %v (%s): subscribers find rows only by polling; "+
			"through a pooler in transaction mode (PgBouncer) LISTEN never hears, so give subscribers a direct session connection (SubscriberConfig.ListenDSN)",
			opt.NotifyTimeout, h.NotifyError))
	}
	if h.NotificationQueueUsage >= opt.NotifyQueueUsage {
		out = append(out, fmt.Sprintf("the server's notification queue is %.0f%% full (a session LISTENs and does not read): "+
			"writers stop notifying at 50%%, and a full queue fails every notifying transaction at commit", 100*h.NotificationQueueUsage))
	}
	// A hidden holder's open time is unknown: it is judged on its age.
	if x := h.OldestXmin; x != nil && (x.Age >= opt.XminAge || x.Open >= opt.XminDuration) {
		out = append(out, fmt.Sprintf("%s %s (%s) holds back vacuum: its horizon is %d transactions old, open for %v; "+
			"rows deleted since stay in the outbox's table and indexes until it ends", x.Kind, x.Name, x.State, x.Age, x.Open.Round(time.Second)))
	}
	if h.XidAge >= opt.XidAge {
		out = append(out, fmt.Sprintf("%s's oldest unfrozen row is %d transactions old: vacuum it (VACUUM FREEZE) before the server refuses writes near 2 billion",
			table, h.XidAge))
	}
	if h.DeadTuples >= opt.DeadTuples && h.DeadTuples > h.LiveTuples {
		out = append(out, fmt.Sprintf("%s holds %d dead row versions and %d live ones: check that autovacuum runs on it and that nothing holds back vacuum",
			table, h.DeadTuples, h.LiveTuples))
	}
	if r := h.Ring; r != nil && !r.NextEmptied && r.WritingFor >= opt.RingStuck {
		out = append(out, r.problem(o.naming.Qualified(o.naming.Table+"_ring")))
	}
	return append(out, h.waits(opt)...)
}

// waits are the problems of queues whose ready rows wait: for ReadyWait,
// or for Unclaimed with no running subscriber of theirs. Paused queues
// wait by choice.
func (h *Health) waits(opt *HealthOptions) []string {
	var out []string
	for _, d := range h.Queues {
		if d.Ready == 0 || slices.ContainsFunc(h.Paused, func(p QueuePause) bool { return p.Queue == d.Queue }) {
			continue
		}
		claimed := slices.ContainsFunc(h.Subscribers, func(s SubscriberInfo) bool { return !s.Gone && slices.Contains(s.Queues, d.Queue) })
		ready := fmt.Sprint(d.Ready)
		if d.Ready >= healthDepthCap {
			ready = fmt.Sprintf("%d or more", healthDepthCap)
		}
		switch {
		case !claimed && d.OldestReadyWait >= opt.Unclaimed:
			out = append(out, fmt.Sprintf("queue %q has ready rows (%s), the oldest waiting %v, and no running subscriber of it has shown itself "+
				"for %v (outboxgen subscribers): start its subscribers, or check that they reach the database", d.Queue, ready,
				roundWait(d.OldestReadyWait), 3*SubscriberPresenceInterval))
		case d.OldestReadyWait >= opt.ReadyWait:
			out = append(out, fmt.Sprintf("queue %q's oldest ready row has waited %v (ready rows: %s): its subscribers fall behind or are stuck; "+
				"see outboxgen subscribers (busy workers, last claim) and outboxgen inspect", d.Queue, roundWait(d.OldestReadyWait), ready))
		}
	}
	return out
}

// problem says why the ring cannot turn, and what to do.
func (r *RingHealth) problem(ring string) string {
	var why []string
	for _, b := range r.Behind {
		why = append(why, fmt.Sprintf("lane %d of queue %q has not read it (its first row there waits for %v)", b.Lane, b.Queue, b.Waiting.Round(time.Second)))
	}
	if len(r.Behind) > 0 {
		why = append(why, "check that the queues' subscribers run and keep up")
	}
	for _, l := range r.Locks {
		open := "open for how long this role may not read"
		if !l.Hidden {
			open = fmt.Sprintf("%s, open %v", l.State, l.Open.Round(time.Second))
		}
		why = append(why, fmt.Sprintf("%s holds %s on it (%s): a long writer, a pg_dump or a transaction that read it; its end lets the turn empty it", l.Name, l.Modes, open))
	}
	if r.BehindUnread {
		why = append(why, "a session holds it exclusively, so its lanes could not be read")
	}
	if len(why) == 0 {
		why = append(why, "nothing holds it now: a subscriber's next turn empties it")
	}
	return fmt.Sprintf("the ring %s cannot turn: writers have written into partition %d for %v, and the next, %d, is not emptied: %s; "+
		"until it is, partition %d takes every write", ring, r.Partition, r.WritingFor.Round(time.Second), (r.Partition+1)%4, strings.Join(why, "; "), r.Partition)
}

// roundWait rounds a wait for people: to the millisecond under a second,
// else to the second.
func roundWait(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}
