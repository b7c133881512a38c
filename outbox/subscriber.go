package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/crew"
	"github.com/outboxgen/outboxgen/internal/dbx"
)

// Handler handles one delivery of a message. Returning nil acknowledges it
// (the row is deleted). An error is retried according to the subscriber's
// RetryStrategy; wrap it with [RetryAfter] to choose the delay, or with
// [Reject] to end the delivery now. A panic is recovered and treated as an
// error.
//
// ctx is cancelled with cause [ErrLeaseLost] when the row's lease is lost,
// and with cause [ErrSubscriberStopped] when the subscriber stops and its
// graceful timeout passes. Delivery is at least once: a handler must
// tolerate seeing a message again.
type Handler[T any] func(ctx context.Context, m *Message[T]) error

// Subscriber delivers the rows of one or more queues to a typed handler,
// at least once. Any number of subscribers, in one process or many, can
// serve the same queues: rows are claimed with FOR UPDATE SKIP LOCKED and
// leased, and every outcome is written only if the lease is still held.
type Subscriber[T any] struct {
	// core is what the engine runs: everything but the message type.
	core
	handler     Handler[T]
	txHandler   TxHandler[T] // set by NewTxSubscriber, instead of handler
	cfg         SubscriberConfig[T]
	contentType string
}

// core is the untyped part of a subscriber, which the engine runs: its
// outbox, queues and settings, and the function that turns a claimed row
// into a call of the typed handler.
type core struct {
	ob     *Outbox
	queues []string
	cfg    settings
	log    *slog.Logger
	// tx: the handler runs in a transaction (NewTxSubscriber).
	tx bool
	// calls returns, for one worker, the function that decodes a claimed
	// row into a call of the handler.
	calls   func() func(row *db.ClaimRow) (call, error)
	running atomic.Bool
	// poolWarned is set once the subscriber warned that its pool is small.
	poolWarned atomic.Bool
}

// call is one decoded delivery, ready for the handler: the engine runs
// it without knowing the message type.
type call interface {
	// headers are the message's headers, for an observer.
	headers() map[string]string
	// handle runs the Handler.
	handle(ctx context.Context) error
	// handleTx runs the TxHandler in tx.
	handleTx(ctx context.Context, tx pgx.Tx) error
}

// typedCall is a decoded message and the subscriber whose handler takes
// it.
type typedCall[T any] struct {
	msg Message[T]
	s   *Subscriber[T]
}

func (c *typedCall[T]) headers() map[string]string { return c.msg.Headers }

func (c *typedCall[T]) handle(ctx context.Context) error { return c.s.handler(ctx, &c.msg) }

func (c *typedCall[T]) handleTx(ctx context.Context, tx pgx.Tx) error {
	return c.s.txHandler(ctx, ownedTx{tx}, &c.msg)
}

// decoder returns the decoding function of one worker: it keeps the
// worker's header cache.
func (s *Subscriber[T]) decoder() func(row *db.ClaimRow) (call, error) {
	var hc headerCache
	return func(row *db.ClaimRow) (call, error) {
		c := &typedCall[T]{s: s}
		if err := decodeMessage(&c.msg, s.cfg.Codec, s.contentType, row, &hc); err != nil {
			return nil, err
		}
		return c, nil
	}
}

// NewSubscriber returns a subscriber of queues that runs handler for each
// message. It validates its arguments and cfg and returns a *[ConfigError]
// naming the first that breaks a rule; it does not touch the database.
// Call [Subscriber.Run] to start delivering.
func NewSubscriber[T any](ob *Outbox, queues []string, handler Handler[T], cfg *SubscriberConfig[T]) (*Subscriber[T], error) {
	s, err := newSubscriber(ob, queues, handler == nil, cfg)
	if err != nil {
		return nil, err
	}
	s.handler = handler
	return s, nil
}

// newSubscriber validates a subscriber's arguments in NewSubscriber's
// order (noHandler: the handler given is nil) and returns the subscriber
// without its handler.
func newSubscriber[T any](ob *Outbox, queues []string, noHandler bool, cfg *SubscriberConfig[T]) (*Subscriber[T], error) {
	if ob == nil {
		return nil, &ConfigError{Field: "ob", Value: "<nil>", Rule: "must not be nil"}
	}
	if len(queues) == 0 {
		return nil, &ConfigError{Field: "queues", Value: "[]", Rule: "must name at least one queue"}
	}
	seen := map[string]bool{}
	for i, q := range queues {
		if err := checkQueue(fmt.Sprintf("queues[%d]", i), q); err != nil {
			return nil, err
		}
		if seen[q] {
			return nil, &ConfigError{Field: fmt.Sprintf("queues[%d]", i), Value: q, Rule: "is listed twice"}
		}
		seen[q] = true
	}
	if noHandler {
		return nil, &ConfigError{Field: "handler", Value: "<nil>", Rule: "must not be nil"}
	}
	c, err := cfg.resolve(queues)
	if err != nil {
		return nil, err
	}
	s := &Subscriber[T]{
		core: core{
			ob:     ob,
			queues: append([]string(nil), queues...),
			cfg:    c.settings(),
			log:    c.Logger.With(slog.String("subscriber", c.Name)),
		},
		cfg:         c,
		contentType: c.Codec.ContentType(),
	}
	s.calls = s.decoder
	return s, nil
}

