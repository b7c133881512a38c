package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/claim"
	"github.com/outboxgen/outboxgen/internal/crew"
	"github.com/outboxgen/outboxgen/internal/dbx"
	"github.com/outboxgen/outboxgen/internal/lease"
)

// idleLift returns the idle_in_transaction_session_timeout, in
// milliseconds, that a transactional handler's transaction sets for
// itself: the lease's length when the session's own is shorter (a DBA's
// role or database setting would end the transaction while its handler
// works, though the subscriber ends it within the lease anyway), else 0
// (nothing to set). When the setting cannot be read, it is set.
func (s *Subscriber) idleLift(ctx context.Context) int64 {
	lease := s.LeaseTTL.Milliseconds()
	cctx, cancel := context.WithTimeout(ctx, s.QueryTimeout)
	defer cancel()
	have, err := s.Queries(s.Pool).IdleInTransactionTimeout(cctx)
	if err == nil && (have == 0 || have >= lease) {
		return 0
	}
	return lease
}

// StopSlack is how much longer than its GracefulTimeout outbox.Subscriber.Run
// may take to return after its context ends: the time to close its
// connections and hand the last metric events to the recorder.
const StopSlack = time.Second

// ErrGracefulTimeout is wrapped by the error outbox.Subscriber.Run returns when
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
	s *Subscriber
	// liftIdle, when above 0, is the idle_in_transaction_session_timeout
	// (ms) each transactional handler's transaction sets (idleLift).
	liftIdle int64

	// presence is what the run's presence record says of it.
	presence *presence

	// buf holds claimed rows not yet handed to a worker.
	buf chan *lease.Delivery
	// wake tells the fetcher to claim now (a NOTIFY, a reconnect, a retry).
	wake chan struct{}
	// taken tells the fetcher a worker took a row, so there is room.
	taken chan struct{}
	// outcomes carries handler outcomes to the acknowledger.
	outcomes chan lease.Outcome

	leases   lease.Tracker
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
	unstarted   []*lease.Delivery
	// handlerCtx parents every handler's context; forceStop cancels it.
	handlerCtx context.Context
	forceStop  context.CancelCauseFunc
	// writes bounds every database write: it ends GracefulTimeout after
	// the stop, and nothing is written after that.
	writes     context.Context
	stopWrites context.CancelFunc
	// crew is the workers; drain waits for them.
	crew crew.Crew

	// claims takes rows for the workers (Claim: fetcher only).
	claims claim.Claimer
	// stopping is closed when the run's context is done: open locked
	// claims end at once, so their unstarted rows go back.
	stopping chan struct{}
	// locksSwept is when the fetcher last swept lock records. Fetcher only.
	locksSwept time.Time
	// ends bounds the ends of locked claims: done StopSlack/2 after the
	// graceful timeout, so a claim whose handlers were abandoned can
	// still lease their rows.
	ends     context.Context
	stopEnds context.CancelFunc
	// abandoned counts handlers the forced stop gave up on.
	abandoned atomic.Int64
}

// queries returns the generated queries on the pool, each statement
// bounded by QueryTimeout.
func (r *run) queries() *db.Queries {
	return r.s.Queries(dbx.Bounded{Inner: r.s.Pool, Timeout: r.s.QueryTimeout})
}

func newRun(ctx context.Context, s *Subscriber) *run {
	hctx, force := context.WithCancelCause(context.WithoutCancel(ctx))
	writes, stopWrites := context.WithCancel(context.WithoutCancel(ctx))
	ends, stopEnds := context.WithCancel(context.WithoutCancel(ctx))
	r := &run{
		ends:       ends,
		stopping:   make(chan struct{}),
		stopEnds:   stopEnds,
		s:          s,
		buf:        make(chan *lease.Delivery, s.FetchBatchSize),
		wake:       make(chan struct{}, 1),
		taken:      make(chan struct{}, 1),
		outcomes:   make(chan lease.Outcome, s.AckBatchSize*2),
		leases:     lease.NewTracker(s.LeaseTTL),
		sleeper:    newSleeper(),
		presence:   newPresence(),
		metrics:    newMetricsSink(s.Metrics, s.Log, s.FetchBatchSize),
		logs:       newLogSummary(s.Log, logSummaryInterval),
		handlerCtx: hctx,
		forceStop:  force,
		writes:     writes,
		stopWrites: stopWrites,
	}
	r.claims = claim.New(&claim.Env{
		Queues: s.Queues, LeaseTTL: s.LeaseTTL, LockWindow: s.LockWindow, QueryTimeout: s.QueryTimeout,
		MinFetchInterval: s.MinFetchInterval, MaxFetchInterval: s.MaxFetchInterval, FetchBatchSize: s.FetchBatchSize, MinLockedClaim: s.MinLockedClaim, Log: s.Log,
		Pool: s.Pool, Queries: s.Queries, Leases: &r.leases, HandlerCtx: hctx, Writes: writes, Ends: ends, Stopping: r.stopping,
		Hand: r.hand, Outcomes: r.outcomes, Report: r.report, Wake: r.wakeFetcher, Ring: s.Ring, RingTurnAge: s.RingTurnAge,
	})
	return r
}

