package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/crew"
	"github.com/outboxgen/outboxgen/internal/dbx"
	"github.com/outboxgen/outboxgen/internal/lease"
)

// work hands claimed rows to the handler until ctx is done, or until
// the forced stop abandons w inside a handler.
func (r *run) work(ctx context.Context, w *crew.Worker) {
	decode := r.s.Calls()
	var scope lease.Scope
	defer scope.Close()
	for {
		select {
		case <-ctx.Done():
			return
		case d := <-r.buf:
			select {
			case r.taken <- struct{}{}:
			default:
			}
			if ctx.Err() != nil {
				r.unstart(d)
				return
			}
			if !r.handle(d, w, decode, &scope) {
				return
			}
			for next := follower(d); next != nil; next = follower(next) {
				if ctx.Err() != nil {
					r.unstart(next)
					return
				}
				if !r.handle(next, w, decode, &scope) {
					return
				}
			}
		}
	}
}

// follower returns the row of d's key that d's claim hands out after d
// (see lease.Chain), nil for none.
func follower(d *lease.Delivery) *lease.Delivery {
	if c, ok := d.Batch.Hold.(lease.Chain); ok {
		return c.Next(d)
	}
	return nil
}

// handle runs one delivery and hands its outcome to the acknowledger. It
// reports false when the forced stop abandoned w while the handler ran:
// the worker must exit without a further word.
func (r *run) handle(d *lease.Delivery, w *crew.Worker, decode func(*db.ClaimRow) (Call, error), scope *lease.Scope) bool {
	cfg := r.s
	if !r.leases.StartIn(d, scope.In(d.Batch)) {
		// The lease ran out while the row waited for a worker; another
		// claim may own it now, so leave it be.
		r.leases.Remove(d)
		return true
	}
	if cfg.MaxDeliveries > 0 && int(d.Row.DeliveriesCount) > cfg.MaxDeliveries {
		r.finish(d, lease.Outcome{Kind: r.terminalKind(), Reason: ReasonMaxDeliveries,
			Text: fmt.Sprintf("claimed %d times; MaxDeliveries is %d", d.Row.DeliveriesCount, cfg.MaxDeliveries)})
		return true
	}
	msg, err := decode(&d.Row)
	if err != nil {
		r.finish(d, lease.Outcome{Kind: r.terminalKind(), Reason: ReasonDecodeError, Text: dbx.ErrorText(err)})
		return true
	}
	r.emit(MetricEvent{Name: EventDispatched, Queue: d.Row.Queue, ID: d.Row.ID, Deliveries: int(d.Row.DeliveriesCount), Bytes: len(d.Row.Payload),
		Age: max(time.Since(d.Row.CreatedAt), 0)})
	switch w.Enter() {
	case crew.Stopped:
		// The forced stop came before the handler started: the row goes
		// back with the other unstarted ones.
		r.unstart(d)
		return false
	case crew.Abandoned:
		// The forced stop counted this worker as in its handler, which
		// never started; the row keeps its lease, as a running handler's
		// would.
		return false
	}
	hctx, observed := d.Ctx, r.s.Observer != nil
	var info DeliveryInfo
	if observed {
		info = r.deliveryInfo(d, msg.Headers())
		hctx = r.observeStart(d.Ctx, info)
	}
	start := time.Now()
	var (
		herr error
		res  txResult
	)
	if r.s.Tx {
		res, herr = r.handleInTx(hctx, d, msg)
	} else {
		herr = safeHandle(hctx, msg.Handle)
	}
	ran := time.Since(start)
	if !w.Leave() {
		// Abandoned by the forced stop while the handler ran, and counted
		// then; Run may have returned.
		if observed {
			r.observeEnd(hctx, info, DeliveryOutcome{Outcome: OutcomeAbandoned, Err: herr, Ran: ran})
		}
		return false
	}
	if res != txRolledBack {
		// A transactional handler's acknowledgement committed with its
		// writes, or found the lease taken: nothing is left to write.
		r.txEnded(hctx, d, res, ran, observed, info)
		return true
	}
	stopped := r.handlerCtx.Err() != nil
	lost := !stopped && r.leases.IsLost(d)
	if observed && (stopped || lost) {
		r.observeEnd(hctx, info, DeliveryOutcome{Outcome: OutcomeAbandoned, Err: herr, Ran: ran})
	}
	switch {
	case stopped:
		// Forced stop: the outcome raced the stop. The row keeps its
		// lease and is delivered again after it expires. The stop's cause
		// may not have reached d's context yet (a parent cancels its
		// children one by one); hand it over first.
		r.abandoned.Add(1)
		d.Cancel(context.Cause(r.handlerCtx))
		r.leases.Remove(d)
		return true
	case lost:
		// A heartbeat found the lease gone and reported it; the newer
		// delivery decides.
		r.leases.Remove(d)
		return true
	}
	o := r.decide(d, herr)
	o.Ran = ran
	o.Attempted = true
	if observed {
		r.observeEnd(hctx, info, deliveryOutcome(o, herr))
	}
	r.finish(d, o)
	return true
}