// Config returns the subscriber's configuration as it runs: every field
// left zero in the SubscriberConfig it was made with holds its default
// (Workers, LeaseTTL, HeartbeatInterval, Retry, Codec, Logger, ...), so
// code built around a subscriber can read its timing.
func (s *Subscriber[T]) Config() SubscriberConfig[T] { return s.cfg }

// Run delivers messages until ctx is done, then stops claiming, releases
// the rows it claimed but did not start, waits for running handlers,
// writes their outcomes, and returns.
//
// Everything after the stop is bounded by the graceful timeout: Run
// returns within GracefulTimeout plus [StopSlack] after ctx ends, whatever
// the database does. Handlers still running when it passes are abandoned
// (their context cancelled with cause ErrSubscriberStopped), and outcomes
// not written by then are given up: those rows keep their leases and are
// delivered again when the leases expire. Run then returns an error
// wrapping [ErrGracefulTimeout] that counts them; otherwise it returns nil
// after a stop.
//
// Run first counts what the subscribers running on the outbox need of its
// pool. It returns a *[ConfigError] when transactional subscribers' handlers
// would hold all but fewer than three of the pool's connections (see
// [NewTxSubscriber]), and logs a warning, once per subscriber, when the
// subscribers' claims, outcomes and heartbeats leave the pool fewer
// connections than the subscriber's workers (handlers that use the pool
// then wait for one).
//
// Run then checks the outbox's schema ([Outbox.Check]) and returns its
// *[SchemaError] when the schema is missing or not at the version this
// library needs. Database errors while running, including at that first
// check, are logged and retried with backoff; they do not end Run.
func (s *Subscriber[T]) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer s.running.Store(false)
	return s.core.run(ctx)
}

// run is Run once the subscriber is marked running.
func (s *core) run(ctx context.Context) error {
	release, err := s.takePool()
	if err != nil {
		return err
	}
	defer release()
	if err := s.checkSchema(ctx); err != nil {
		return err
	}
	r := newRun(ctx, s)
	if s.tx {
		r.liftIdle = s.idleLift(ctx)
	}
	// Hand-overs recorded while no subscriber listened are completed
	// before the first claim.
	r.handoffs.pending.Store(true)
	return r.run(ctx)
}

// checkSchema waits until the schema can be checked, and returns a
// *SchemaError when it is not usable. A stop while waiting returns nil.
func (s *core) checkSchema(ctx context.Context) error {
	errs := dbx.Backoff{Base: 100 * time.Millisecond, Max: min(30*time.Second, s.cfg.MaxFetchInterval)}
	for {
		cctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
		err := s.ob.Check(cctx)
		cancel()
		var se *SchemaError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &se):
			return err
		case ctx.Err() != nil:
			return nil
		}
		wait := errs.Next()
		s.log.ErrorContext(ctx, "outbox: cannot check the outbox schema; retrying", slog.Any("error", err), slog.Duration("backoff", wait))
		dbx.Sleep(ctx, wait)
	}
}

// idleLift returns the idle_in_transaction_session_timeout, in
// milliseconds, that a transactional handler's transaction sets for
// itself: the lease's length when the session's own is shorter (a DBA's
// role or database setting would end the transaction while its handler
// works, though the subscriber ends it within the lease anyway), else 0
// (nothing to set). When the setting cannot be read, it is set.
func (s *core) idleLift(ctx context.Context) int64 {
	lease := s.cfg.LeaseTTL.Milliseconds()
	cctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	have, err := s.ob.queries(s.ob.pool).IdleInTransactionTimeout(cctx)
	if err == nil && (have == 0 || have >= lease) {
		return 0
	}
	return lease
}

// StopSlack is how much longer than its GracefulTimeout [Subscriber.Run]
// may take to return after its context ends: the time to close its
// connections and hand the last metric events to the recorder.
const StopSlack = time.Second

