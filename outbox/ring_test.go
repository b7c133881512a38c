package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/pgtest"
)

// The log tier's ring (package ring) beside the outbox table: writers
// INSERT into it with plain SQL, and every subscriber of an outbox that
// has one claims from it through the public API, on every claim path.

// setupRing is setup, outside the roles mode, with the ring beside the
// outbox table.
func setupRing(t *testing.T) *env {
	t.Helper()
	return setupWith(t, TableDefault, false)
}

// publishRing writes n rows of queue into the ring, one statement, and
// returns their ids.
func (e *env) publishRing(queue string, n int) []int64 {
	e.t.Helper()
	return e.publishInto("outbox_ring", queue, n)
}

// publishInto writes n rows of queue into table (outbox or outbox_ring)
// with plain SQL, one statement, and returns their ids.
func (e *env) publishInto(table, queue string, n int) []int64 {
	e.t.Helper()
	return pgtest.IDs(e.t, e.db.Pool, `INSERT INTO `+pgx.Identifier{table}.Sanitize()+` (queue, payload)
		SELECT $1, convert_to(i::text, 'UTF8') FROM generate_series(1, $2) AS i RETURNING id`, queue, n)
}

// handledIDs collects the ids handlers saw, once each.
type handledIDs struct {
	mu  sync.Mutex
	ids map[int64]int
}

func (h *handledIDs) add(id int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ids == nil {
		h.ids = map[int64]int{}
	}
	h.ids[id]++
}

// sorted returns the distinct ids seen, in order.
func (h *handledIDs) sorted() []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	ids := make([]int64, 0, len(h.ids))
	for id := range h.ids {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// A subscriber stopped while its batch of the ring is out gives back the
// rows no handler started: another subscriber delivers every one of them,
// and the row whose handler ran through the stop is not lost either.
func TestRingStopMidBatchLosesNothing(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		e := setupRing(t)
		ids := e.publishRing("q", 40)
		var seen handledIDs
		cfg := onPath(p, fastConfig[string](nil))
		cfg.Workers = 1
		stopDuringFirstHandler(t, e, cfg, func(_ context.Context, m *Message[string]) error {
			seen.add(m.ID)
			return nil
		})
		startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
			seen.add(m.ID)
			return nil
		}, onPath(p, fastConfig[string](nil)))
		eventually(t, "every row handled", func() bool { return len(seen.sorted()) >= len(ids) })
		if diff := cmp.Diff(ids, seen.sorted()); diff != "" {
			t.Errorf("rows handled (-published +handled):\n%s", diff)
		}
		eventually(t, "the outbox table empty", func() bool { return e.count("outbox") == 0 })
	})
}

// stopDuringFirstHandler runs a subscriber of queue q with cfg and
// handle, and stops it while its first handler call runs: that call
// waits for Run's context to end before it goes on.
func stopDuringFirstHandler(t *testing.T, e *env, cfg *SubscriberConfig[string], handle func(context.Context, *Message[string]) error) {
	t.Helper()
	first, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	a := startSub(t, e.ob, []string{"q"}, func(ctx context.Context, m *Message[string]) error {
		once.Do(func() {
			close(first)
			<-release
		})
		return handle(ctx, m)
	}, cfg)
	<-first
	a.cancel()
	close(release)
	if err := a.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// publishRingKeyed writes perKey rows on each of keys keys into the ring
// in one statement, the keys' rows interleaved; row i of key k carries the
// payload "k/i".
func (e *env) publishRingKeyed(queue string, keys, perKey int) {
	e.t.Helper()
	if _, err := e.db.Pool.Exec(e.ctx, `INSERT INTO outbox_ring (queue, payload, ordering_key)
		SELECT $1, convert_to(k || '/' || i, 'UTF8'), 'key-' || k
		FROM generate_series(1, $3) AS i, generate_series(1, $2) AS k ORDER BY i, k`, queue, keys, perKey); err != nil {
		e.t.Fatal(err)
	}
}

// Rows written into the ring with ordering keys keep per-key order across
// the tiers: each key's rows are handled one at a time, in the order
// written, a row that fails being retried before the key's next row runs.
func TestRingKeyedRowsKeepPerKeyOrder(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		e := setupRing(t)
		const keys, perKey = 4, 6
		e.publishRingKeyed("q", keys, perKey)
		var mu sync.Mutex
		seen := map[string][]string{} // key -> payloads, each delivery
		busy := map[string]bool{}     // key -> a handler runs
		failed := map[string]bool{}   // payload -> failed once
		overlaps := 0
		done := make(chan struct{})
		handled := 0
		cfg := onPath(p, fastConfig[string](nil))
		cfg.Retry = ConstantRetry{Delay: 10 * time.Millisecond}
		startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
			mu.Lock()
			if busy[m.OrderingKey] {
				overlaps++
			}
			busy[m.OrderingKey] = true
			seen[m.OrderingKey] = append(seen[m.OrderingKey], m.Payload)
			fail := !failed[m.Payload] && strings.HasSuffix(m.Payload, "/3")
			failed[m.Payload] = true
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			busy[m.OrderingKey] = false
			if fail {
				return errors.New("fails once")
			}
			if handled++; handled == keys*perKey {
				close(done)
			}
			return nil
		}, cfg)
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Fatal("timed out waiting for every row")
		}
		mu.Lock()
		defer mu.Unlock()
		if overlaps != 0 {
			t.Errorf("a key's rows ran in two handlers at once %d times", overlaps)
		}
		want := map[string][]string{}
		for k := 1; k <= keys; k++ {
			for i := 1; i <= perKey; i++ {
				w := fmt.Sprintf("%d/%d", k, i)
				want[fmt.Sprint("key-", k)] = append(want[fmt.Sprint("key-", k)], w)
				if i == 3 {
					want[fmt.Sprint("key-", k)] = append(want[fmt.Sprint("key-", k)], w) // its retry
				}
			}
		}
		if diff := cmp.Diff(want, seen); diff != "" {
			t.Errorf("deliveries per key (-want +got):\n%s", diff)
		}
	})
}

