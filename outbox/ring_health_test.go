package outbox

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/internal/ring"
)

// Health reports a ring that cannot turn, and why: first lanes that have
// not read the next partition, then, once they have, a session holding a
// lock on it (as a pg_dump does); once the lock is gone, the turn empties
// the partition, and Health reports nothing of the ring.
func TestHealthSaysWhyTheRingCannotTurn(t *testing.T) {
	t.Parallel()
	e := setupWith(t, TableDefault, pgtest.RolesMode())
	e.exec(`INSERT INTO outbox_ring (queue, payload, created_at) SELECT 'q', 'x', now() - interval '1 hour' FROM generate_series(1, 6)`)
	e.exec(`INSERT INTO outbox_ring_lanes (queue, lane) SELECT 'q', l FROM generate_series(0, 7) AS l`)
	turn := func() ring.Turned {
		t.Helper()
		tr, err := ring.Turn(e.ctx, e.db.Pool, e.ob.queries, 5*time.Second, 0)
		if err != nil {
			t.Fatalf("Turn: %v", err)
		}
		return tr
	}
	// Writers move from partition 0 to 3; partition 0 keeps its unread
	// rows, so they cannot move on to it.
	for range 3 {
		if tr := turn(); !tr.Moved {
			t.Fatalf("a turn did not move writers on: %+v", tr)
		}
	}
	e.exec(`UPDATE outbox_ring_turns SET since = now() - interval '10 minutes' WHERE slot = 3`)
	health := func() (*RingHealth, string) {
		t.Helper()
		h, err := e.ob.Health(e.ctx, nil)
		if err != nil {
			t.Fatalf("Health: %v", err)
		}
		if h.Ring == nil {
			t.Fatal("Health of an outbox with the ring has no Ring")
		}
		for _, p := range h.Problems {
			if strings.Contains(p, "cannot turn") {
				t.Logf("problem: %s", p)
				return h.Ring, p
			}
		}
		return h.Ring, ""
	}

	r, problem := health()
	if r.Partition != 3 || r.NextEmptied || r.WritingFor < 10*time.Minute || len(r.Locks) != 0 {
		t.Errorf("ring health %+v; want writers in partition 3 for 10 minutes, partition 0 not emptied, no lock", r)
	}
	lanes := map[int]bool{}
	for _, b := range r.Behind {
		lanes[b.Lane] = true
		if b.Queue != "q" || b.Waiting < time.Hour || b.Waiting > time.Hour+time.Minute {
			t.Errorf("lane behind %+v; want queue q, waiting an hour", b)
		}
	}
	// Unkeyed rows take lane id % 4: six consecutive ids, all four.
	if diff := cmp.Diff(map[int]bool{0: true, 1: true, 2: true, 3: true}, lanes); diff != "" {
		t.Errorf("lanes behind (-want +got):\n%s", diff)
	}
	for _, want := range []string{"partition 3", `of queue "q" has not read it`, "subscribers run"} {
		if !strings.Contains(problem, want) {
			t.Errorf("problem %q does not say %q", problem, want)
		}
	}

	// Every lane reads the rows; a session holds partition 0 as a
	// pg_dump would.
	e.exec(`INSERT INTO outbox_ring_progress (queue, lane, snap) SELECT 'q', l, pg_current_snapshot() FROM generate_series(0, 7) AS l`)
	dump, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = dump.Rollback(e.ctx) }()
	var pid int
	if err := dump.QueryRow(e.ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := dump.Exec(e.ctx, `LOCK TABLE outbox_ring_p0 IN ACCESS SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	if tr := turn(); tr.Truncated != 0 || tr.Busy != 1 {
		t.Errorf("turn with partition 0 locked: %+v; want it kept, busy", tr)
	}
	r, problem = health()
	if len(r.Behind) != 0 || len(r.Locks) != 1 {
		t.Fatalf("ring health %+v; want no lane behind, one lock", r)
	}
	if l := r.Locks[0]; !strings.HasPrefix(l.Name, fmt.Sprintf("pid %d ", pid)) || l.Modes != "AccessShareLock" {
		t.Errorf("lock %+v; want pid %d holding AccessShareLock", l, pid)
	}
	for _, want := range []string{fmt.Sprintf("pid %d", pid), "holds AccessShareLock", "pg_dump"} {
		if !strings.Contains(problem, want) {
			t.Errorf("problem %q does not say %q", problem, want)
		}
	}

	if err := dump.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	if tr := turn(); tr.Truncated != 1 {
		t.Errorf("turn once the lock is gone: %+v; want partition 0 emptied", tr)
	}
	if r, problem = health(); !r.NextEmptied || problem != "" {
		t.Errorf("after the turn: ring health %+v, problem %q; want the next partition empty and no problem", r, problem)
	}
}
