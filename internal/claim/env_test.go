package claim

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/lease"
	"github.com/outboxgen/outboxgen/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is one test's outbox (pgtest.NewOutbox).
type env struct {
	t   *testing.T
	ctx context.Context
	*pgtest.Outbox
}

func setup(t *testing.T) *env {
	t.Helper()
	o := pgtest.NewOutbox(t)
	return &env{t: t, ctx: t.Context(), Outbox: o}
}

// publish inserts a row of queue and returns its id.
func (e *env) publish(queue string) int64 {
	e.t.Helper()
	return e.Publish(e.t, queue)
}

// unlocked counts the rows of e's outbox that no transaction has locked.
func (e *env) unlocked() int {
	e.t.Helper()
	tx, err := e.DB.Pool.Begin(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var n int
	if err := tx.QueryRow(e.ctx, `SELECT count(*) FROM (SELECT id FROM outbox FOR UPDATE SKIP LOCKED) AS f`).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// env returns the Env of a run of queues on e's pool, with the public
// defaults, that claims by lock only (MinLockedClaim 0) and drops what it
// is handed.
func (e *env) env(queues ...string) *Env {
	tracker := lease.NewTracker(30 * time.Second)
	return &Env{
		Queues: queues, LeaseTTL: 30 * time.Second, LockWindow: time.Second, QueryTimeout: 30 * time.Second,
		MinFetchInterval: 50 * time.Millisecond, MaxFetchInterval: 5 * time.Second, FetchBatchSize: 100, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Pool: e.DB.Pool, Queries: e.Queries, Leases: &tracker,
		HandlerCtx: e.ctx, Writes: e.ctx, Ends: e.ctx, Stopping: make(chan struct{}),
		Hand: func([]*lease.Delivery) {}, Outcomes: make(chan lease.Outcome, 100),
		Report: func([]lease.Outcome, map[lease.Lease]bool) {}, Wake: func() {},
	}
}

// pool returns a pool of e's database with maxConns connections.
func (e *env) pool(maxConns int32) *pgxpool.Pool {
	e.t.Helper()
	cfg := e.DB.Pool.Config()
	cfg.MaxConns = maxConns
	p, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(p.Close)
	return p
}

// harness is a Claimer of a run whose workers never start: it keeps the
// rows it is handed. Its claims end when the test does, or at stop.
type harness struct {
	Claimer
	stopping chan struct{}
	once     sync.Once
	mu       sync.Mutex
	handed   []*lease.Delivery
}

// harness returns a Claimer of queues set chooses.
func (e *env) harness(set func(*Env), queues ...string) *harness {
	h := &harness{stopping: make(chan struct{})}
	env := e.env(queues...)
	set(env)
	env.Stopping = h.stopping
	env.Hand = func(ds []*lease.Delivery) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.handed = append(h.handed, ds...)
	}
	h.Claimer = New(env)
	e.t.Cleanup(h.stop)
	return h
}

// stop ends the harness's claims by lock and waits for their ends.
func (h *harness) stop() {
	h.once.Do(func() { close(h.stopping) })
	h.Ended()
}

// claim runs one claim of up to n rows and returns the rows it handed
// out.
func (h *harness) claim(t *testing.T, ctx context.Context, n int32) []*lease.Delivery {
	t.Helper()
	h.mu.Lock()
	before := len(h.handed)
	h.mu.Unlock()
	if _, err := h.Claim(ctx, n); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.handed[before:])
}

// ack acknowledges ds, rows of claims by lock; rows of claims by lease
// keep their leases (the harness writes no outcome).
func ack(ds []*lease.Delivery) {
	for _, d := range ds {
		if d.Batch.Hold == nil {
			continue
		}
		d.Batch.Hold.Keep(lease.Outcome{D: d, Kind: lease.Ack})
	}
}

// ids returns the ids of the rows the harness was handed, in order.
func (h *harness) ids() []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ids []int64
	for _, d := range h.handed {
		ids = append(ids, d.Row.ID)
	}
	slices.Sort(ids)
	return ids
}

// kinds are the claimers New chooses, each with the setting that
// chooses it.
var kinds = []struct {
	name string
	set  func(*Env)
}{
	{"*claim.byLease", func(env *Env) { env.LockWindow = -1 }},
	{"*claim.byLock", func(env *Env) { env.MinLockedClaim = 0 }},
	{"*claim.mixed", func(env *Env) { env.MinLockedClaim = 32 }},
}

// forEachKind runs test as a parallel subtest for every kind of claimer,
// and checks that set chooses it.
func forEachKind(t *testing.T, test func(t *testing.T, e *env, set func(*Env))) {
	t.Helper()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			env := e.env("q")
			k.set(env)
			if got := fmt.Sprintf("%T", New(env)); got != k.name {
				t.Fatalf("the setting chooses %s; want %s", got, k.name)
			}
			test(t, e, k.set)
		})
	}
}