// A ring row that fails until MaxDeliveries is dead-lettered as a row of
// the outbox table is (its handler ran MaxDeliveries times, the claim
// after counts one more), and the rows beside it are delivered once each.
func TestRingRowThatAlwaysFailsIsDeadLetteredAsTheTablesRowsAre(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		got := map[string]DeadLetter{}
		for _, tier := range []string{"outbox", "outbox_ring"} {
			e := setupRing(t)
			ids := e.publishInto(tier, "q", 12)
			poison := ids[5]
			var seen handledIDs
			cfg := onPath(p, fastConfig[string](nil))
			cfg.Retry = ConstantRetry{Delay: 10 * time.Millisecond}
			cfg.MaxDeliveries = 3
			s := startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
				seen.add(m.ID)
				if m.ID == poison {
					return errors.New("poison")
				}
				return nil
			}, cfg)
			eventually(t, "the poison row dead-lettered", func() bool { return e.count("outbox_dlq") == 1 })
			eventually(t, "the outbox table empty", func() bool { return e.count("outbox") == 0 })
			if err := s.stop(); err != nil {
				t.Errorf("Run: %v", err)
			}
			dead, err := e.ob.DeadLetters(e.ctx, DeadLetterFilter{}, 0, 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(dead) != 1 || dead[0].ID != poison {
				t.Fatalf("%s: dead letters %+v; want row %d alone", tier, dead, poison)
			}
			got[tier] = DeadLetter{Deliveries: dead[0].Deliveries, Attempts: dead[0].Attempts, Reason: dead[0].Reason, LastError: dead[0].LastError}
			seen.mu.Lock()
			want := map[int64]int{}
			for _, id := range ids {
				want[id] = 1
			}
			want[poison] = 3
			if diff := cmp.Diff(want, seen.ids); diff != "" {
				t.Errorf("%s: handler runs per row (-want +got):\n%s", tier, diff)
			}
			seen.mu.Unlock()
		}
		if diff := cmp.Diff(got["outbox"], got["outbox_ring"]); diff != "" {
			t.Errorf("the dead letter of the ring's row differs from the table's (-table +ring):\n%s", diff)
		}
	})
}

// Rows written into the ring by concurrent transactions while a
// subscriber reads it are each delivered once: a lane's batches, cut at
// transaction boundaries, neither skip nor repeat a row that commits
// while the lane is read.
func TestRingRowsWrittenWhileReadAreDeliveredOnce(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		e := setupRing(t)
		var seen handledIDs
		startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
			seen.add(m.ID)
			return nil
		}, onPath(p, fastConfig[string](nil)))
		var mu sync.Mutex
		var ids []int64
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for i := range 100 {
					got := e.publishRing("q", 1+(w+i)%3)
					mu.Lock()
					ids = append(ids, got...)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		slices.Sort(ids)
		eventually(t, "every row handled", func() bool { return len(seen.sorted()) >= len(ids) })
		seen.mu.Lock()
		defer seen.mu.Unlock()
		want := map[int64]int{}
		for _, id := range ids {
			want[id] = 1
		}
		if diff := cmp.Diff(want, seen.ids); diff != "" {
			t.Errorf("deliveries per row (-want +got):\n%s", diff)
		}
	})
}

// keyedDeliveries records the payloads handlers saw per ordering key, in
// the order they ran, and counts handlers of one key that overlapped.
type keyedDeliveries struct {
	mu       sync.Mutex
	seen     map[string][]string
	busy     map[string]bool
	overlaps int
}

// handler returns a handler that records its deliveries in k and takes
// at least pause per row.
func (k *keyedDeliveries) handler(pause time.Duration) func(context.Context, *Message[string]) error {
	return func(_ context.Context, m *Message[string]) error {
		k.mu.Lock()
		if k.seen == nil {
			k.seen, k.busy = map[string][]string{}, map[string]bool{}
		}
		if k.busy[m.OrderingKey] {
			k.overlaps++
		}
		k.busy[m.OrderingKey] = true
		k.seen[m.OrderingKey] = append(k.seen[m.OrderingKey], m.Payload)
		k.mu.Unlock()
		time.Sleep(pause)
		k.mu.Lock()
		k.busy[m.OrderingKey] = false
		k.mu.Unlock()
		return nil
	}
}

