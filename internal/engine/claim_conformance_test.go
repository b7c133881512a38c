package engine

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
)

// The claim conformance suite through the engine's run: each promise a
// claim keeps, checked for each claim.Claimer (byLease, byLock) and for
// the default mixture of them (mixed), as claim.New chooses them from the
// subscriber's settings. Package claim checks the promises a Claimer
// keeps alone; the outbox package's conformance suite checks them
// through the public API, with kills, half-open connections and crashes.

// claimerKind is one claimer a subscriber can run, and how to choose it.
type claimerKind struct {
	name string // the claimer's type, as claim.New returns it
	set  func(s *Subscriber)
}

var claimerKinds = []claimerKind{
	{"*claim.byLease", func(s *Subscriber) { s.LockWindow = -1 }},
	{"*claim.byLock", func(s *Subscriber) { s.MinLockedClaim = 0 }},
	{"*claim.mixed", func(s *Subscriber) { s.MinLockedClaim = 32 }},
}

// forEachClaimer runs test as a parallel subtest for every claimer kind,
// with a subscriber of queues that claims with it.
func forEachClaimer(t *testing.T, test func(t *testing.T, e *env, sub func() *Subscriber)) {
	t.Helper()
	for _, k := range claimerKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			sub := func() *Subscriber {
				s := e.subscriber("q")
				k.set(s)
				if got := fmt.Sprintf("%T", newRun(e.ctx, s).claims); got != k.name {
					t.Fatalf("the subscriber claims with %s; want %s", got, k.name)
				}
				return s
			}
			test(t, e, sub)
		})
	}
}

// handling records which handler ran which row when.
type handling struct {
	mu      sync.Mutex
	running map[int64]string // row -> the run whose handler runs it
	keyNow  map[string]string
	order   map[string][]int64 // key -> rows in the order handled
	done    map[int64]bool
	faults  []string
}

func newHandling() *handling {
	return &handling{running: map[int64]string{}, keyNow: map[string]string{}, order: map[string][]int64{}, done: map[int64]bool{}}
}

// calls returns the Calls of a run named who: each handler checks that
// no other handler runs its row, or its key, then works a moment.
func (h *handling) calls(who string) func() func(*db.ClaimRow) (Call, error) {
	return func() func(*db.ClaimRow) (Call, error) {
		return func(row *db.ClaimRow) (Call, error) {
			return &recordedCall{h: h, who: who, id: row.ID, key: row.OrderingKey}, nil
		}
	}
}

type recordedCall struct {
	h   *handling
	who string
	id  int64
	key *string
}

func (c *recordedCall) Headers() map[string]string { return nil }

func (c *recordedCall) HandleTx(context.Context, pgx.Tx) error { return nil }

func (c *recordedCall) Handle(ctx context.Context) error {
	h := c.h
	h.mu.Lock()
	if other, ok := h.running[c.id]; ok {
		h.faults = append(h.faults, fmt.Sprintf("row %d handled by %s and %s at once", c.id, other, c.who))
	}
	h.running[c.id] = c.who
	if c.key != nil {
		if other, ok := h.keyNow[*c.key]; ok {
			h.faults = append(h.faults, fmt.Sprintf("key %s handled by %s and %s at once", *c.key, other, c.who))
		}
		h.keyNow[*c.key] = c.who
		h.order[*c.key] = append(h.order[*c.key], c.id)
	}
	h.mu.Unlock()
	time.Sleep(time.Millisecond)
	h.mu.Lock()
	delete(h.running, c.id)
	if c.key != nil {
		delete(h.keyNow, *c.key)
	}
	h.done[c.id] = true
	h.mu.Unlock()
	return nil
}

// Two subscribers that claim the same way drain one queue: every row is
// handled, never by two handlers at once, and the rows of a key one at a
// time, in the order they were published.
func TestClaimersDrainAQueueKeepingEachRowAndKeyToOneHandler(t *testing.T) {
	t.Parallel()
	forEachClaimer(t, func(t *testing.T, e *env, sub func() *Subscriber) {
		const keys, rows = 8, 400
		want := map[string][]int64{}
		for i := range rows {
			p := db.PublishParams{Queue: "q", Payload: []byte(`{}`)}
			if i%2 == 0 {
				k := fmt.Sprint(i % keys)
				p.OrderingKey = &k
			}
			id, err := e.Q.Publish(e.ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			if p.OrderingKey != nil {
				want[*p.OrderingKey] = append(want[*p.OrderingKey], id)
			}
		}
		h := newHandling()
		ctx, stop := context.WithCancel(e.ctx)
		var wg sync.WaitGroup
		for _, who := range []string{"a", "b"} {
			s := sub()
			s.Calls = h.calls(who)
			wg.Go(func() {
				if err := Run(ctx, s); err != nil {
					t.Errorf("run %s: %v", who, err)
				}
			})
		}
		deadline := time.Now().Add(time.Minute)
		for {
			var left int
			if err := e.DB.Pool.QueryRow(e.ctx, "SELECT count(*) FROM outbox").Scan(&left); err != nil {
				t.Fatal(err)
			}
			if left == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d rows left after a minute", left, rows)
			}
			time.Sleep(20 * time.Millisecond)
		}
		stop()
		wg.Wait()
		h.mu.Lock()
		defer h.mu.Unlock()
		if len(h.done) != rows {
			t.Errorf("%d rows handled; want %d", len(h.done), rows)
		}
		for _, f := range h.faults {
			t.Error(f)
		}
		for k, ids := range want {
			// A row handled twice (a redelivery) may repeat, never reorder.
			got := slices.Compact(slices.Clone(h.order[k]))
			if !slices.Equal(got, ids) {
				t.Errorf("key %s handled in the order %v; want %v", k, got, ids)
			}
		}
	})
}

// A subscriber that stops gives back at once the rows it claimed and did
// not start: another claimer takes them without waiting for a lease.
func TestClaimerStopGivesBackUnstartedRows(t *testing.T) {
	t.Parallel()
	forEachClaimer(t, func(t *testing.T, e *env, sub func() *Subscriber) {
		for range 10 {
			e.publish("q")
		}
		s := sub()
		s.Workers = 0 // no handler starts
		ctx, stop := context.WithCancel(e.ctx)
		done := make(chan error, 1)
		r := newRun(ctx, s)
		go func() { done <- r.run(ctx) }()
		deadline := time.Now().Add(10 * time.Second)
		for len(r.buf) < 10 {
			if time.Now().After(deadline) {
				t.Fatalf("the run claimed %d of 10 rows", len(r.buf))
			}
			time.Sleep(5 * time.Millisecond)
		}
		stop()
		if err := <-done; err != nil {
			t.Fatalf("run: %v", err)
		}
		other := newRun(e.ctx, sub())
		defer other.stopWrites()
		defer close(other.stopping)
		if n, err := other.claims.Claim(e.ctx, 10); err != nil || n != 10 {
			t.Errorf("after the stop another claim took %d rows, %v; want all 10", n, err)
		}
	})
}
