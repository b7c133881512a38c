package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
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
	ob          *Outbox
	queues      []string
	handler     Handler[T]
	cfg         SubscriberConfig[T]
	contentType string
	log         *slog.Logger
	running     atomic.Bool
}

// NewSubscriber returns a subscriber of queues that runs handler for each
// message. It validates its arguments and cfg and returns a *[ConfigError]
// naming the first that breaks a rule; it does not touch the database.
// Call [Subscriber.Run] to start delivering.
func NewSubscriber[T any](ob *Outbox, queues []string, handler Handler[T], cfg *SubscriberConfig[T]) (*Subscriber[T], error) {
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
	if handler == nil {
		return nil, &ConfigError{Field: "handler", Value: "<nil>", Rule: "must not be nil"}
	}
	c, err := cfg.resolve(queues)
	if err != nil {
		return nil, err
	}
	return &Subscriber[T]{
		ob:          ob,
		queues:      append([]string(nil), queues...),
		handler:     handler,
		cfg:         c,
		contentType: c.Codec.ContentType(),
		log:         c.Logger.With(slog.String("subscriber", c.Name)),
	}, nil
}

// Run delivers messages until ctx is done, then stops claiming, releases
// the rows it claimed but did not start, waits up to the graceful timeout
// for running handlers, writes their outcomes, and returns. It returns
// only when every goroutine it started has exited, except handlers still
// running after the graceful timeout: those are abandoned (their context
// cancelled with cause ErrSubscriberStopped) and their rows keep their
// leases, to be delivered again when the leases expire.
//
// Run returns nil after a stop. Database errors while running are logged
// and retried with backoff; they do not end Run.
func (s *Subscriber[T]) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer s.running.Store(false)
	r := newRun(ctx, s)
	return r.run(ctx)
}

// run is the state of one Run call. Its goroutines and their owners:
// listener, fetcher, heartbeat and workers belong to run; the acknowledger
// runs until the outcomes channel closes after the workers exit.
type run[T any] struct {
	s *Subscriber[T]

	// buf holds claimed rows not yet handed to a worker.
	buf chan *delivery
	// wake tells the fetcher to claim now (a NOTIFY, a reconnect).
	wake chan struct{}
	// taken tells the fetcher a worker took a row, so there is room.
	taken chan struct{}
	// outcomes carries handler outcomes to the acknowledger.
	outcomes chan outcome

	leases  leases
	metrics *metricsSink
	// unstarted holds rows a worker took after the stop began.
	unstartedMu sync.Mutex
	unstarted   []*delivery
	// handlerCtx parents every handler's context; forceStop cancels it.
	handlerCtx context.Context
	forceStop  context.CancelCauseFunc
}

func newRun[T any](ctx context.Context, s *Subscriber[T]) *run[T] {
	hctx, force := context.WithCancelCause(context.WithoutCancel(ctx))
	return &run[T]{
		s:          s,
		buf:        make(chan *delivery, s.cfg.FetchBatchSize),
		wake:       make(chan struct{}, 1),
		taken:      make(chan struct{}, 1),
		outcomes:   make(chan outcome, s.cfg.AckBatchSize*2),
		leases:     leases{ttl: s.cfg.LeaseTTL, m: map[int64]*delivery{}},
		metrics:    newMetricsSink(s.cfg.Metrics, s.log),
		handlerCtx: hctx,
		forceStop:  force,
	}
}

func (r *run[T]) run(ctx context.Context) error {
	defer r.forceStop(nil)
	// bg outlives ctx: it carries the last writes after the stop.
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()

	var side sync.WaitGroup // listener and heartbeat
	side.Go(func() { r.listen(bg) })
	if r.s.cfg.HeartbeatInterval > 0 {
		side.Go(func() { r.heartbeat(bg) })
	}
	ackDone := make(chan error, 1)
	go func() { ackDone <- r.acknowledge(bg) }()

	var fetcher, workers sync.WaitGroup
	fetcher.Go(func() { r.fetch(ctx) })
	for range r.s.cfg.Workers {
		workers.Go(func() { r.work(ctx) })
	}

	<-ctx.Done()
	fetcher.Wait()
	r.release(bg) // rows no worker started go back at once
	r.drain(bg, &workers)
	r.release(bg) // rows a worker took after the stop began
	close(r.outcomes)
	ackErr := <-ackDone
	stopBG()
	side.Wait()
	r.metrics.close(r.s.cfg.GracefulTimeout)
	return ackErr
}

// drain waits for running handlers up to the graceful timeout, then
// abandons the rest.
func (r *run[T]) drain(ctx context.Context, workers *sync.WaitGroup) {
	done := make(chan struct{})
	go func() {
		workers.Wait()
		close(done)
	}()
	t := time.NewTimer(r.s.cfg.GracefulTimeout)
	defer t.Stop()
	select {
	case <-done:
		return
	case <-t.C:
	}
	ids, _ := r.leases.snapshot()
	r.s.log.WarnContext(ctx, "outbox: graceful timeout passed with handlers running; abandoning them, their rows keep their leases",
		slog.Int("running", len(ids)), slog.Duration("graceful_timeout", r.s.cfg.GracefulTimeout))
	r.emit(MetricEvent{Name: EventDrainTimeout, Queue: r.s.queues[0], Count: len(ids)})
	r.forceStop(ErrSubscriberStopped)
	<-done
}

// release hands back the rows claimed but never started.
func (r *run[T]) release(ctx context.Context) {
	r.unstartedMu.Lock()
	ds := r.unstarted
	r.unstartedMu.Unlock()
	var ids []int64
	for _, d := range ds {
		ids = append(ids, d.row.ID)
	}
	for {
		select {
		case d := <-r.buf:
			ds = append(ds, d)
			ids = append(ids, d.row.ID)
			continue
		default:
		}
		break
	}
	if len(ds) == 0 {
		return
	}
	tokens := make([]pgtype.UUID, len(ds))
	for i, d := range ds {
		tokens[i] = d.token
		r.leases.remove(d)
	}
	ctx, cancel := context.WithTimeout(ctx, r.s.cfg.GracefulTimeout)
	defer cancel()
	released, err := r.s.ob.queries(r.s.ob.pool).ReleaseBatchWithLease(ctx, db.ReleaseBatchWithLeaseParams{Ids: ids, Tokens: tokens})
	if err != nil {
		r.s.log.WarnContext(ctx, "outbox: could not release unstarted rows; they will be claimed again when their leases expire",
			slog.Int("rows", len(ids)), slog.Any("error", err))
		return
	}
	r.s.log.DebugContext(ctx, "outbox: released unstarted rows", slog.Int("rows", len(released)))
}

// emit queues a metric event tagged with this subscriber.
func (r *run[T]) emit(ev MetricEvent) {
	ev.Subscriber = r.s.cfg.Name
	r.metrics.emit(ev)
}

// rowAttrs are the log attributes of every line about a row.
func rowAttrs(d *delivery) []any {
	return []any{slog.String("queue", d.row.Queue), slog.Int64("id", d.row.ID), slog.Int("deliveries", int(d.row.DeliveriesCount))}
}
