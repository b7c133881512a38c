package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
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
	label string // the subtest's name
	name  string // the claimer's type, as claim.New returns it
	set   func(s *Subscriber)
	// ring: rows are published into the log tier's ring, beside the
	// outbox table, and the subscriber claims from both.
	ring bool
}

var claimerKinds = []claimerKind{
	{"byLease", "*claim.byLease", func(s *Subscriber) { s.LockWindow = -1 }, false},
	{"byLock", "*claim.byLock", func(s *Subscriber) { s.MinLockedClaim = 0 }, false},
	{"mixed", "*claim.mixed", func(s *Subscriber) { s.MinLockedClaim = 32 }, false},
	{"ring-byLock", "*claim.byRing", func(s *Subscriber) { s.MinLockedClaim = 0 }, true},
	{"ring-byLease", "*claim.byRing", func(s *Subscriber) { s.LockWindow = -1 }, true},
}

// forEachClaimer runs test as a parallel subtest for every claimer kind,
// with a subscriber of queues that claims with it, and the function that
// publishes a row the way that kind's rows are written.
func forEachClaimer(t *testing.T, test func(t *testing.T, e *env, sub func() *Subscriber, publish func(db.PublishParams) int64)) {
	t.Helper()
	for _, k := range claimerKinds {
		t.Run(k.label, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			publish := func(p db.PublishParams) int64 {
				t.Helper()
				id, err := e.Q.Publish(e.ctx, p)
				if err != nil {
					t.Fatal(err)
				}
				return id
			}
			if k.ring {
				publish = func(p db.PublishParams) int64 {
					t.Helper()
					return e.publishRing(p)
				}
			}
			sub := func() *Subscriber {
				s := e.subscriber("q")
				k.set(s)
				s.Ring = k.ring
				if got := fmt.Sprintf("%T", newRun(e.ctx, s).claims); got != k.name {
					t.Fatalf("the subscriber claims with %s; want %s", got, k.name)
				}
				return s
			}
			test(t, e, sub, publish)
		})
	}
}

// publishRing inserts a row into the ring as a plain SQL writer does, and
// returns its id.
func (e *env) publishRing(p db.PublishParams) int64 {
	e.t.Helper()
	var id int64
	err := e.DB.Pool.QueryRow(e.ctx, `INSERT INTO outbox_ring (queue, payload, ordering_key) VALUES ($1, $2, $3) RETURNING id`,
		p.Queue, p.Payload, p.OrderingKey).Scan(&id)
	if err != nil {
		e.t.Fatal(err)
	}
	return id
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
	forEachClaimer(t, func(t *testing.T, e *env, sub func() *Subscriber, publish func(db.PublishParams) int64) {
		const keys, rows = 8, 400
		want := map[string][]int64{}
		for i := range rows {
			p := db.PublishParams{Queue: "q", Payload: []byte(`{}`)}
			if i%2 == 0 {
				k := fmt.Sprint(i % keys)
				p.OrderingKey = &k
			}
			id := publish(p)
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
			h.mu.Lock()
			handled := len(h.done)
			h.mu.Unlock()
			// Rows in the ring are not in the outbox table: drained is
			// every row handled, and none left there.
			if left == 0 && handled >= rows {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d rows left, %d handled after a minute", left, rows, handled)
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
			// A keyed row of the ring takes a new id, in order, when it
			// moves into the outbox table.
			got := slices.Compact(slices.Clone(h.order[k]))
			if len(got) != len(ids) || !slices.IsSorted(got) {
				t.Errorf("key %s handled in the order %v; want %d rows in the order published", k, got, len(ids))
			}
			if !slices.Equal(got, ids) && !strings.Contains(t.Name(), "/ring-") {
				t.Errorf("key %s handled in the order %v; want %v", k, got, ids)
			}
		}
	})
}

// A subscriber that stops gives back at once the rows it claimed and did
// not start: another claimer takes them without waiting for a lease.
func TestClaimerStopGivesBackUnstartedRows(t *testing.T) {
	t.Parallel()
	forEachClaimer(t, func(t *testing.T, e *env, sub func() *Subscriber, publish func(db.PublishParams) int64) {
		for range 10 {
			publish(db.PublishParams{Queue: "q", Payload: []byte(`{}`)})
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
		// One claim of the outbox table takes them all; claims of the
		// ring take a lane each, and the rows given back in the table.
		taken := map[int64]bool{}
		deadline = time.Now().Add(10 * time.Second)
		for len(taken) < 10 && time.Now().Before(deadline) {
			if _, err := other.claims.Claim(e.ctx, 10); err != nil {
				t.Fatal(err)
			}
			for len(other.buf) > 0 {
				taken[(<-other.buf).Row.ID] = true
			}
		}
		if len(taken) != 10 {
			t.Errorf("after the stop another claimer took %d rows; want all 10", len(taken))
		}
	})
}
