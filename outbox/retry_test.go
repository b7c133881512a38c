package outbox

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/outboxgen/outboxgen/db"
)

func TestRetryStrategies(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	tests := []struct {
		name    string
		s       RetryStrategy
		attempt int
		elapsed time.Duration
		want    time.Duration
		ok      bool
	}{
		{"no retry", NoRetry{}, 1, 0, 0, false},
		{"constant", ConstantRetry{Delay: time.Minute}, 7, 0, time.Minute, true},
		{"constant at max attempts", ConstantRetry{Delay: time.Minute, MaxAttempts: 3}, 3, 0, time.Minute, false},
		{"constant past max total delay", ConstantRetry{Delay: time.Minute, MaxTotalDelay: time.Hour}, 2, 59*time.Minute + time.Second, time.Minute, false},
		{"linear", LinearRetry{Initial: time.Second, Step: 2 * time.Second}, 3, 0, 5 * time.Second, true},
		{"linear capped", LinearRetry{Initial: time.Second, Step: time.Hour, MaxDelay: time.Minute}, 3, 0, time.Minute, true},
		{"exponential", &ExponentialRetry{Initial: time.Second, Multiplier: 3}, 3, 0, 9 * time.Second, true},
		{"exponential capped", &ExponentialRetry{Initial: time.Second, Multiplier: 2, MaxDelay: 5 * time.Second}, 10, 0, 5 * time.Second, true},
		{"exponential overflow", &ExponentialRetry{Initial: time.Hour, Multiplier: 10}, 40, 0, 0, false},
	}
	for _, tt := range tests {
		got, ok, problem := nextDelay(tt.s, tt.attempt, tt.elapsed, boom)
		if ok != tt.ok || (ok && got != tt.want) || problem != nil {
			t.Errorf("%s: NextDelay(%d) = %v, %v, %v; want %v, %v", tt.name, tt.attempt, got, ok, problem, tt.want, tt.ok)
		}
	}
	def := DefaultRetry()
	for range 100 {
		d, ok := def.NextDelay(1, 0, boom)
		if !ok || d < 800*time.Millisecond || d > 1200*time.Millisecond {
			t.Fatalf("default first delay %v, %v; want 1s ± 20%%", d, ok)
		}
	}
	if _, ok := def.NextDelay(10, 0, boom); ok {
		t.Error("default strategy retries after 10 attempts")
	}
	if _, ok, problem := nextDelay(panicRetry{}, 1, 0, boom); ok || problem == nil {
		t.Errorf("a panicking strategy: ok %v, problem %v; want give up with a problem", ok, problem)
	}
}

type panicRetry struct{}

func (panicRetry) NextDelay(int, time.Duration, error) (time.Duration, bool) { panic("strategy bug") }

// dlqRow reads the dead-letter row of id.
func (e *env) dlqRow(id int64) (db.OutboxDlq, bool) {
	e.t.Helper()
	var r db.OutboxDlq
	err := e.db.Pool.QueryRow(e.ctx, `SELECT id, queue, deliveries_count, attempts_count, failure_reason, last_error
		FROM outbox_dlq WHERE id = $1`, id).Scan(&r.ID, &r.Queue, &r.DeliveriesCount, &r.AttemptsCount, &r.FailureReason, &r.LastError)
	if err != nil {
		return r, false
	}
	return r, true
}

// failing runs a subscriber of queue whose handler returns result.
func failing(t *testing.T, e *env, queue string, cfg *SubscriberConfig[string], result func(m *Message[string]) error) {
	t.Helper()
	startSub(t, e.ob, []string{queue}, func(_ context.Context, m *Message[string]) error { return result(m) }, cfg)
}