// ErrGracefulTimeout is wrapped by the error [Subscriber.Run] returns when
// the graceful timeout passed before every running handler finished and
// every outcome was written. Rows it counts keep their leases and are
// delivered again when the leases expire.
var ErrGracefulTimeout = errors.New("outbox: graceful timeout passed")

// run is the state of one Run call. Its goroutines and their owners:
// fetcher, heartbeat and workers belong to run; the acknowledger runs
// until the outcomes channel closes after the workers exit. The LISTEN
// connection belongs to the Outbox's listener, which run joins and
// leaves: the last run to leave stops it and waits for it.
type run struct {
	s *core
	// liftIdle, when above 0, is the idle_in_transaction_session_timeout
	// (ms) each transactional handler's transaction sets (idleLift).
	liftIdle int64

	// buf holds claimed rows not yet handed to a worker.
	buf chan *delivery
	// wake tells the fetcher to claim now (a NOTIFY, a reconnect, a retry).
	wake chan struct{}
	// taken tells the fetcher a worker took a row, so there is room.
	taken chan struct{}
	// outcomes carries handler outcomes to the acknowledger.
	outcomes chan outcome

	leases   leases
	handoffs handoffs
	sleeper  sleeper // fetcher only
	// deaf is set while a notification sent through the pool did not
	// reach the LISTEN connection (a pooler in transaction mode): the
	// fetcher then polls without recording its sleep, since writers'
	// notifications would never arrive.
	deaf    atomic.Bool
	metrics *metricsSink
	logs    *logSummary
	// unstarted holds rows a worker took after the stop began.
	unstartedMu sync.Mutex
	unstarted   []*delivery
	// handlerCtx parents every handler's context; forceStop cancels it.
	handlerCtx context.Context
	forceStop  context.CancelCauseFunc
	// writes bounds every database write: it ends GracefulTimeout after
	// the stop, and nothing is written after that.
	writes     context.Context
	stopWrites context.CancelFunc
	// crew is the workers; drain waits for them.
	crew crew.Crew

	// claims takes rows for the workers. Fetcher only.
	claims claimer
	// locks admits locked claims (one slot each, lockedClaimsInFlight);
	// nil when every claim writes leases.
	locks chan struct{}
	// stopping is closed when the run's context is done: open locked
	// claims end at once, so their unstarted rows go back.
	stopping chan struct{}
	// lockEnds counts the locked claims not yet ended.
	lockEnds sync.WaitGroup
	// locksSwept is when the fetcher last swept lock records. Fetcher only.
	locksSwept time.Time
	// ends bounds the ends of locked claims: done StopSlack/2 after the
	// graceful timeout, so a claim whose handlers were abandoned can
	// still lease their rows.
	ends     context.Context
	stopEnds context.CancelFunc
	// lockUnwritten counts the outcomes of locked claims whose end could
	// not be written before ends was done.
	lockUnwritten atomic.Int64
	// abandoned counts handlers the forced stop gave up on.
	abandoned atomic.Int64
}

// queries returns the generated queries on the pool, each statement
// bounded by QueryTimeout.
func (r *run) queries() *db.Queries {
	return r.s.ob.queries(dbx.Bounded{Inner: r.s.ob.pool, Timeout: r.s.cfg.QueryTimeout})
}

func newRun(ctx context.Context, s *core) *run {
	hctx, force := context.WithCancelCause(context.WithoutCancel(ctx))
	writes, stopWrites := context.WithCancel(context.WithoutCancel(ctx))
	var locks chan struct{}
	if locksRows(&s.cfg, s.ob.pool.Config().MaxConns) {
		locks = make(chan struct{}, lockedClaimsInFlight)
	}
	ends, stopEnds := context.WithCancel(context.WithoutCancel(ctx))
	r := &run{
		ends:       ends,
		stopping:   make(chan struct{}),
		stopEnds:   stopEnds,
		locks:      locks,
		s:          s,
		buf:        make(chan *delivery, s.cfg.FetchBatchSize),
		wake:       make(chan struct{}, 1),
		taken:      make(chan struct{}, 1),
		outcomes:   make(chan outcome, s.cfg.AckBatchSize*2),
		leases:     newLeases(s.cfg.LeaseTTL),
		sleeper:    newSleeper(),
		metrics:    newMetricsSink(s.cfg.Metrics, s.log, s.cfg.FetchBatchSize),
		logs:       newLogSummary(s.log, logSummaryInterval),
		handlerCtx: hctx,
		forceStop:  force,
		writes:     writes,
		stopWrites: stopWrites,
	}
	r.claims = newClaimer(r)
	return r
}

