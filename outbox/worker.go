package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"
)

// work hands claimed rows to the handler until ctx is done.
func (r *run[T]) work(ctx context.Context) {
	var hc headerCache
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
			r.handle(d, &hc)
		}
	}
}

// handle runs one delivery and hands its outcome to the acknowledger.
func (r *run[T]) handle(d *delivery, hc *headerCache) {
	cfg := &r.s.cfg
	if d.ctx.Err() != nil {
		// The lease ran out while the row waited for a worker; another
		// claim may own it now, so leave it be.
		r.leases.remove(d)
		return
	}
	if cfg.MaxDeliveries > 0 && int(d.row.DeliveriesCount) > cfg.MaxDeliveries {
		r.finish(d, outcome{kind: r.terminalKind(), reason: ReasonMaxDeliveries,
			text: fmt.Sprintf("claimed %d times; MaxDeliveries is %d", d.row.DeliveriesCount, cfg.MaxDeliveries)})
		return
	}
	msg, err := decodeMessage(cfg.Codec, r.s.contentType, &d.row, hc)
	if err != nil {
		r.finish(d, outcome{kind: r.terminalKind(), reason: ReasonDecodeError, text: errorText(err)})
		return
	}
	r.emit(MetricEvent{Name: EventDispatched, Queue: d.row.Queue, ID: d.row.ID, Deliveries: int(d.row.DeliveriesCount), Bytes: len(d.row.Payload)})
	start := time.Now()
	herr, returned := r.call(d, msg)
	ran := time.Since(start)
	switch {
	case !returned || r.handlerCtx.Err() != nil:
		// Forced stop: the outcome is unknown or raced the stop. The row
		// keeps its lease and is delivered again after it expires. The
		// stop's cause may not have reached d's context yet (a parent
		// cancels its children one by one); hand it over first.
		r.abandoned.Add(1)
		d.cancel(context.Cause(r.handlerCtx))
		r.leases.remove(d)
		return
	case r.leases.isLost(d):
		// A heartbeat found the lease gone and reported it; the newer
		// delivery decides.
		r.leases.remove(d)
		return
	}
	o := r.decide(d, herr)
	o.ran = ran
	o.attempted = true
	r.finish(d, o)
}

// call runs the handler in its own goroutine so a forced stop can abandon
// a handler that ignores its context. returned is false when it was
// abandoned.
func (r *run[T]) call(d *delivery, msg *Message[T]) (err error, returned bool) {
	done := make(chan error, 1)
	go func() { done <- safeHandle(d.ctx, r.s.handler, msg) }()
	select {
	case err := <-done:
		return err, true
	case <-r.handlerCtx.Done():
		select {
		case err := <-done:
			return err, true
		default:
			return nil, false
		}
	}
}

// safeHandle calls h, turning a panic into an error.
func safeHandle[T any](ctx context.Context, h Handler[T], msg *Message[T]) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panicked: %v\n%s", p, debug.Stack())
		}
	}()
	return h(ctx, msg)
}

// decide turns a handler's result into an outcome. The error is the
// handler's: its methods may panic (a typed nil pointer), so its text is
// taken once, safely, and its wrappers are inspected under recover.
func (r *run[T]) decide(d *delivery, err error) outcome {
	if err == nil {
		return outcome{kind: kindAck}
	}
	text := errorText(err)
	rejected, retryAfter, forced := classify(err)
	if rejected {
		return outcome{kind: r.terminalKind(), reason: ReasonRejected, text: text}
	}
	attempt := attempts(d.row.AttemptsCount) + 1
	elapsed := d.sinceFirstAttempt()
	var (
		delay   time.Duration
		ok      bool
		problem error
	)
	if forced {
		// RetryAfter chooses the delay; the strategy's caps still end
		// the delivery.
		delay = retryAfter
		ok, problem = allowRetry(r.s.cfg.Retry, attempt, elapsed, delay, err)
	} else {
		delay, ok, problem = nextDelay(r.s.cfg.Retry, attempt, elapsed, err)
	}
	if problem != nil {
		r.s.log.ErrorContext(d.ctx, "outbox: retry strategy failed; ending the delivery", append(rowAttrs(d), slog.Any("error", problem))...)
		return outcome{kind: r.terminalKind(), reason: ReasonRetryExhausted, text: storableText(text + " (" + problem.Error() + ")")}
	}
	if !ok {
		return outcome{kind: r.terminalKind(), reason: ReasonRetryExhausted, text: text}
	}
	return outcome{kind: kindRetry, delay: delay, text: text}
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

func (r *run[T]) terminalKind() outcomeKind {
	if r.s.cfg.DisableDeadLetter {
		return kindDrop
	}
	return kindDeadLetter
}

// finish stops tracking d and queues its outcome.
func (r *run[T]) finish(d *delivery, o outcome) {
	o.d = d
	r.leases.remove(d)
	r.outcomes <- o
}

// unstart keeps a row a worker took after the stop, for release.
func (r *run[T]) unstart(d *delivery) {
	r.unstartedMu.Lock()
	r.unstarted = append(r.unstarted, d)
	r.unstartedMu.Unlock()
}