func (r *run) run(ctx context.Context) error {
	defer r.forceStop(nil)
	defer r.stopWrites()

	var side sync.WaitGroup // leaving the listener, and heartbeat
	l := r.s.Hubs.Join(ctx, r.s.Wake, r, r.s.ListenDSN, r.s.ListenConnect)
	side.Go(func() {
		<-ctx.Done()
		l.Leave(r)
	})
	if r.s.HeartbeatInterval > 0 {
		side.Go(func() { r.heartbeat(r.writes) })
	}
	ackDone := make(chan int, 1)
	go func() { ackDone <- r.acknowledge(r.writes) }()

	var fetcher sync.WaitGroup
	fetcher.Go(func() { r.fetch(ctx) })
	r.crew.Hire(r.s.Workers, func(w *crew.Worker) { r.work(ctx, w) })
	var present sync.WaitGroup // the presence record's writes, once the crew is hired
	present.Go(func() { r.present(ctx) })

	<-ctx.Done()
	close(r.stopping)
	stopped := time.Now()
	deadline := stopped.Add(r.s.GracefulTimeout)
	r.s.Log.Info("outbox: stopping; waiting for running handlers until the deadline",
		slog.Int("running", r.crew.Busy()), slog.Duration("graceful_timeout", r.s.GracefulTimeout), slog.Time("deadline", deadline))
	stopTimer := time.AfterFunc(r.s.GracefulTimeout, r.stopWrites)
	defer stopTimer.Stop()
	endsTimer := time.AfterFunc(r.s.GracefulTimeout+StopSlack/2, r.stopEnds)
	defer endsTimer.Stop()
	defer r.stopEnds()
	fetcher.Wait()
	r.leave()
	r.release() // rows no worker started go back at once
	r.drain(deadline)
	r.release()    // rows a worker took after the stop began
	present.Wait() // its last write, as stopping, before its delete
	r.absent()
	lockUnwritten := r.claims.Ended()
	close(r.outcomes)
	unwritten := <-ackDone + lockUnwritten
	r.stopWrites()
	side.Wait()
	r.logs.close()
	// The recorder gets what is left of the slack, so a stuck one cannot
	// hold Run past it.
	r.metrics.close(max(time.Until(deadline.Add(StopSlack)), 10*time.Millisecond))
	abandoned := r.abandoned.Load()
	ended := "drained"
	if abandoned+int64(unwritten) > 0 {
		ended = "forced"
	}
	r.s.Log.Info("outbox: stopped", slog.String("ended", ended), slog.Int64("abandoned", abandoned),
		slog.Int("unwritten", unwritten), slog.Duration("took", time.Since(stopped)))
	if ended == "forced" {
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
	running := r.leases.Held()
	r.s.Log.Warn("outbox: graceful timeout passed with handlers running; abandoning them, their rows keep their leases",
		slog.Int("running", running), slog.Duration("graceful_timeout", r.s.GracefulTimeout))
	r.emit(MetricEvent{Name: EventDrainTimeout, Queue: r.s.Queues[0], Count: running})
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
		r.leases.Remove(d)
		if c := d.Batch.Hold; c != nil && (c.GiveUp(d) || r.leases.IsLost(d)) {
			continue // its lock is released when its claim ends
		}
		ids, tokens = append(ids, d.Row.ID), append(tokens, d.Token)
	}
	if len(ids) == 0 {
		return
	}
	released, err := r.queries().ReleaseBatchWithLease(r.writes, db.ReleaseBatchWithLeaseParams{Ids: ids, Tokens: tokens})
	if err != nil {
		r.s.Log.Warn("outbox: could not release unstarted rows; they will be claimed again when their leases expire",
			slog.Int("rows", len(ids)), slog.Any("error", err))
		return
	}
	r.s.Log.Debug("outbox: released unstarted rows", slog.Int("rows", len(released)))
}

// emit queues a metric event tagged with this subscriber.
func (r *run) emit(ev MetricEvent) {
	ev.Subscriber = r.s.Name
	r.metrics.emit(ev)
}

// rowAttrs are the log attributes of every line about a row.
func rowAttrs(d *lease.Delivery) []any {
	return []any{slog.String("queue", d.Row.Queue), slog.Int64("id", d.Row.ID), slog.Int("deliveries", int(d.Row.DeliveriesCount))}
}

// hand puts claimed rows in buf for the workers. A claim of the ring
// may hand more rows than buf holds (a transaction's rows of a lane come
// whole), and waits for the workers to take them; once the run stops,
// the workers take no more, and the rows left go to unstarted, which the
// stop hands back, so that the claim, and with it Run, does not wait for
// good.
func (r *run) hand(ds []*lease.Delivery) {
	for i, d := range ds {
		select {
		case r.buf <- d:
		case <-r.stopping:
			r.unstart(ds[i:]...)
			return
		}
	}
}