func TestRetryDelayFollowsTheStrategy(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id, err := newPublisher[string](t, e, "r", nil).Publish(e.ctx, e.pubPool, "x", nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := &events{}
	cfg := fastConfig[string](rec)
	cfg.Retry = LinearRetry{Initial: time.Hour, Step: time.Hour, MaxAttempts: 3}
	before := e.serverNow()
	failing(t, e, "r", cfg, func(*Message[string]) error { return errors.New("try later") })
	eventually(t, "the retry", func() bool { return len(rec.named(EventRetried)) == 1 })
	after := e.serverNow()
	row, _ := e.row(id)
	if row.AttemptsCount != 1 || row.AcquiredToken.Valid {
		t.Errorf("attempts %d lease %v; want 1 and none", row.AttemptsCount, row.AcquiredToken)
	}
	if lo, hi := before.Add(time.Hour), after.Add(time.Hour); row.NextAttemptAt.Before(lo) || row.NextAttemptAt.After(hi) {
		t.Errorf("next attempt %v, want within [%v, %v]", row.NextAttemptAt, lo, hi)
	}
	if got := rec.named(EventRetried)[0]; got.Delay != time.Hour || got.ID != id {
		t.Errorf("retried event %+v", got)
	}

	// The second failure waits Initial+Step; the third (MaxAttempts) ends it.
	e.exec("UPDATE outbox SET next_attempt_at = now() WHERE id = $1", id)
	eventually(t, "the second retry", func() bool { return len(rec.named(EventRetried)) == 2 })
	if got := rec.named(EventRetried)[1]; got.Delay != 2*time.Hour {
		t.Errorf("second delay %v, want 2h", got.Delay)
	}
	e.exec("UPDATE outbox SET next_attempt_at = now() WHERE id = $1", id)
	eventually(t, "the dead letter", func() bool { return len(rec.named(EventDeadLettered)) == 1 })
	got, ok := e.dlqRow(id)
	if !ok {
		t.Fatal("no DLQ row")
	}
	want := db.OutboxDlq{ID: id, Queue: "r", DeliveriesCount: 3, AttemptsCount: 3, FailureReason: ReasonRetryExhausted, LastError: ptr("try later")}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("DLQ row (-want +got):\n%s", diff)
	}
}

func ptr[T any](v T) *T { return &v }