func (r *run) run(ctx context.Context) error {
	defer r.forceStop(nil)
	defer r.stopWrites()

	var side sync.WaitGroup // leaving the listener, and heartbeat
	l := r.s.ob.hubs.Join(ctx, r.s.ob.wakeSource(), r, r.s.cfg.ListenDSN, r.s.cfg.ListenConnect)
	side.Go(func() {
		<-ctx.Done()
		l.Leave(r)
	})
	if r.s.cfg.HeartbeatInterval > 0 {
		side.Go(func() { r.heartbeat(r.writes) })
	}
	ackDone := make(chan int, 1)
	go func() { ackDone <- r.acknowledge(r.writes) }()

	var fetcher sync.WaitGroup
	fetcher.Go(func() { r.fetch(ctx) })
	r.crew.Hire(r.s.cfg.Workers, func(w *crew.Worker) { r.work(ctx, w) })

	<-ctx.Done()
	close(r.stopping)
	deadline := time.Now().Add(r.s.cfg.GracefulTimeout)
	stopTimer := time.AfterFunc(r.s.cfg.GracefulTimeout, r.stopWrites)
	defer stopTimer.Stop()
	endsTimer := time.AfterFunc(r.s.cfg.GracefulTimeout+StopSlack/2, r.stopEnds)
	defer endsTimer.Stop()
	defer r.stopEnds()
	fetcher.Wait()
	r.leave()
	r.release() // rows no worker started go back at once
	r.drain(deadline)
	r.release() // rows a worker took after the stop began
	r.lockEnds.Wait()
	close(r.outcomes)
	unwritten := <-ackDone + int(r.lockUnwritten.Load())
	r.stopWrites()
	side.Wait()
	r.logs.close()
	// The recorder gets what is left of the slack, so a stuck one cannot
	// hold Run past it.
	r.metrics.close(max(time.Until(deadline.Add(StopSlack)), 10*time.Millisecond))
	if abandoned := r.abandoned.Load(); abandoned+int64(unwritten) > 0 {
		return fmt.Errorf("%w: %d handler(s) abandoned, %d outcome(s) not written; their rows are delivered again when their leases expire",
			ErrGracefulTimeout, abandoned, unwritten)
	}
	return nil
}

// drain waits for running handlers until deadline, then abandons the
// rest.
func (r *run) drain(deadline time.Time) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-r.crew.Done():
		return
	case <-t.C:
	}
	running := r.leases.held()
	r.s.log.Warn("outbox: graceful timeout passed with handlers running; abandoning them, their rows keep their leases",
		slog.Int("running", running), slog.Duration("graceful_timeout", r.s.cfg.GracefulTimeout))
	r.emit(MetricEvent{Name: EventDrainTimeout, Queue: r.s.queues[0], Count: running})
	r.forceStop(ErrSubscriberStopped)
	r.abandoned.Add(int64(r.crew.Abandon()))
	<-r.crew.Done()
}

// release hands back the rows claimed but never started.
func (r *run) release() {
	r.unstartedMu.Lock()
	ds := r.unstarted
	r.unstarted = nil
	r.unstartedMu.Unlock()
	for {
		select {
		case d := <-r.buf:
			ds = append(ds, d)
			continue
		default:
		}
		break
	}
	if len(ds) == 0 {
		return
	}
	ids := make([]int64, 0, len(ds))
	tokens := make([]pgtype.UUID, 0, len(ds))
	for _, d := range ds {
		r.leases.remove(d)
		if c := d.batch.locked; c != nil && (c.giveUp(d) || r.leases.isLost(d)) {
			continue // its lock is released when its claim ends
		}
		ids, tokens = append(ids, d.row.ID), append(tokens, d.token)
	}
	if len(ids) == 0 {
		return
	}
	released, err := r.queries().ReleaseBatchWithLease(r.writes, db.ReleaseBatchWithLeaseParams{Ids: ids, Tokens: tokens})
	if err != nil {
		r.s.log.Warn("outbox: could not release unstarted rows; they will be claimed again when their leases expire",
			slog.Int("rows", len(ids)), slog.Any("error", err))
		return
	}
	r.s.log.Debug("outbox: released unstarted rows", slog.Int("rows", len(released)))
}

// emit queues a metric event tagged with this subscriber.
func (r *run) emit(ev MetricEvent) {
	ev.Subscriber = r.s.cfg.Name
	r.metrics.emit(ev)
}

// rowAttrs are the log attributes of every line about a row.
func rowAttrs(d *delivery) []any {
	return []any{slog.String("queue", d.row.Queue), slog.Int64("id", d.row.ID), slog.Int("deliveries", int(d.row.DeliveriesCount))}
}