// of returns the payloads handled for key so far.
func (k *keyedDeliveries) of(key string) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.seen[key])
}

// A key's rows are delivered in the order they were written even when a
// writer of a later row took its transaction id before the writer of an
// earlier one: batches of one row, read in transaction id order and cut
// there, would deliver the later row first.
func TestRingKeyOrderHoldsWhenTransactionIDsAreInverted(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		e := setupRing(t)
		insert := `INSERT INTO outbox_ring (queue, payload, ordering_key) VALUES ('q', convert_to($1, 'UTF8'), 'k')`
		// The later writer takes its transaction id first...
		later, err := e.db.Pool.Begin(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = later.Rollback(context.Background()) }()
		if _, err := later.Exec(e.ctx, "SELECT pg_current_xact_id()"); err != nil {
			t.Fatal(err)
		}
		// ... the earlier writes the key's first row and commits ...
		if _, err := e.db.Pool.Exec(e.ctx, insert, "first"); err != nil {
			t.Fatal(err)
		}
		// ... and the later writes the second, under the key's lock.
		if _, err := later.Exec(e.ctx, insert, "second"); err != nil {
			t.Fatal(err)
		}
		if err := later.Commit(e.ctx); err != nil {
			t.Fatal(err)
		}
		var inverted bool
		if err := e.db.Pool.QueryRow(e.ctx, `SELECT (SELECT txid FROM outbox_ring WHERE payload = 'second')
			< (SELECT txid FROM outbox_ring WHERE payload = 'first')`).Scan(&inverted); err != nil {
			t.Fatal(err)
		}
		if !inverted {
			t.Fatal("the second row's transaction id is not below the first's: the test sets nothing up")
		}
		var k keyedDeliveries
		cfg := onPath(p, fastConfig[string](nil))
		cfg.FetchBatchSize = 1
		startSub(t, e.ob, []string{"q"}, k.handler(0), cfg)
		eventually(t, "both rows handled", func() bool { return len(k.of("k")) >= 2 })
		if diff := cmp.Diff([]string{"first", "second"}, k.of("k")); diff != "" {
			t.Errorf("deliveries of the key (-want +got):\n%s", diff)
		}
	})
}

// The ring's rows of a key that the outbox table holds rows of (here one
// not yet due) are delivered after those rows, and a key's ring rows from
// its first one not yet due wait behind it.
func TestRingKeyedRowsWaitBehindTheKeysRowsInTheTableAndUnDueRows(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		e := setupRing(t)
		pub := newPublisher[string](t, e, "q", nil)
		// Not due for a while: the ring's rows of its key are read first.
		if _, err := pub.Publish(e.ctx, e.pubPool, "table", &PublishOpts{OrderingKey: "held", Delay: 500 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.db.Pool.Exec(e.ctx, `INSERT INTO outbox_ring (queue, payload, ordering_key, next_attempt_at)
			VALUES ('q', 'ring/1', 'held', now()), ('q', 'ring/2', 'held', now()),
			       ('q', 'soon', 'later', now() + interval '500 milliseconds'), ('q', 'after', 'later', now())`); err != nil {
			t.Fatal(err)
		}
		var k keyedDeliveries
		startSub(t, e.ob, []string{"q"}, k.handler(time.Millisecond), onPath(p, fastConfig[string](nil)))
		eventually(t, "every row handled", func() bool { return len(k.of("held")) >= 3 && len(k.of("later")) >= 2 })
		want := map[string][]string{"held": {"table", "ring/1", "ring/2"}, "later": {"soon", "after"}}
		got := map[string][]string{"held": k.of("held"), "later": k.of("later")}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("deliveries per key (-want +got):\n%s", diff)
		}
		if k.overlaps != 0 {
			t.Errorf("a key's rows ran in two handlers at once %d times", k.overlaps)
		}
		eventually(t, "the outbox table empty", func() bool { return e.count("outbox") == 0 })
	})
}

