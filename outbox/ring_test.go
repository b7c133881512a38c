package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/internal/naming"
	"github.com/outboxgen/outboxgen/internal/ring"
)

// The log tier's ring (package ring) beside the outbox table: writers
// INSERT into it with plain SQL, and every subscriber of an outbox that
// has one claims from it through the public API, on every claim path.

// setupRing is setup, outside the roles mode, with the ring beside the
// outbox table.
func setupRing(t *testing.T) *env {
	t.Helper()
	e := setupAs(t, TableDefault, false)
	if err := ring.Create(e.ctx, e.db.Pool, naming.Names{Schema: e.db.Schema, Table: TableDefault}); err != nil {
		t.Fatal(err)
	}
	return e
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
	rows, err := e.db.Pool.Query(e.ctx, `INSERT INTO `+pgx.Identifier{table}.Sanitize()+` (queue, payload)
		SELECT $1, convert_to(i::text, 'UTF8') FROM generate_series(1, $2) AS i RETURNING id`, queue, n)
	if err != nil {
		e.t.Fatal(err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			e.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	slices.Sort(ids)
	return ids
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
		first, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		cfg := onPath(p, fastConfig[string](nil))
		cfg.Workers = 1
		a := startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
			once.Do(func() {
				close(first)
				<-release
			})
			seen.add(m.ID)
			return nil
		}, cfg)
		<-first
		stopped := make(chan error, 1)
		go func() { stopped <- a.stop() }()
		time.Sleep(200 * time.Millisecond) // Run's context has ended
		close(release)
		if err := <-stopped; err != nil {
			t.Errorf("Run: %v", err)
		}
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