// safeHandle calls h, turning a panic into an error.
func safeHandle(ctx context.Context, h func(context.Context) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panicked: %v\n%s", p, debug.Stack())
		}
	}()
	return h(ctx)
}

// decide turns a handler's result into an outcome. The error is the
// handler's: its methods may panic (a typed nil pointer), so its text is
// taken once, safely, and its wrappers are inspected under recover.
func (r *run) decide(d *lease.Delivery, err error) lease.Outcome {
	if err == nil {
		return lease.Outcome{Kind: lease.Ack}
	}
	text := dbx.ErrorText(err)
	rejected, retryAfter, forced := classify(err)
	if rejected {
		return lease.Outcome{Kind: r.terminalKind(), Reason: ReasonRejected, Text: text}
	}
	attempt := lease.Attempts(d.Row.AttemptsCount) + 1
	elapsed := d.SinceFirstAttempt()
	var (
		delay   time.Duration
		ok      bool
		problem error
	)
	if forced {
		// RetryAfter chooses the delay; the strategy's caps still end
		// the delivery.
		delay = retryAfter
		ok, problem = r.s.Retry.Allow(attempt, elapsed, delay, err)
	} else {
		delay, ok, problem = r.s.Retry.NextDelay(attempt, elapsed, err)
	}
	if problem != nil {
		r.s.Log.ErrorContext(d.Context(), "outbox: retry strategy failed; ending the delivery", append(rowAttrs(d), slog.Any("error", problem))...)
		return lease.Outcome{Kind: r.terminalKind(), Reason: ReasonRetryExhausted, Text: dbx.StorableText(text + " (" + problem.Error() + ")")}
	}
	if !ok {
		return lease.Outcome{Kind: r.terminalKind(), Reason: ReasonRetryExhausted, Text: text}
	}
	return lease.Outcome{Kind: lease.Retry, Delay: delay, Text: text}
}

// classify reports whether err wraps Reject or RetryAfter. An error whose
// Unwrap or As method panics counts as a plain error.
func classify(err error) (rejected bool, retryAfter time.Duration, forced bool) {
	defer func() {
		if recover() != nil {
			rejected, retryAfter, forced = false, 0, false
		}
	}()
	var rej *rejectError
	if errors.As(err, &rej) {
		return true, 0, false
	}
	var ra *retryAfterError
	if errors.As(err, &ra) {
		return false, ra.delay, true
	}
	return false, 0, false
}

func (r *run) terminalKind() lease.Kind {
	if r.s.DisableDeadLetter {
		return lease.Drop
	}
	return lease.DeadLetter
}

// finish stops tracking d and queues its outcome.
func (r *run) finish(d *lease.Delivery, o lease.Outcome) {
	o.D = d
	r.leases.Remove(d)
	if c := d.Batch.Hold; c != nil && c.Keep(o) {
		return
	}
	r.outcomes <- o
}

// unstart keeps rows no worker will start, taken after the stop or
// never handed to a worker, for release.
func (r *run) unstart(ds ...*lease.Delivery) {
	r.unstartedMu.Lock()
	r.unstarted = append(r.unstarted, ds...)
	r.unstartedMu.Unlock()
}
