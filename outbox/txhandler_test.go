package outbox

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/db"
)

// txEnv is an outbox with a business table, a queue of orders and a
// queue of follow-ups that handlers publish to.
type txEnv struct {
	*env
	follow *Publisher[string]
}

func setupTx(t *testing.T) *txEnv {
	t.Helper()
	e := setup(t)
	// Room for fastConfig's 4 workers' transactions beside the 3
	// connections a transactional subscriber keeps for its statements.
	e.ob = e.outboxOn(func(c *pgxpool.Config) { c.MaxConns = max(c.MaxConns, 8) })
	if err := e.ob.Check(e.ctx); err != nil { // a connection open, as in a service's warm pool
		t.Fatal(err)
	}
	e.exec(`CREATE TABLE invoices (order_id text PRIMARY KEY, delivery int NOT NULL)`)
	return &txEnv{env: e, follow: newPublisher[string](t, e, "invoiced", nil)}
}

// invoices returns the business rows, by order id.
func (e *txEnv) invoices() map[string]int {
	e.t.Helper()
	rows, err := e.db.Pool.Query(e.ctx, `SELECT order_id, delivery FROM invoices`)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]int{}
	var id string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil }); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// queued returns the payloads in queue, oldest first.
func (e *txEnv) queued(queue string) []string {
	e.t.Helper()
	rows, err := e.db.Pool.Query(e.ctx, `SELECT convert_from(payload, 'UTF8') FROM outbox WHERE queue = $1 ORDER BY id`, queue)
	if err != nil {
		e.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// invoice is a transactional handler: a business row and a follow-up,
// both through tx.
func (e *txEnv) invoice(ctx context.Context, tx pgx.Tx, m *Message[string]) error {
	if _, err := tx.Exec(ctx, `INSERT INTO invoices VALUES ($1, $2)`, m.Payload, m.Deliveries); err != nil {
		return err
	}
	_, err := e.follow.Publish(ctx, tx, "invoiced "+m.Payload, nil)
	return err
}

func startTxSub(t *testing.T, ob *Outbox, queues []string, h TxHandler[string], cfg *SubscriberConfig[string]) *started {
	t.Helper()
	sub, err := NewTxSubscriber(ob, queues, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return start(t, sub)
}

// A handler that succeeds commits its business row, its follow-up and the
// acknowledgement together: until the commit none is visible, after it all
// are.
func TestTxHandlerCommitsItsWritesWithTheAcknowledgement(t *testing.T) {
	t.Parallel()
	e := setupTx(t)
	rec := &events{}
	id := e.publishWith(rawRow("orders", "o-1"))
	var before struct {
		invoices map[string]int
		follows  []string
		present  bool
	}
	checked := make(chan struct{})
	startTxSub(t, e.ob, []string{"orders"}, func(ctx context.Context, tx pgx.Tx, m *Message[string]) error {
		if err := e.invoice(ctx, tx, m); err != nil {
			return err
		}
		before.invoices, before.follows = e.invoices(), e.queued("invoiced")
		_, before.present = e.row(id)
		close(checked)
		return nil
	}, fastConfig[string](rec))
	waitFor(t, checked, "the handler")
	eventually(t, "the acknowledgement", func() bool { return len(rec.named(EventAcked)) == 1 })

	if diff := cmp.Diff(map[string]int{}, before.invoices); diff != "" || len(before.follows) != 0 || !before.present {
		t.Errorf("before the commit: invoices %v, follow-ups %q, order row present %t; want none, none, true", before.invoices, before.follows, before.present)
	}
	if diff := cmp.Diff(map[string]int{"o-1": 1}, e.invoices()); diff != "" {
		t.Errorf("invoices after the commit (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"invoiced o-1"}, e.queued("invoiced")); diff != "" {
		t.Errorf("follow-ups after the commit (-want +got):\n%s", diff)
	}
	if _, ok := e.row(id); ok {
		t.Error("the order row is still in the outbox after its acknowledgement committed")
	}
}

// A handler's error rolls its transaction back: no business row, no
// follow-up; the row is retried, and the retry's transaction commits.
func TestTxHandlerErrorRollsBackAndRetries(t *testing.T) {
	t.Parallel()
	e := setupTx(t)
	rec := &events{}
	e.publishWith(rawRow("orders", "o-1"))
	var calls atomic.Int32
	failed := make(chan struct{})
	release := make(chan struct{})
	startTxSub(t, e.ob, []string{"orders"}, func(ctx context.Context, tx pgx.Tx, m *Message[string]) error {
		if err := e.invoice(ctx, tx, m); err != nil {
			return err
		}
		switch calls.Add(1) {
		case 1:
			return RetryAfter(errors.New("carrier busy"), 50*time.Millisecond)
		case 2:
			panic("handler bug")
		case 3:
			close(failed)
			<-release
		}
		return nil
	}, fastConfig[string](rec))
	waitFor(t, failed, "the third delivery")
	// Two failed deliveries left nothing behind.
	if got := e.invoices(); len(got) != 0 {
		t.Errorf("invoices after two failed deliveries: %v", got)
	}
	if got := e.queued("invoiced"); len(got) != 0 {
		t.Errorf("follow-ups after two failed deliveries: %q", got)
	}
	close(release)
	eventually(t, "the acknowledgement", func() bool { return len(rec.named(EventAcked)) == 1 })
	if diff := cmp.Diff(map[string]int{"o-1": 3}, e.invoices()); diff != "" {
		t.Errorf("invoices (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"invoiced o-1"}, e.queued("invoiced")); diff != "" {
		t.Errorf("follow-ups (-want +got):\n%s", diff)
	}
	if n := len(rec.named(EventRetried)); n != 2 {
		t.Errorf("%d retries recorded, want 2", n)
	}
	if got := e.queued("orders"); len(got) != 0 {
		t.Errorf("orders left: %q", got)
	}
}

// A handler whose lease was taken while it ran rolls back: its business
// row and follow-up never commit, the row stays with the newer claim, and
// the loss is reported.
func TestTxHandlerThatLostItsLeaseRollsBack(t *testing.T) {
	t.Parallel()
	e := setupTx(t)
	rec := &events{}
	id := e.publishWith(rawRow("orders", "o-1"))
	newer := newToken()
	done := make(chan struct{})
	cfg := fastConfig[string](rec)
	cfg.HeartbeatInterval = -1 // the heartbeat would notice the theft first; this test is about the acknowledgement
	startTxSub(t, e.ob, []string{"orders"}, func(ctx context.Context, tx pgx.Tx, m *Message[string]) error {
		defer close(done)
		if err := e.invoice(ctx, tx, m); err != nil {
			return err
		}
		// Another claim takes the row over (its lease ran out, say).
		e.exec(`UPDATE outbox SET acquired_token = $2, lease_expires_at = now() + interval '1 hour' WHERE id = $1`, id, newer)
		return nil
	}, cfg)
	waitFor(t, done, "the handler")
	eventually(t, "the lease loss", func() bool { return len(rec.named(EventLeaseLost)) == 1 })
	if got := e.invoices(); len(got) != 0 {
		t.Errorf("invoices after a lost lease: %v", got)
	}
	if got := e.queued("invoiced"); len(got) != 0 {
		t.Errorf("follow-ups after a lost lease: %q", got)
	}
	row, ok := e.row(id)
	if !ok || row.AcquiredToken != newer {
		t.Errorf("the row after a lost lease: present %t, held by the newer claim %t", ok, row.AcquiredToken == newer)
	}
	if n := len(rec.named(EventAcked)); n != 0 {
		t.Errorf("%d acknowledgements of a row whose lease was lost", n)
	}
}

// A lease that runs out while the handler runs cancels its context: its
// statements fail and nothing commits.
func TestTxHandlerLeaseExpiryCancelsTheTransaction(t *testing.T) {
	t.Parallel()
	e := setupTx(t)
	e.publishWith(rawRow("orders", "o-1"))
	var calls atomic.Int32
	cause := make(chan error, 1)
	rec := &events{}
	cfg := fastConfig[string](rec)
	// Long enough for the first handler to write before its lease runs
	// out, on a loaded machine too.
	cfg.LeaseTTL, cfg.HeartbeatInterval = time.Second, -1
	startTxSub(t, e.ob, []string{"orders"}, func(ctx context.Context, tx pgx.Tx, m *Message[string]) error {
		if calls.Add(1) > 1 {
			return e.invoice(ctx, tx, m)
		}
		// On a loaded machine the lease can run out before the write
		// ends, which then fails for the same cause: either way the
		// context's end is what this delivery reports.
		err := e.invoice(ctx, tx, m)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return err
	}, cfg)
	// The wait takes in the subscriber's start, its first claim and the
	// lease's second: on a loaded machine (the whole suite under the race
	// detector on two cores) that once took more than 10 s. The promise
	// is the cause, not the time.
	if err := waitForWithin(t, cause, "the first delivery's cancellation", time.Minute); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("the first delivery's context ended with %v, want ErrLeaseLost", err)
	}
	eventually(t, "a later delivery's commit", func() bool { return len(rec.named(EventAcked)) == 1 })
	// A later delivery's lease can run out too on a loaded machine, so
	// which one commits is timing's; that only it committed is the promise.
	acked := rec.named(EventAcked)[0].Deliveries
	if acked < 2 {
		t.Errorf("delivery %d committed, want a later one than the first", acked)
	}
	if diff := cmp.Diff(map[string]int{"o-1": acked}, e.invoices()); diff != "" {
		t.Errorf("invoices (-want +got):\n%s", diff)
	}
	if got := e.queued("orders"); len(got) != 0 {
		t.Errorf("orders left: %q", got)
	}
	if diff := cmp.Diff([]string{"invoiced o-1"}, e.queued("invoiced")); diff != "" {
		t.Errorf("follow-ups (-want +got):\n%s", diff)
	}
}

// The handler cannot end the subscriber's transaction; savepoints work.
func TestTxHandlerCannotEndItsTransaction(t *testing.T) {
	t.Parallel()
	e := setupTx(t)
	rec := &events{}
	e.publishWith(rawRow("orders", "o-1"))
	got := make(chan []error, 1)
	startTxSub(t, e.ob, []string{"orders"}, func(ctx context.Context, tx pgx.Tx, m *Message[string]) error {
		errs := []error{tx.Commit(ctx), tx.Rollback(ctx)}
		// A nested transaction that rolls back undoes only its own writes.
		_ = pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			if _, err := sp.Exec(ctx, `INSERT INTO invoices VALUES ('undone', 0)`); err != nil {
				return err
			}
			return errors.New("undo")
		})
		got <- errs
		return e.invoice(ctx, tx, m)
	}, fastConfig[string](rec))
	errs := waitFor(t, got, "the handler")
	for i, err := range errs {
		if !errors.Is(err, ErrTxOwned) {
			t.Errorf("call %d: %v, want ErrTxOwned", i, err)
		}
	}
	eventually(t, "the acknowledgement", func() bool { return len(rec.named(EventAcked)) == 1 })
	if diff := cmp.Diff(map[string]int{"o-1": 1}, e.invoices()); diff != "" {
		t.Errorf("invoices (-want +got):\n%s", diff)
	}
}

// misuseLogs records a subscriber's logs and returns its errors that
// report a handler's misuse of its transaction.
func misuseLogs(cfg *SubscriberConfig[string]) func() []loggedRecord {
	var (
		mu   sync.Mutex
		recs []loggedRecord
	)
	cfg.Logger = slog.New(recordingHandler{mu: &mu, recs: &recs})
	return func() []loggedRecord {
		mu.Lock()
		defer mu.Unlock()
		var out []loggedRecord
		for _, r := range recs {
			if r.level == slog.LevelError && strings.Contains(r.msg, "misused its transaction") {
				out = append(out, r)
			}
		}
		return out
	}
}

// seenByRetry is what a retried delivery finds when it starts: the
// order row and its last error, the business rows and the follow-ups.
type seenByRetry struct {
	present   bool
	lastError string
	invoices  map[string]int
	follows   []string
}

func (e *txEnv) seenByRetry(id int64) seenByRetry {
	row, ok := e.row(id)
	var last string
	if row.LastError != nil {
		last = *row.LastError
	}
	return seenByRetry{present: ok, lastError: last, invoices: e.invoices(), follows: e.queued("invoiced")}
}

// A handler that rolls its transaction back with SQL and returns nil is
// not acknowledged: the subscriber finds the transaction ended, writes
// nothing on its connection (a delete there would commit on its own),
// and retries the row with ErrTxEnded. The rolled-back writes never
// happened; the retry's commit.
func TestTxHandlerThatRollsBackWithSQLIsNotAcknowledged(t *testing.T) {
	t.Parallel()
	txEndedWithSQL(t, "ROLLBACK",
		seenByRetry{present: true, lastError: ErrTxEnded.Error(), invoices: map[string]int{}},
		[]string{"invoiced o-1"})
}

// A handler that commits its transaction with SQL and returns nil is not
// acknowledged either: its writes committed, without the acknowledgement,
// so the row is retried with ErrTxEnded and the retry applies the effect
// again. This is why a handler must not end its transaction.
func TestTxHandlerThatCommitsWithSQLIsNotAcknowledged(t *testing.T) {
	t.Parallel()
	txEndedWithSQL(t, "COMMIT",
		seenByRetry{present: true, lastError: ErrTxEnded.Error(), invoices: map[string]int{"o-1": 1}, follows: []string{"invoiced o-1"}},
		[]string{"invoiced o-1", "invoiced o-1"})
}

// txEndedWithSQL runs a transactional subscriber whose handler's first
// delivery invoices its order, ends the transaction with end (ROLLBACK or
// COMMIT) and returns nil; the next delivery invoices the order (again,
// after a COMMIT) and is acknowledged. It checks that the first delivery
// was retried, not acknowledged, that the second found seen, that the
// invoice ends as the second delivery's and the follow-ups as follows,
// and that the misuse was logged once.
func txEndedWithSQL(t *testing.T, end string, seen seenByRetry, follows []string) {
	t.Helper()
	e := setupTx(t)
	rec := &events{}
	id := e.publishWith(rawRow("orders", "o-1"))
	cfg := fastConfig[string](rec)
	cfg.Retry = ConstantRetry{Delay: 10 * time.Millisecond}
	misuses := misuseLogs(cfg)
	found := make(chan seenByRetry, 1)
	startTxSub(t, e.ob, []string{"orders"}, func(ctx context.Context, tx pgx.Tx, m *Message[string]) error {
		if m.Deliveries > 1 {
			found <- e.seenByRetry(id)
			if _, err := tx.Exec(ctx, `INSERT INTO invoices VALUES ($1, $2)
				ON CONFLICT (order_id) DO UPDATE SET delivery = excluded.delivery`, m.Payload, m.Deliveries); err != nil {
				return err
			}
			_, err := e.follow.Publish(ctx, tx, "invoiced "+m.Payload, nil)
			return err
		}
		if err := e.invoice(ctx, tx, m); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, end)
		return err
	}, cfg)
	eventually(t, "the first delivery's outcome", func() bool { return len(rec.named(EventRetried))+len(rec.named(EventAcked)) > 0 })
	if acked := rec.named(EventAcked); len(acked) > 0 && acked[0].Deliveries == 1 {
		t.Fatalf("the delivery whose handler ran %s was acknowledged", end)
	}
	got := waitFor(t, found, "the second delivery")
	if diff := cmp.Diff(seen, got, cmp.AllowUnexported(seenByRetry{}), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("what the second delivery found (-want +got):\n%s", diff)
	}
	eventually(t, "the acknowledgement", func() bool { return len(rec.named(EventAcked)) == 1 })
	if diff := cmp.Diff(map[string]int{"o-1": 2}, e.invoices()); diff != "" {
		t.Errorf("invoices (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(follows, e.queued("invoiced")); diff != "" {
		t.Errorf("follow-ups (-want +got):\n%s", diff)
	}
	if n := len(rec.named(EventRetried)); n != 1 {
		t.Errorf("%d retries recorded, want 1", n)
	}
	if n := len(misuses()); n != 1 {
		t.Errorf("%d errors logged about the handler's misuse, want 1", n)
	}
}

// A handler that swallows a failed statement and returns nil is not
// acknowledged: nothing of its aborted transaction can commit, and the
// row is retried with ErrTxAborted. A handler that returns the failed
// statement's error is no misuse.
func TestTxHandlerThatReturnsNilFromAnAbortedTransactionIsNotAcknowledged(t *testing.T) {
	t.Parallel()
	e := setupTx(t)
	rec := &events{}
	id := e.publishWith(rawRow("orders", "o-1"))
	e.exec(`INSERT INTO invoices VALUES ('o-1', 0)`)
	cfg := fastConfig[string](rec)
	cfg.Retry = ConstantRetry{Delay: 10 * time.Millisecond}
	misuses := misuseLogs(cfg)
	seen := make(chan seenByRetry, 3)
	startTxSub(t, e.ob, []string{"orders"}, func(ctx context.Context, tx pgx.Tx, m *Message[string]) error {
		if m.Deliveries > 1 {
			seen <- e.seenByRetry(id)
		}
		switch m.Deliveries {
		case 1:
			_ = e.invoice(ctx, tx, m) // o-1 is invoiced already
			return nil
		case 2:
			return e.invoice(ctx, tx, m)
		}
		if _, err := tx.Exec(ctx, `UPDATE invoices SET delivery = $2 WHERE order_id = $1`, m.Payload, m.Deliveries); err != nil {
			return err
		}
		_, err := e.follow.Publish(ctx, tx, "invoiced "+m.Payload, nil)
		return err
	}, cfg)
	if got := waitFor(t, seen, "the second delivery"); !got.present || got.lastError != ErrTxAborted.Error() {
		t.Errorf("the second delivery found the row present %t, its last error %q; want present, %q", got.present, got.lastError, ErrTxAborted.Error())
	}
	if got := waitFor(t, seen, "the third delivery"); !got.present || !strings.Contains(got.lastError, "duplicate key") {
		t.Errorf("the third delivery found the row present %t, its last error %q; want present, the handler's error", got.present, got.lastError)
	}
	eventually(t, "the acknowledgement", func() bool { return len(rec.named(EventAcked)) == 1 })
	if diff := cmp.Diff(map[string]int{"o-1": 3}, e.invoices()); diff != "" {
		t.Errorf("invoices (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"invoiced o-1"}, e.queued("invoiced")); diff != "" {
		t.Errorf("follow-ups (-want +got):\n%s", diff)
	}
	if n := len(misuses()); n != 1 {
		t.Errorf("%d errors logged about the handler's misuse, want 1 (the nil returned from an aborted transaction)", n)
	}
}

// A key's rows go one at a time, in order, through transactional handlers
// too: each commit hands the key to its next row.
func TestTxHandlerKeepsPerKeyOrder(t *testing.T) {
	t.Parallel()
	e := setupTx(t)
	pub := newPublisher[string](t, e.env, "orders", nil)
	want := []string{"a1", "a2", "a3", "a4", "a5"}
	for _, p := range want {
		if _, err := pub.Publish(e.ctx, e.pubPool, p, &PublishOpts{OrderingKey: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	var order []string
	var running atomic.Int32
	startTxSub(t, e.ob, []string{"orders"}, func(ctx context.Context, tx pgx.Tx, m *Message[string]) error {
		if running.Add(1) > 1 {
			t.Errorf("%s ran beside another row of its key", m.Payload)
		}
		defer running.Add(-1)
		order = append(order, m.Payload)
		return e.invoice(ctx, tx, m)
	}, fastConfig[string](nil))
	eventually(t, "every row", func() bool { return len(e.queued("orders")) == 0 })
	if diff := cmp.Diff(want, order); diff != "" {
		t.Errorf("handled (-want +got):\n%s", diff)
	}
}

// Claims by row lock cannot serve a transactional handler, and a nil
// handler is refused.
func TestNewTxSubscriberRefusesBadInput(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := func(context.Context, pgx.Tx, *Message[string]) error { return nil }
	_, err := NewTxSubscriber(e.ob, []string{"q"}, h, &SubscriberConfig[string]{LockWindow: time.Second})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "LockWindow" {
		t.Errorf("LockWindow 1s: %v, want a ConfigError on LockWindow", err)
	}
	_, err = NewTxSubscriber[string](e.ob, []string{"q"}, nil, nil)
	if !errors.As(err, &ce) || ce.Field != "handler" {
		t.Errorf("nil handler: %v, want a ConfigError on handler", err)
	}
	if _, err := NewTxSubscriber(e.ob, []string{"q"}, h, &SubscriberConfig[string]{LockWindow: -1}); err != nil {
		t.Errorf("LockWindow -1: %v", err)
	}
}

// rawRow is a due row of queue with payload as it is, no headers.
func rawRow(queue, payload string) db.PublishParams {
	return db.PublishParams{Queue: queue, Payload: []byte(payload)}
}

// A transactional subscriber's workers default to what its pool can hold
// beside a claim, a heartbeat and an outcome write, and say so when that
// is fewer than WorkersDefault; more workers than that, or a pool with no
// room for one, are refused with the MaxConns they need.
func TestTxSubscriberWorkersFitThePool(t *testing.T) {
	t.Parallel()
	h := func(context.Context, pgx.Tx, *Message[string]) error { return nil }
	ob := func(maxConns int32) *Outbox {
		o, err := New(unreachablePoolOf(t, maxConns), nil)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	var logs logLines
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	sub, err := NewTxSubscriber(ob(6), []string{"q"}, h, &SubscriberConfig[string]{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	if sub.cfg.Workers != 3 || !strings.Contains(logs.String(), "want_max_conns=19") || strings.Count(logs.String(), "\n") != 1 {
		t.Errorf("a pool of 6: %d workers, logs %q; want 3 and one line asking for 19", sub.cfg.Workers, logs.String())
	}
	sub, err = NewTxSubscriber(ob(19), []string{"q"}, h, &SubscriberConfig[string]{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if sub.cfg.Workers != WorkersDefault || strings.Count(logs.String(), "\n") != 1 {
		t.Errorf("a pool of 19: %d workers, logs %q; want %d and nothing more", sub.cfg.Workers, logs.String(), WorkersDefault)
	}
	for _, tc := range []struct {
		name     string
		maxConns int32
		workers  int
		field    string
		says     []string
	}{
		{"more workers than the pool holds", 6, 8, "SubscriberConfig.Workers", []string{"needs 11 pool connections", "MaxConns 6", "pool_max_conns=11", "pgxpool.Config.MaxConns", "lower Workers to 3"}},
		{"as many workers as connections", 4, 4, "SubscriberConfig.Workers", []string{"needs 7", "MaxConns 4", "pool_max_conns=7"}},
		{"a pool with no room for a handler", 3, 0, "pool", []string{"MaxConns 3", "at least 4", "pool_max_conns=4"}},
		{"one worker on a pool of three", 3, 1, "pool", []string{"MaxConns 3", "pool_max_conns=4"}},
	} {
		_, err := NewTxSubscriber(ob(tc.maxConns), []string{"q"}, h, &SubscriberConfig[string]{Workers: tc.workers})
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("%s: %v; want a *ConfigError on %s", tc.name, err, tc.field)
			continue
		}
		for _, want := range tc.says {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %q does not say %q", tc.name, err, want)
			}
		}
	}
	if _, err := NewTxSubscriber(ob(7), []string{"q"}, h, &SubscriberConfig[string]{Workers: 4}); err != nil {
		t.Errorf("4 workers on a pool of 7: %v", err)
	}
}