func TestRetryAfterRejectAndPanics(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher[string](t, e, "mixed", nil)
	ids, err := pub.PublishBatch(e.ctx, e.pubPool, []string{"later", "reject", "panic"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := &events{}
	cfg := fastConfig[string](rec)
	cfg.Retry = NoRetry{}
	failing(t, e, "mixed", cfg, func(m *Message[string]) error {
		switch m.Payload {
		case "later":
			return RetryAfter(errors.New("busy"), 2*time.Hour)
		case "reject":
			return Reject(errors.New("invalid order"))
		default:
			panic("handler bug")
		}
	})
	eventually(t, "three outcomes", func() bool {
		return len(rec.named(EventRetried)) == 1 && len(rec.named(EventDeadLettered)) == 2
	})
	if got := rec.named(EventRetried)[0]; got.ID != ids[0] || got.Delay != 2*time.Hour {
		t.Errorf("RetryAfter: %+v", got)
	}
	rej, _ := e.dlqRow(ids[1])
	if rej.FailureReason != ReasonRejected || rej.AttemptsCount != 1 || rej.LastError == nil || *rej.LastError != "rejected: invalid order" {
		t.Errorf("rejected row in DLQ: %+v (last error %v)", rej, deref(rej.LastError))
	}
	pan, _ := e.dlqRow(ids[2])
	if pan.FailureReason != ReasonRetryExhausted || pan.LastError == nil || !strings.Contains(*pan.LastError, "handler panicked: handler bug") {
		t.Errorf("panicked row in DLQ: %+v (last error %v)", pan, deref(pan.LastError))
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

func TestMaxDeliveriesEndsTheRowBeforeItsHandler(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id, err := newPublisher[string](t, e, "crashy", nil).Publish(e.ctx, e.pubPool, "x", nil)
	if err != nil {
		t.Fatal(err)
	}
	e.exec("UPDATE outbox SET deliveries_count = 3 WHERE id = $1", id) // three crashed deliveries
	rec := &events{}
	cfg := fastConfig[string](rec)
	cfg.MaxDeliveries = 3
	ran := make(chan struct{}, 1)
	failing(t, e, "crashy", cfg, func(*Message[string]) error { ran <- struct{}{}; return nil })
	eventually(t, "the dead letter", func() bool { return len(rec.named(EventDeadLettered)) == 1 })
	if got := rec.named(EventDispatched); len(got) != 0 {
		t.Errorf("dispatched despite MaxDeliveries: %v", got)
	}
	select {
	case <-ran:
		t.Error("handler ran")
	default:
	}
	got, _ := e.dlqRow(id)
	if got.FailureReason != ReasonMaxDeliveries || got.DeliveriesCount != 4 || got.AttemptsCount != 0 {
		t.Errorf("DLQ row %+v", got)
	}
}

type order2 struct {
	ID string `json:"id"`
}

func TestUndecodableRowsAreDeadLetteredNotRetried(t *testing.T) {
	t.Parallel()
	e := setup(t)
	bytesID, err := newPublisher[[]byte](t, e, "orders", nil).Publish(e.ctx, e.pubPool, []byte("not json"), nil)
	if err != nil {
		t.Fatal(err)
	}
	e.exec(`INSERT INTO outbox (queue, payload, headers) VALUES ('orders', '{broken', '{"content-type": "application/json"}')`)
	e.exec(`INSERT INTO outbox (queue, payload, headers) VALUES ('orders', '{}', '{"content-type": 5}')`)
	rec := &events{}
	startSub(t, e.ob, []string{"orders"}, func(context.Context, *Message[order2]) error {
		t.Error("handler ran for an undecodable row")
		return nil
	}, fastConfig[order2](rec))
	eventually(t, "three dead letters", func() bool { return len(rec.named(EventDeadLettered)) == 3 })
	for _, ev := range rec.named(EventDeadLettered) {
		if ev.Reason != ReasonDecodeError {
			t.Errorf("row %d: reason %q", ev.ID, ev.Reason)
		}
	}
	got, _ := e.dlqRow(bytesID)
	if got.AttemptsCount != 0 || !strings.Contains(deref(got.LastError), `content type "application/octet-stream"`) {
		t.Errorf("DLQ row %+v: %s", got, deref(got.LastError))
	}
	if len(rec.named(EventRetried)) != 0 || len(rec.named(EventDispatched)) != 0 {
		t.Error("undecodable rows were retried or dispatched")
	}
	if n := e.count("outbox"); n != 0 {
		t.Errorf("%d rows left", n)
	}
}

func TestTerminalRowsAreDeletedWhenDeadLetteringIsOff(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id, err := newPublisher[string](t, e, "q", nil).Publish(e.ctx, e.pubPool, "x", nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := &events{}
	cfg := fastConfig[string](rec)
	cfg.DisableDeadLetter = true
	failing(t, e, "q", cfg, func(*Message[string]) error { return Reject(errors.New("no")) })
	eventually(t, "the terminal event", func() bool { return len(rec.named(EventTerminal)) == 1 })
	want := []MetricEvent{{Name: EventTerminal, Subscriber: "q", Queue: "q", ID: id, Deliveries: 1, Reason: ReasonRejected}}
	if diff := cmp.Diff(want, rec.named(EventTerminal), cmpopts.IgnoreFields(MetricEvent{}, "Duration")); diff != "" {
		t.Errorf("terminal events (-want +got):\n%s", diff)
	}
	if e.count("outbox") != 0 || e.count("outbox_dlq") != 0 {
		t.Error("terminal row not deleted, or dead-lettered although dead-lettering is off")
	}
}

// A handler that always asks for RetryAfter still ends after the
// strategy's MaxAttempts, and the dead letter keeps the handler's error.
func TestRetryAfterRespectsMaxAttempts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id := e.publish("q")
	var calls atomic.Int32
	cfg := fastConfig[string](nil)
	cfg.Retry = &ExponentialRetry{Initial: time.Millisecond, Multiplier: 2, MaxAttempts: 3}
	failing(t, e, "q", cfg, func(*Message[string]) error {
		calls.Add(1)
		return RetryAfter(errors.New("downstream busy"), 10*time.Millisecond)
	})
	eventually(t, "the dead letter", func() bool { _, ok := e.dlqRow(id); return ok })
	got, _ := e.dlqRow(id)
	want := db.OutboxDlq{ID: id, Queue: "q", DeliveriesCount: 3, AttemptsCount: 3, FailureReason: ReasonRetryExhausted,
		LastError: ptr("retry after 10ms: downstream busy")}
	if diff := cmp.Diff(want, got); diff != "" || calls.Load() != 3 {
		t.Errorf("handler ran %d times; dead letter (-want +got):\n%s", calls.Load(), diff)
	}
}

// A row that ends by MaxDeliveries (its handler crashed the process, say)
// keeps the last error its handler returned before that.
func TestMaxDeliveriesDeadLetterKeepsTheHandlersLastError(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.publish("q")
	r := e.claim(1, "q")[0]
	if _, err := e.q.MarkPendingWithLease(e.ctx, db.MarkPendingWithLeaseParams{ID: r.ID, Token: token(t, r), LastError: ptr("payment gateway said no")}); err != nil {
		t.Fatal(err)
	}
	e.exec("UPDATE outbox SET deliveries_count = 3 WHERE id = $1", r.ID)
	cfg := fastConfig[string](nil)
	cfg.MaxDeliveries = 3
	failing(t, e, "q", cfg, func(*Message[string]) error { return nil })
	eventually(t, "the dead letter", func() bool { _, ok := e.dlqRow(r.ID); return ok })
	got, _ := e.dlqRow(r.ID)
	if want := "claimed 4 times; MaxDeliveries is 3; last handler error: payment gateway said no"; deref(got.LastError) != want {
		t.Errorf("last_error = %q, want %q", deref(got.LastError), want)
	}
}

func TestRetrySettingsAreValidated(t *testing.T) {
	t.Parallel()
	ob, err := New(unreachablePool(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	h := func(context.Context, *Message[string]) error { return nil }
	exp := func(f func(r *ExponentialRetry)) *ExponentialRetry {
		r := DefaultRetry()
		f(r)
		return r
	}
	tests := []struct {
		name  string
		s     RetryStrategy
		field string // "" when valid
	}{
		{"default", DefaultRetry(), ""},
		{"no retry", NoRetry{}, ""},
		{"custom strategies are not checked", panicRetry{}, ""},
		{"exponential minimal", &ExponentialRetry{Initial: time.Nanosecond, Multiplier: 1}, ""},
		{"exponential at the edges", &ExponentialRetry{Initial: time.Second, Multiplier: 1, MaxDelay: time.Second, Jitter: 1}, ""},
		{"exponential zero initial", exp(func(r *ExponentialRetry) { r.Initial = 0 }), ""},
		{"exponential zero initial below a short max delay", &ExponentialRetry{MaxDelay: time.Millisecond}, ""},
		{"exponential initial and max attempts only", &ExponentialRetry{Initial: time.Second, MaxAttempts: 5}, ""},
		{"exponential zero value", &ExponentialRetry{}, ""},
		{"exponential negative initial", exp(func(r *ExponentialRetry) { r.Initial = -time.Second }), "Initial"},
		{"exponential zero multiplier", exp(func(r *ExponentialRetry) { r.Multiplier = 0 }), ""},
		{"exponential negative multiplier", exp(func(r *ExponentialRetry) { r.Multiplier = -1 }), "Multiplier"},
		{"exponential multiplier below 1", exp(func(r *ExponentialRetry) { r.Multiplier = 0.5 }), "Multiplier"},
		{"exponential NaN multiplier", exp(func(r *ExponentialRetry) { r.Multiplier = math.NaN() }), "Multiplier"},
		{"exponential infinite multiplier", exp(func(r *ExponentialRetry) { r.Multiplier = math.Inf(1) }), "Multiplier"},
		{"exponential negative max delay", exp(func(r *ExponentialRetry) { r.MaxDelay = -1 }), "MaxDelay"},
		{"exponential max delay below initial", exp(func(r *ExponentialRetry) { r.MaxDelay = r.Initial - 1 }), "MaxDelay"},
		{"exponential negative jitter", exp(func(r *ExponentialRetry) { r.Jitter = -0.1 }), "Jitter"},
		{"exponential jitter above 1", exp(func(r *ExponentialRetry) { r.Jitter = 1.5 }), "Jitter"},
		{"exponential NaN jitter", exp(func(r *ExponentialRetry) { r.Jitter = math.NaN() }), "Jitter"},
		{"exponential negative max attempts", exp(func(r *ExponentialRetry) { r.MaxAttempts = -1 }), "MaxAttempts"},
		{"exponential negative max total delay", exp(func(r *ExponentialRetry) { r.MaxTotalDelay = -time.Second }), "MaxTotalDelay"},
		{"constant", ConstantRetry{Delay: time.Second, MaxAttempts: 3, MaxTotalDelay: time.Minute}, ""},
		{"constant zero delay", ConstantRetry{}, ""},
		{"constant by pointer", &ConstantRetry{Delay: time.Second}, ""},
		{"constant negative delay", ConstantRetry{Delay: -time.Second}, "Delay"},
		{"constant negative delay by pointer", &ConstantRetry{Delay: -time.Second}, "Delay"},
		{"constant negative max attempts", ConstantRetry{MaxAttempts: -1}, "MaxAttempts"},
		{"constant negative max total delay", ConstantRetry{MaxTotalDelay: -1}, "MaxTotalDelay"},
		{"linear", LinearRetry{Initial: time.Second, Step: time.Second, MaxDelay: time.Second}, ""},
		{"linear from zero", LinearRetry{Step: time.Second}, ""},
		{"linear negative initial", LinearRetry{Initial: -1}, "Initial"},
		{"linear negative step", LinearRetry{Initial: time.Second, Step: -1}, "Step"},
		{"linear negative max delay", LinearRetry{MaxDelay: -1}, "MaxDelay"},
		{"linear max delay below initial", LinearRetry{Initial: time.Minute, MaxDelay: time.Second}, "MaxDelay"},
		{"linear negative max attempts", LinearRetry{MaxAttempts: -1}, "MaxAttempts"},
		{"linear negative max total delay", LinearRetry{MaxTotalDelay: -1}, "MaxTotalDelay"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewSubscriber(ob, []string{"q"}, h, &SubscriberConfig[string]{Retry: tt.s})
			if tt.field == "" {
				if err != nil {
					t.Fatalf("NewSubscriber: %v; want no error", err)
				}
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("NewSubscriber: %v; want a *ConfigError", err)
			}
			if diff := cmp.Diff("SubscriberConfig.Retry."+tt.field, ce.Field); diff != "" {
				t.Errorf("field (-want +got):\n%s", diff)
			}
		})
	}
}

// Zero fields of the built-in strategies take the defaults their doc
// comments give: ExponentialRetry's Initial and Multiplier; every other
// zero means no wait, no step, no cap or no jitter.
func TestZeroRetryFieldsTakeTheirDocumentedDefaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		s       RetryStrategy
		attempt int
		want    time.Duration
		ok      bool
	}{
		{"exponential zero value, first retry", &ExponentialRetry{}, 1, RetryInitialDefault, true},
		{"exponential zero value doubles", &ExponentialRetry{}, 3, 4 * RetryInitialDefault, true},
		{"exponential zero value has no cap", &ExponentialRetry{}, 10, 512 * RetryInitialDefault, true},
		{"exponential initial and max attempts", &ExponentialRetry{Initial: 3 * time.Second, MaxAttempts: 5}, 2, 6 * time.Second, true},
		{"exponential initial and max attempts, at the cap", &ExponentialRetry{Initial: 3 * time.Second, MaxAttempts: 5}, 5, 48 * time.Second, false},
		{"exponential multiplier only", &ExponentialRetry{Multiplier: 3}, 3, 9 * RetryInitialDefault, true},
		{"exponential max delay below the default initial", &ExponentialRetry{MaxDelay: 200 * time.Millisecond}, 1, 200 * time.Millisecond, true},
		{"exponential max delay caps the default", &ExponentialRetry{MaxDelay: 5 * time.Second}, 6, 5 * time.Second, true},
		{"constant zero value retries at once", ConstantRetry{}, 100, 0, true},
		{"constant max attempts only", ConstantRetry{MaxAttempts: 3}, 3, 0, false},
		{"linear zero value retries at once", LinearRetry{}, 5, 0, true},
		{"linear step only starts at once", LinearRetry{Step: time.Second}, 1, 0, true},
		{"linear step only", LinearRetry{Step: time.Second}, 3, 2 * time.Second, true},
		{"linear initial only is constant", LinearRetry{Initial: 2 * time.Second}, 4, 2 * time.Second, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := tt.s.NextDelay(tt.attempt, 0, errors.New("x"))
			if diff := cmp.Diff([]any{tt.want, tt.ok}, []any{got, ok}); diff != "" {
				t.Errorf("NextDelay(%d) (-want +got):\n%s", tt.attempt, diff)
			}
		})
	}
}

// A subscriber's Config shows an ExponentialRetry with its defaults.
func TestSubscriberConfigShowsExponentialRetryDefaults(t *testing.T) {
	t.Parallel()
	ob, err := New(unreachablePool(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	h := func(context.Context, *Message[string]) error { return nil }
	s, err := NewSubscriber(ob, []string{"q"}, h, &SubscriberConfig[string]{Retry: &ExponentialRetry{MaxAttempts: 5, Jitter: 0.1}})
	if err != nil {
		t.Fatalf("NewSubscriber: %v", err)
	}
	want := &ExponentialRetry{Initial: RetryInitialDefault, Multiplier: RetryMultiplierDefault, MaxAttempts: 5, Jitter: 0.1}
	if diff := cmp.Diff(RetryStrategy(want), s.Config().Retry); diff != "" {
		t.Errorf("Config().Retry (-want +got):\n%s", diff)
	}
}
