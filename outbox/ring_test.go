package outbox

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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
	rows, err := e.db.Pool.Query(e.ctx, `INSERT INTO outbox_ring (queue, payload)
		SELECT $1, convert_to('"' || i || '"', 'UTF8') FROM generate_series(1, $2) AS i RETURNING id`, queue, n)
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