// slowThenNext writes the ring rows "slow" and "next" of key "k" and
// runs a subscriber on path p (LockWindow 200 ms, LeaseTTL ttl) whose
// handler of "slow" waits until that row is in the outbox table, leased
// (a claim by lock has ended with it running), and then runs then.
func slowThenNext(t *testing.T, p claimPath, ttl time.Duration, then func(ctx context.Context, e *env, id int64) error) (
	*env, *events, *keyedDeliveries) {
	t.Helper()
	e := setupRing(t)
	if _, err := e.db.Pool.Exec(e.ctx, `INSERT INTO outbox_ring (queue, payload, ordering_key)
		VALUES ('q', 'slow', 'k'), ('q', 'next', 'k')`); err != nil {
		t.Fatal(err)
	}
	rec := &events{}
	k := &keyedDeliveries{}
	record := k.handler(0)
	cfg := fastConfig[string](rec)
	cfg.LeaseTTL, cfg.LockWindow = ttl, 200*time.Millisecond
	startSub(t, e.ob, []string{"q"}, func(ctx context.Context, m *Message[string]) error {
		if m.Payload == "slow" {
			for {
				var leased bool
				if err := e.db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM outbox WHERE id = $1 AND acquired_token IS NOT NULL)`,
					m.ID).Scan(&leased); err != nil {
					return err
				}
				if leased {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := then(ctx, e, m.ID); err != nil {
				return err
			}
		}
		return record(ctx, m)
	}, onPath(p, cfg))
	return e, rec, k
}

// A keyed row of the ring whose handler runs past LockWindow moves into
// the outbox table leased, keeping its id: its acknowledgement lands by
// that id (no lease lost, no second delivery), and the key's next row
// runs after it.
func TestRingKeyedRowPastTheLockWindowKeepsItsID(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		e, rec, k := slowThenNext(t, p, 5*time.Second, func(context.Context, *env, int64) error { return nil })
		eventually(t, "both rows handled", func() bool { return len(k.of("k")) >= 2 })
		eventually(t, "the outbox table empty", func() bool { return e.count("outbox") == 0 })
		if diff := cmp.Diff([]string{"slow", "next"}, k.of("k")); diff != "" {
			t.Errorf("deliveries of the key (-want +got):\n%s", diff)
		}
		if lost := rec.named(EventLeaseLost); len(lost) != 0 {
			t.Errorf("leases lost: %+v", lost)
		}
	})
}

// A subscriber stopped while it works through keyed batches of the ring
// loses no row and breaks no key's order: the rows its claims had not
// handed out move into the outbox table behind their keys, and another
// subscriber delivers every row, each key's in the order written.
func TestRingKeyedStopMidBatchLosesNothing(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		e := setupRing(t)
		const keys, perKey = 4, 10
		e.publishRingKeyed("q", keys, perKey)
		var k keyedDeliveries
		record := k.handler(0)
		cfg := onPath(p, fastConfig[string](nil))
		cfg.Workers = 2
		stopDuringFirstHandler(t, e, cfg, record)
		startSub(t, e.ob, []string{"q"}, record, onPath(p, fastConfig[string](nil)))
		want := map[string][]string{}
		for key := 1; key <= keys; key++ {
			for i := 1; i <= perKey; i++ {
				want[fmt.Sprint("key-", key)] = append(want[fmt.Sprint("key-", key)], fmt.Sprintf("%d/%d", key, i))
			}
		}
		firstOf := func() map[string][]string {
			got := map[string][]string{}
			for key := range want {
				var seen []string
				for _, payload := range k.of(key) {
					if !slices.Contains(seen, payload) {
						seen = append(seen, payload)
					}
				}
				got[key] = seen
			}
			return got
		}
		eventually(t, "every row handled", func() bool { return cmp.Equal(want, firstOf()) || len(k.of("key-1")) > 2*perKey })
		if diff := cmp.Diff(want, firstOf()); diff != "" {
			t.Errorf("each key's rows, in the order first handled (-want +got):\n%s", diff)
		}
		if k.overlaps != 0 {
			t.Errorf("a key's rows ran in two handlers at once %d times", k.overlaps)
		}
		eventually(t, "the outbox table empty", func() bool { return e.count("outbox") == 0 })
	})
}

// A keyed row of the ring whose handler outlives LockWindow moves into
// the outbox table leased; when a newer claim takes its lease there, the
// old handler's outcome is refused (lease lost, the row stays), and the
// key's next row waits behind it, blocked, undelivered.
func TestRingSpilledRowWhoseLeaseIsTakenIsNotClobbered(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		taken := make(chan int64, 1)
		// The taken lease outlives the test: the row is not delivered again.
		e, rec, k := slowThenNext(t, p, time.Minute, func(ctx context.Context, e *env, id int64) error {
			// A newer claim takes the row.
			if _, err := e.db.Pool.Exec(ctx, "UPDATE outbox SET acquired_token = gen_random_uuid() WHERE id = $1", id); err != nil {
				return err
			}
			taken <- id
			return nil
		})
		id := waitFor(t, taken, "the slow row's lease taken")
		eventually(t, "its outcome refused", func() bool { return len(rec.named(EventLeaseLost)) > 0 })
		if diff := cmp.Diff([]int64{id}, sortedIDs(rec.named(EventLeaseLost))); diff != "" {
			t.Errorf("lease_lost (-want +got):\n%s", diff)
		}
		if _, ok := e.row(id); !ok {
			t.Error("the row whose lease was taken was deleted")
		}
		var blocked bool
		if err := e.db.Pool.QueryRow(e.ctx, `SELECT blocked FROM outbox WHERE payload = 'next'`).Scan(&blocked); err != nil {
			t.Fatalf("the key's next row in the outbox table: %v", err)
		}
		if !blocked {
			t.Error("the key's next row is not blocked behind the row whose lease was taken")
		}
		if diff := cmp.Diff([]string{"slow"}, k.of("k")); diff != "" {
			t.Errorf("deliveries of the key (-want +got):\n%s", diff)
		}
	})
}

// A claim of the ring's lanes does not hold them for a row whose handler
// runs on: once the claim's other rows have outcomes, and the slow one
// has run for some times as long as a claim's rows take, the claim ends,
// the slow row moves into the outbox table leased (its handler runs on
// and acknowledges it there), and the rows written into its lane since
// are delivered while it runs. LockWindow is a minute here, so nothing
// else would free the lane.
func TestRingRowThatRunsOnDoesNotHoldItsLane(t *testing.T) {
	t.Parallel()
	e := setupRing(t)
	// inLane0 writes payloads into lane 0 of queue q (an unkeyed row's
	// lane is its id modulo 4), one transaction.
	inLane0 := func(payloads ...string) {
		t.Helper()
		if _, err := e.db.Pool.Exec(e.ctx, `INSERT INTO outbox_ring (id, queue, payload)
			SELECT (nextval('outbox_id_seq') + 1) * 4, 'q', convert_to(p, 'UTF8') FROM unnest($1::text[]) AS p`, payloads); err != nil {
			t.Fatal(err)
		}
	}
	inLane0("slow", "fast-1", "fast-2")
	rec := &events{}
	cfg := fastConfig[string](rec)
	cfg.LeaseTTL, cfg.LockWindow = 2*time.Minute, time.Minute
	slowRuns, laterRan := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var order []string
	startSub(t, e.ob, []string{"q"}, func(ctx context.Context, m *Message[string]) error {
		switch m.Payload {
		case "slow":
			close(slowRuns)
			select {
			case <-laterRan:
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(30 * time.Second):
			}
		case "later":
			close(laterRan)
		}
		mu.Lock()
		order = append(order, m.Payload)
		mu.Unlock()
		return nil
	}, cfg)
	<-slowRuns
	inLane0("later")
	eventually(t, "every row acknowledged", func() bool { return len(rec.named(EventAcked)) == 4 })
	eventually(t, "the outbox table empty", func() bool { return e.count("outbox") == 0 })
	mu.Lock()
	defer mu.Unlock()
	if i := slices.Index(order, "later"); i < 0 || i > slices.Index(order, "slow") {
		t.Errorf("handlers returned in the order %q; want later's before slow's (its lane held no longer)", order)
	}
	if lost := rec.named(EventLeaseLost); len(lost) != 0 {
		t.Errorf("leases lost: %+v", lost)
	}
}

// A writer cannot choose where a keyed row goes in its key's order: the
// ring's key trigger keeps the id of a keyed row inserted into the
// outbox table only for a transaction that holds the lane of the ring's
// row of that id and key (a reader moving it), not for one that merely
// sets outboxgen.ring_move. Tried as a role that may insert into the
// outbox and nothing else, copying a ring row's id and key.
func TestRingWriterCannotKeepARingRowsID(t *testing.T) {
	t.Parallel()
	e := setupRing(t)
	var ringID int64
	if err := e.db.Pool.QueryRow(e.ctx, `INSERT INTO outbox_ring (queue, payload, ordering_key) VALUES ('q', 'x', 'k') RETURNING id`).
		Scan(&ringID); err != nil {
		t.Fatal(err)
	}
	name, c := e.loginRole("writer")
	ident := pgx.Identifier{name}.Sanitize()
	schema := pgx.Identifier{e.db.Schema}.Sanitize()
	e.exec("GRANT INSERT ON " + schema + ".outbox TO " + ident)
	e.exec("GRANT USAGE ON SEQUENCE " + schema + ".outbox_id_seq TO " + ident)
	if _, err := c.Exec(e.ctx, "SET search_path = "+schema); err != nil {
		t.Fatal(err)
	}
	tx, err := c.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(e.ctx, `SELECT set_config('outboxgen.ring_move', 'on', true)`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(e.ctx, `INSERT INTO outbox (id, queue, payload, ordering_key) OVERRIDING SYSTEM VALUE VALUES ($1, 'q', 'copy', 'k')`, ringID); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	var ids []int64
	rows, err := e.db.Pool.Query(e.ctx, `SELECT id FROM outbox WHERE payload = 'copy'`)
	if err != nil {
		t.Fatal(err)
	}
	if ids, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 || ids[0] == ringID {
		t.Errorf("the writer's row has ids %v; want one id other than the ring row's %d", ids, ringID)
	}
}

// A ring row's headers reach its handler as the same row's would from
// the outbox table, on its first delivery and after its retry moved it
// into the table; and the ring refuses exactly the headers the table
// refuses, with the same error, so that no row it took can fail its move.
func TestRingHeadersAreTheTablesHeaders(t *testing.T) {
	t.Parallel()
	// Written as text, so that each table parses them itself: a key
	// twice (the last one wins), an escaped letter and spaces.
	const written = `{"x-kind": "note", "x-trace":"t\u00e9", "x-dup": "1", "x-dup": "2"}`
	want := map[string]string{"x-kind": "note", "x-trace": "té", "x-dup": "2"}
	type seen struct{ first, retried map[string]string }
	got := map[string]seen{}
	for _, tier := range []string{"outbox", "outbox_ring"} {
		e := setupRing(t)
		id := pgtest.IDs(t, e.db.Pool, `INSERT INTO `+pgx.Identifier{tier}.Sanitize()+` (queue, payload, headers)
			VALUES ('q', '"x"', $1::text::json) RETURNING id`, written)[0]
		var mu sync.Mutex
		var runs []map[string]string
		cfg := fastConfig[string](nil)
		cfg.Retry = ConstantRetry{Delay: 10 * time.Millisecond}
		s := startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
			mu.Lock()
			defer mu.Unlock()
			if m.ID != id {
				return fmt.Errorf("row %d; only %d was written", m.ID, id)
			}
			runs = append(runs, m.Headers)
			if len(runs) == 1 {
				return errors.New("once more")
			}
			return nil
		}, cfg)
		eventually(t, "the row handled twice and acknowledged", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(runs) == 2 && e.count("outbox") == 0
		})
		if err := s.stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
		got[tier] = seen{runs[0], runs[1]}
	}
	for tier, s := range got {
		if diff := cmp.Diff(seen{want, want}, s, cmp.AllowUnexported(seen{})); diff != "" {
			t.Errorf("%s: headers on the first delivery and the retry (-want +got):\n%s", tier, diff)
		}
	}

	e := setupRing(t)
	for _, bad := range []string{`[1]`, `"s"`, `{"a": "\u0000"}`, `{"a": "\ud800"}`, `{"a": 1e1000000}`, `{"a": }`} {
		codes := map[string]string{}
		for _, tier := range []string{"outbox", "outbox_ring"} {
			_, err := e.db.Pool.Exec(e.ctx, `INSERT INTO `+pgx.Identifier{tier}.Sanitize()+` (queue, payload, headers)
				VALUES ('q', '"x"', $1::text::json)`, bad)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				t.Fatalf("%s took headers %s (err %v)", tier, bad, err)
			}
			codes[tier] = pgErr.Code
		}
		if codes["outbox"] != codes["outbox_ring"] {
			t.Errorf("headers %s: the table refused them with %s, the ring with %s", bad, codes["outbox"], codes["outbox_ring"])
		}
	}
	if n := e.count("outbox_ring"); n != 0 {
		t.Errorf("the ring holds %d rows after refusing every one", n)
	}
}

// Writers into the ring notify a queue's channel as writers into the
// outbox table do: only while a subscriber of the queue sleeps, once per
// queue, on the scheduled channel for rows not yet due, and in a
// transaction that writes a queue's rows in several statements too.
func TestRingWritersNotifyOnlyWhileASubscriberSleeps(t *testing.T) {
	t.Parallel()
	e := setupRing(t)
	l := listen(t, e.db.URL, e.ob.Channel(), e.ob.Channel()+":scheduled")
	e.sleepOn("sentinel")
	notes := func(statements ...string) []string {
		t.Helper()
		tx, err := e.db.Pool.Begin(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(e.ctx) }()
		for _, s := range statements {
			if _, err := tx.Exec(e.ctx, s); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(e.ctx); err != nil {
			t.Fatal(err)
		}
		e.publish("sentinel")
		got := l.until("sentinel")
		slices.Sort(got)
		return got
	}
	const (
		due   = `INSERT INTO outbox_ring (queue, payload) VALUES ('q', 'x'), ('r', 'y'), ('q', 'z')`
		later = `INSERT INTO outbox_ring (queue, payload, next_attempt_at) VALUES ('q', 'x', now() + interval '1 hour')`
	)
	if got := notes(due, later); len(got) != 0 {
		t.Errorf("with nobody asleep: %v", got)
	}
	e.sleepOn("q")
	e.sleepOn("r")
	ch := e.ob.Channel() + ":"
	if diff := cmp.Diff([]string{ch + "q", ch + "r"}, notes(due, due)); diff != "" {
		t.Errorf("two statements of due rows (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{ch + "q", ch + "scheduled:q"}, notes(`DELETE FROM outbox_sleepers WHERE 'r' = ANY (queues)`, due, later)); diff != "" {
		t.Errorf("due and later rows, r's subscriber awake (-want +got):\n%s", diff)
	}
}

// A subscriber of an outbox with the ring that sleeps (polls 30 s apart)
// is woken by a row published into the outbox table, on every claim
// path, and handles it: the claim after a writer's notification, or after
// the subscriber's sleep record, looks at the table however the table's
// claims are paced while the ring keeps the claimer busy.
func TestRingSubscriberWokenForATableRowHandlesIt(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		e := setupRing(t)
		handled := idleSubscriber(t, e, onPath(p, fastConfig[string](nil)))
		eventually(t, "the LISTEN connection", func() bool { return len(e.listeners(e.ob.Channel())) == 1 })
		pub := newPublisher[string](t, e, "q", nil)
		for i := range 3 {
			e.waitAsleep()
			sent := time.Now()
			if _, err := pub.Publish(e.ctx, e.pubPool, "x", nil); err != nil {
				t.Fatal(err)
			}
			if lat := within(t, handled, 20*time.Second, fmt.Sprintf("row %d, after NOTIFY", i)).Sub(sent); lat > scheduledLatenessBound {
				t.Errorf("row %d handled %v after publish, want within %v: a NOTIFY should wake the subscriber, not its 30 s poll", i, lat, scheduledLatenessBound)
			}
		}
	})
}

// A key whose rows a writer wrote into the ring and then, a later row,
// into the outbox table: the ring's rows, which the claim moves behind the
// key's row in the table, are delivered with it, on every claim path, and
// no claim fails. A move keeps a row's id only while no row of its key in
// the table has a larger one: with its smaller id it would jump ahead of
// that row, and the table's check of rows that skip its key trigger
// refused the move (a claim that failed that way failed again at every
// retry, and held up every queue of the subscriber).
func TestRingKeyedRowsMovedBehindALaterTableRowOfTheirKeyAreDelivered(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		e := setupRing(t)
		e.publishRingKeyed("q", 1, 3)
		e.exec(`INSERT INTO outbox (queue, payload, ordering_key) VALUES ('q', 'table', 'key-1')`)
		errs := &errorLog{}
		cfg := onPath(p, fastConfig[string](nil))
		cfg.Logger = slog.New(errs)
		var mu sync.Mutex
		var got []string
		startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, m.Payload)
			return nil
		}, cfg)
		eventually(t, "the key's four rows handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= 4 })
		mu.Lock()
		slices.Sort(got)
		if diff := cmp.Diff([]string{"1/1", "1/2", "1/3", "table"}, got); diff != "" {
			t.Errorf("handled (-want +got):\n%s", diff)
		}
		mu.Unlock()
		if lines := errs.lines(); len(lines) > 0 {
			t.Errorf("the subscriber logged errors: %q", lines)
		}
	})
}

// QueueDepths counts the ring's rows that no lane has consumed yet beside
// the outbox table's, as ready or scheduled, each count stopping at the
// cap, and QueueStats counts them as it does; once a subscriber has
// handled them, only the table's rows count.
func TestQueueDepthsCountTheRingsRowsStillToBeRead(t *testing.T) {
	t.Parallel()
	e := setupWith(t, TableDefault, pgtest.RolesMode())
	e.publishInto("outbox", "a", 2)
	e.publishRing("a", 3)
	e.exec(`INSERT INTO outbox_ring (queue, payload, next_attempt_at) VALUES ('a', 'later', now() + interval '1 hour')`)
	e.exec(`INSERT INTO outbox_ring (queue, payload, ordering_key, created_at, next_attempt_at)
		SELECT 'b', 'x', 'k', now() - interval '2 hours', now() - interval '1 hour' FROM generate_series(1, 2)`)
	depths := func(opts *DepthOptions) []QueueDepth {
		t.Helper()
		got, err := e.ob.QueueDepths(e.ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	ignoreWait := cmpopts.IgnoreFields(QueueDepth{}, "OldestReadyWait")
	got := depths(nil)
	want := []QueueDepth{{Queue: "a", Ready: 5, Scheduled: 1}, {Queue: "b", Ready: 2}}
	if diff := cmp.Diff(want, got, ignoreWait); diff != "" {
		t.Errorf("depths with the ring's rows (-want +got):\n%s", diff)
	}
	if len(got) == 2 {
		if w := got[1].OldestReadyWait; w < time.Hour || w > time.Hour+time.Minute {
			t.Errorf("queue b: oldest ready wait %v, want an hour and a little more", w)
		}
	}
	stats, err := e.ob.QueueStats(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got, depthsOf(stats), ignoreWait); diff != "" {
		t.Errorf("QueueStats against QueueDepths (-depths +stats):\n%s", diff)
	}
	if len(stats) == 2 {
		if a := stats[1].OldestAge; a < 2*time.Hour || a > 2*time.Hour+time.Minute {
			t.Errorf("queue b: oldest age %v, want two hours and a little more", a)
		}
	}
	// A queue's rows are looked at up to the cap, lane after lane: whether
	// the scheduled row is among queue a's first two depends on its lane.
	want = []QueueDepth{{Queue: "a", Ready: 2, Capped: true}, {Queue: "b", Ready: 2, Capped: true}}
	capped := depths(&DepthOptions{Cap: 2})
	if diff := cmp.Diff(want, capped, ignoreWait, cmpopts.IgnoreFields(QueueDepth{}, "Scheduled")); diff != "" {
		t.Errorf("depths with the ring's rows, cap 2 (-want +got):\n%s", diff)
	}
	if len(capped) == 2 && (capped[0].Scheduled > 1 || capped[1].Scheduled != 0) {
		t.Errorf("depths with the ring's rows, cap 2: scheduled %d and %d; want at most 1 and 0", capped[0].Scheduled, capped[1].Scheduled)
	}

	var seen handledIDs
	startSub(t, e.ob, []string{"a", "b"}, func(_ context.Context, m *Message[string]) error {
		seen.add(m.ID)
		return nil
	}, fastConfig[string](nil))
	eventually(t, "every due row handled", func() bool { return len(seen.sorted()) == 7 })
	want = []QueueDepth{{Queue: "a", Scheduled: 1}}
	eventually(t, "only the scheduled row counted", func() bool {
		return cmp.Equal(want, depths(nil), ignoreWait)
	})
}

// The ring's depths read a queue's rows only up to the cap, through its
// indexes, for a queue whose lanes no claim has read yet and for one that
// has no lanes: the ring rows its scans look at are about the cap per
// queue, at 2,000 rows a queue as at 20,000. (Their buffers are logged,
// not compared: ten times the rows may make the ring's indexes a level
// deeper, which each of its twenty-odd index probes pays.)
func TestRingQueueDepthsReadAtMostTheCapPerQueue(t *testing.T) {
	t.Parallel()
	const depthCap = 100
	for _, rows := range []int{2_000, 20_000} {
		e := setupRing(t)
		e.exec(`INSERT INTO outbox_ring (queue, payload, ordering_key)
			SELECT q, 'x', CASE WHEN i % 2 = 0 THEN 'k' || i % 50 END
			FROM generate_series(1, $1) AS i, unnest(ARRAY['laned', 'unlaned']) AS q`, rows)
		e.exec(`INSERT INTO outbox_ring_lanes (queue, lane) SELECT 'laned', l FROM generate_series(0, 7) AS l`)
		plan := e.depthPlan(func(q *db.Queries) { _, _ = q.RingQueueDepths(e.ctx, depthCap) })
		for _, s := range plan.scans() {
			if strings.HasPrefix(s.RelationName, "outbox_ring") && !strings.HasPrefix(s.NodeType, "Index") {
				out, _ := json.MarshalIndent(plan, "", "  ")
				t.Errorf("%d rows: %s on %s, want index scans; plan:\n%s", rows, s.NodeType, s.RelationName, out)
			}
		}
		// Two queues of the cap each, and a row more per lane probed
		// (eight laterals of each kind) and per queue found.
		looked := plan.rowsLookedAt("outbox_ring_p")
		t.Logf("%d rows a queue: %d ring rows looked at, %d buffers", rows, looked, plan.Hit+plan.Read)
		if most := 2*depthCap + 2*8 + 4; looked > most {
			t.Errorf("%d rows a queue: the ring's depths looked at %d of its rows, want at most %d", rows, looked, most)
		}
		got, err := e.ob.QueueDepths(e.ctx, &DepthOptions{Cap: depthCap})
		if err != nil {
			t.Fatal(err)
		}
		want := []QueueDepth{{Queue: "laned", Ready: depthCap, Capped: true}, {Queue: "unlaned", Ready: depthCap, Capped: true}}
		if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(QueueDepth{}, "OldestReadyWait")); diff != "" {
			t.Errorf("%d rows: depths (-want +got):\n%s", rows, diff)
		}
	}
}

// A ring row's place cannot change: its queue, ordering key, id, slot,
// nor its txid but to the updating transaction's; its payload, headers
// and times can.
func TestRingRowsPlaceCannotChange(t *testing.T) {
	t.Parallel()
	e := setupRing(t)
	var id int64
	if err := e.db.Pool.QueryRow(e.ctx, `INSERT INTO outbox_ring (queue, payload, ordering_key) VALUES ('q', 'x', 'k') RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		set     string
		refused bool
	}{
		{"queue = 'q2'", true},
		{"ordering_key = 'other'", true},
		{"ordering_key = NULL", true},
		{"id = id + 1000000", true},
		{"slot = (slot + 1) % 4", true},
		{"txid = '3'", true},
		{"txid = pg_current_xact_id()", false},
		{"payload = 'y', headers = '{\"a\":\"b\"}', next_attempt_at = now(), created_at = now()", false},
	} {
		_, err := e.db.Pool.Exec(e.ctx, "UPDATE outbox_ring SET "+c.set+" WHERE id = $1", id)
		var pe *pgconn.PgError
		switch {
		case c.refused && (!errors.As(err, &pe) || pe.Code != "23514"):
			t.Errorf("SET %s: %v; want a check_violation", c.set, err)
		case !c.refused && err != nil:
			t.Errorf("SET %s: %v", c.set, err)
		}
	}
	var n int
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT count(*) FROM outbox_ring WHERE id = $1 AND queue = 'q' AND ordering_key = 'k' AND payload = 'y'`, id).Scan(&n); err != nil || n != 1 {
		t.Errorf("the row after the updates: %d rows, %v; want it in place with its new payload", n, err)
	}
}
