package claim

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/lease"
	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/internal/ring"
)

// writeRing writes n rows of queue q into the ring as a plain SQL writer
// does, and returns their ids.
func (e *env) writeRing(n int) []int64 {
	e.t.Helper()
	return pgtest.IDs(e.t, e.DB.Pool, `INSERT INTO outbox_ring (queue, payload) SELECT 'q', '\x7b7d' FROM generate_series(1, $1) RETURNING id`, n)
}

// drainTo claims up to n rows at a time, acknowledging each claim's rows
// and waiting for its end, until h was handed want rows; it fails the
// test when a minute is not enough.
func (h *harness) drainTo(t *testing.T, ctx context.Context, n int32, want int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for len(h.ids()) < want {
		if time.Now().After(deadline) {
			t.Fatalf("handed %d rows in a minute; want %d", len(h.ids()), want)
		}
		ack(h.claim(t, ctx, n))
		h.Ended()
	}
}

// lanes gives queues their lanes of the ring, as a claimer of them does
// before its first claim, for tests that claim through a claimer's parts.
func (e *env) lanes(queues ...string) {
	e.t.Helper()
	if err := e.Q.RingAddLanes(e.ctx, queues); err != nil {
		e.t.Fatal(err)
	}
}

// endClaimBackend terminates the backend of the locked claim of h's
// first row handed out, as when its subscriber's process dies, and stops
// h.
func (e *env) endClaimBackend(h *harness) {
	e.t.Helper()
	h.mu.Lock()
	pid := h.handed[0].Batch.Hold.(*lockedClaim).tx.Conn().PgConn().PID()
	h.mu.Unlock()
	// It waits (up to a minute) for the backend to exit: its transaction
	// has then aborted.
	if _, err := e.DB.Pool.Exec(e.ctx, "SELECT pg_terminate_backend($1, 60000)", pid); err != nil {
		e.t.Fatal(err)
	}
	h.stop()
}

// A claimer by lease of an outbox whose writers write into the table
// alone writes into the ring only what lets it turn: each lane's first
// progress, then none until the lanes' progress is a turn's age old.
// (Taking a lane at every claim, it wrote a lane's progress whenever its
// last was a second old: a row per poll of an idle subscriber.) The
// table's rows are handed out as before.
func TestRingClaimsByLeaseOfAnEmptyRingWriteNoProgressPerClaim(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// One row in the ring, so that the queue uses it.
	ringID := e.writeRing(1)[0]
	h := e.harness(func(env *Env) { env.Ring, env.LockWindow, env.RingTurnAge = true, -1, time.Hour }, "q")
	progress := func() int {
		t.Helper()
		var n int
		if err := e.DB.Pool.QueryRow(e.ctx, "SELECT count(*) FROM outbox_ring_progress").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	claims := func() int {
		t.Helper()
		got := 0
		for range 8 {
			e.publish("q")
			got += len(h.claim(t, e.ctx, 10))
		}
		return got
	}
	if got := claims(); got != 9 {
		t.Fatalf("%d of the table's 8 rows and the ring's row %d handed out", got, ringID)
	}
	first := progress()
	if first > 8 {
		t.Fatalf("%d progress rows after the first claims; want at most one per lane", first)
	}
	// Past the age at which a claim that found nothing in a lane it took
	// writes the lane's progress again.
	idle := time.Now().Add(1100 * time.Millisecond)
	for time.Now().Before(idle) {
		time.Sleep(time.Until(idle))
	}
	if got := claims(); got != 8 {
		t.Fatalf("%d of the table's next 8 rows handed out", got)
	}
	if n := progress(); n != first {
		t.Errorf("%d progress rows after 8 more claims, %d before; want no more", n, first)
	}
}

// A claimer whose queues have never used the ring claims from the table
// alone: it gives them no lanes and writes nothing into the ring. Once a
// row is written into the ring, it finds it within RingProbeEvery and
// claims from both tiers from then on.
func TestRingUnusedClaimsTheTableAloneUntilARowIsWritten(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, time.Minute }, "q")
	count := func(table string) int {
		t.Helper()
		var n int
		if err := e.DB.Pool.QueryRow(e.ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for range 3 {
		e.publish("q")
		got := h.claim(t, e.ctx, 10)
		if len(got) != 1 {
			t.Fatalf("%d of the table's row handed out", len(got))
		}
		ack(got)
	}
	if lanes, progress := count("outbox_ring_lanes"), count("outbox_ring_progress"); lanes != 0 || progress != 0 {
		t.Errorf("%d lanes and %d progress rows before the queue used the ring; want none", lanes, progress)
	}
	id := e.writeRing(1)[0]
	deadline := time.Now().Add(5 * RingProbeEvery)
	var got []*lease.Delivery
	for len(got) == 0 && time.Now().Before(deadline) {
		got = h.claim(t, e.ctx, 10)
	}
	if len(got) != 1 || got[0].Row.ID != id {
		t.Fatalf("claims within %v of the ring's row %d handed out %d rows", 5*RingProbeEvery, id, len(got))
	}
	if lanes := count("outbox_ring_lanes"); lanes != 8 {
		t.Errorf("%d lanes once the queue used the ring; want 8", lanes)
	}
}

// A turn that finds a partition every lane has read past empty leaves it
// as it is, rather than giving it and its indexes new files: an idle
// outbox's ring turns every RingTurnAge. It still counts as emptied.
func TestRingTurnLeavesAnEmptyPartitionsFilesAsTheyAre(t *testing.T) {
	t.Parallel()
	e := setup(t)
	files := func() []uint32 {
		t.Helper()
		var fs []uint32
		if err := e.DB.Pool.QueryRow(e.ctx, `SELECT array_agg(pg_relation_filenode(c.oid)::oid ORDER BY c.relname)
			FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
			WHERE i.inhparent IN ('outbox_ring'::regclass, 'outbox_ring_lane_idx'::regclass, 'outbox_ring_key_idx'::regclass)`).Scan(&fs); err != nil {
			t.Fatal(err)
		}
		return fs
	}
	before := files()
	if len(before) != 12 {
		t.Fatalf("%d partitions and their indexes, want 12", len(before))
	}
	turn, err := ring.Turn(e.ctx, e.DB.Pool, e.Queries, time.Minute, 0)
	if err != nil || !turn.Moved || turn.Truncated != 1 {
		t.Fatalf("turn: %+v, %v; want writers moved and the partition they left emptied", turn, err)
	}
	if diff := cmp.Diff(before, files()); diff != "" {
		t.Errorf("the files of the ring's partitions and their indexes (-before +after):\n%s", diff)
	}
}

// A claim of a lane whose transaction dies (its backend terminated while
// the batch's handlers run) counts as a delivery: the lane's next reader
// moves that batch into the outbox table, each row with one delivery,
// and the next claim of it is the second. The dead claim's handlers may
// still run (only its connection died), so its rows are handed out
// again only once its lease would have expired.
func TestRingClaimThatDiesCountsTowardMaxDeliveries(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ids := e.writeRing(8) // one transaction: every row in one batch per lane
	const ttl = 3 * time.Second
	h := e.harness(func(env *Env) { env.Ring, env.LockWindow, env.LeaseTTL = true, 5*time.Second, ttl }, "q")
	claimed := time.Now()
	n, err := h.Claim(e.ctx, 100)
	if err != nil || n == 0 {
		t.Fatalf("claim: %d rows, %v", n, err)
	}
	first := h.ids()
	e.endClaimBackend(h)

	next := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, 5*time.Second }, "q")
	got := map[int64]int32{}
	early := map[int64]time.Duration{}
	deadline := time.Now().Add(20 * time.Second)
	for len(got) < len(ids) && time.Now().Before(deadline) {
		if _, err := next.Claim(e.ctx, 100); err != nil {
			t.Fatal(err)
		}
		seen := time.Since(claimed)
		next.mu.Lock()
		for _, d := range next.handed {
			// The first delivery of each: a claim's rows that its window
			// gives back are counted again by the next.
			if _, ok := got[d.Row.ID]; !ok {
				got[d.Row.ID] = d.Row.DeliveriesCount
				if slices.Contains(first, d.Row.ID) && seen < ttl {
					early[d.Row.ID] = seen
				}
			}
		}
		next.mu.Unlock()
	}
	want := map[int64]int32{}
	for _, id := range ids {
		want[id] = 1
	}
	for _, id := range first {
		want[id] = 2
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("deliveries counted (-want +got):\n%s", diff)
	}
	if len(early) > 0 {
		t.Errorf("rows of the dead claim handed out again before its lease of %v would have expired (id: time since the claim): %v", ttl, early)
	}
}

// The ring turns: once writers moved on and every lane has read past a
// partition, a turn empties it; a partition a lane has not read past
// keeps its rows, and so does one whose reader holds it.
func TestRingTurnsOnlyPastWhatEveryLaneRead(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// Rows of two lanes only (0 and 1, by id): the claimer's two claims
	// in flight hold them all.
	next := int64(1 << 40)
	publish := func(n int) {
		t.Helper()
		if _, err := e.DB.Pool.Exec(e.ctx, `INSERT INTO outbox_ring (id, queue, payload)
			SELECT $1::bigint + 4 * (g / 2) + g % 2, 'q', '\x7b7d' FROM generate_series(0, $2 - 1) AS g`, next, n); err != nil {
			t.Fatal(err)
		}
		next += int64(4 * n)
	}
	publish(20)
	count := func() int {
		var n int
		if err := e.DB.Pool.QueryRow(e.ctx, "SELECT count(*) FROM outbox_ring").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	turn, err := ring.Turn(e.ctx, e.DB.Pool, e.Queries, time.Minute, 0)
	if err != nil || !turn.Moved || turn.Truncated != 0 {
		t.Fatalf("first turn: %+v, %v; want writers moved, nothing emptied before any lane read", turn, err)
	}
	publish(4) // into the next partition
	h := e.harness(func(env *Env) { env.Ring, env.LockWindow, env.RingTurnAge = true, time.Minute, time.Hour }, "q")
	// Every lane reads: each claim takes one unkeyed lane and moves the
	// keyed lanes; a lane that found nothing writes its progress once
	// its last is a second old.
	deadline := time.Now().Add(20 * time.Second)
	var handed []*lease.Delivery
	for time.Now().Before(deadline) {
		if _, err := h.Claim(e.ctx, 100); err != nil {
			t.Fatal(err)
		}
		h.mu.Lock()
		handed = slices.Clone(h.handed)
		h.mu.Unlock()
		if len(handed) == 24 {
			break
		}
	}
	if len(handed) != 24 {
		t.Fatalf("%d of 24 rows handed out", len(handed))
	}
	// The claims hold their lanes: the partition's rows stay.
	if turn, err := ring.Turn(e.ctx, e.DB.Pool, e.Queries, time.Minute, time.Hour); err != nil || turn.Truncated != 0 {
		t.Fatalf("turn while lanes hold the batches: %+v, %v; want nothing emptied", turn, err)
	}
	if n := count(); n != 24 {
		t.Fatalf("%d rows in the ring; want 24", n)
	}
	ack(handed)
	h.stop()
	deadline = time.Now().Add(20 * time.Second)
	for count() != 4 && time.Now().Before(deadline) {
		if _, err := h.Claim(e.ctx, 100); err != nil {
			t.Fatal(err)
		}
		if _, err := ring.Turn(e.ctx, e.DB.Pool, e.Queries, time.Minute, time.Hour); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := count(); n != 4 {
		t.Errorf("%d rows in the ring after every lane read past the first partition; want the 4 of the next", n)
	}
}

// Rows of a lane's claim that the subscriber gives up while the claim is
// open (it stops before any handler started them) move into the outbox
// table unleased when the claim ends: the lane's progress passes them,
// and the outbox table is where they are claimed next.
func TestRingRowsGivenUpBeforeTheEndMoveToTheTable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.writeRing(8)
	h := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, time.Minute }, "q")
	if n, err := h.Claim(e.ctx, 100); err != nil || n == 0 {
		t.Fatalf("claim: %d rows, %v", n, err)
	}
	h.mu.Lock()
	handed := slices.Clone(h.handed)
	h.mu.Unlock()
	for _, d := range handed {
		if !d.Batch.Hold.GiveUp(d) {
			t.Fatalf("row %d: the claim ended before its rows were given up", d.Row.ID)
		}
	}
	h.stop()
	var want []int64
	for _, d := range handed {
		want = append(want, d.Row.ID)
	}
	slices.Sort(want)
	var got []int64
	rows, err := e.DB.Pool.Query(e.ctx, "SELECT id FROM outbox WHERE acquired_token IS NULL ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		got = append(got, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("given-up rows in the outbox table, unleased (-want +got):\n%s", diff)
	}
}

// ring.Unread counts the rows no lane's progress has seen: all of them
// before any claim and while a claim holds its batch (its progress
// commits with its end), and none once every lane's claim ended with
// every row acknowledged.
func TestRingUnreadCountsWhatNoLaneReadPast(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ids := e.writeRing(8)
	unread := func() int64 {
		t.Helper()
		n, err := ring.Unread(e.ctx, e.DB.Pool, e.Queries, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := unread(); n != int64(len(ids)) {
		t.Fatalf("%d rows unread before any claim; want %d", n, len(ids))
	}
	h := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, time.Minute }, "q")
	acked := 0
	ds := h.claim(t, e.ctx, 100)
	if len(ds) == 0 {
		t.Fatal("claim: 0 rows")
	}
	if n := unread(); n != int64(len(ids)) {
		t.Errorf("%d rows unread while a claim holds its batch; want %d", n, len(ids))
	}
	deadline := time.Now().Add(20 * time.Second)
	for acked < len(ids) && time.Now().Before(deadline) {
		ack(ds)
		acked += len(ds)
		ds = h.claim(t, e.ctx, 100)
	}
	h.stop()
	if acked != len(ids) {
		t.Fatalf("%d of %d rows handed out", acked, len(ids))
	}
	if n := unread(); n != 0 {
		t.Errorf("%d rows unread after every claim ended acknowledged; want 0", n)
	}
}

// A subscriber of several queues reads every queue's lanes in turn: a
// queue listed first, whose lanes are always free, does not keep the
// others' lanes unread.
func TestRingClaimsGoRoundEveryQueuesLanes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if _, err := e.DB.Pool.Exec(e.ctx, `INSERT INTO outbox_ring (queue, payload)
		SELECT q, '\x7b7d' FROM generate_series(1, 8), unnest(ARRAY['a', 'b']) AS q`); err != nil {
		t.Fatal(err)
	}
	h := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, time.Minute }, "a", "b")
	for range 16 { // as many claims as (queue, lane) pairs, keyed lanes too
		ack(h.claim(t, e.ctx, 100))
	}
	h.stop()
	got := map[string]int{}
	h.mu.Lock()
	for _, d := range h.handed {
		got[d.Row.Queue]++
	}
	h.mu.Unlock()
	if diff := cmp.Diff(map[string]int{"a": 8, "b": 8}, got); diff != "" {
		t.Errorf("rows handed out per queue after a claim per lane (-want +got):\n%s", diff)
	}
}

// Keyed rows move from the ring into the outbox table once each, however
// many subscribers move the keyed lanes at once while writers commit: a
// mover reads a lane's progress after it holds the lane, so a move that
// committed just before is never repeated.
func TestRingKeyedRowsMoveOnceUnderConcurrentMovers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	movers := []*harness{
		e.harness(func(env *Env) { env.Ring = true }, "q"),
		e.harness(func(env *Env) { env.Ring = true }, "q"),
	}
	const writes = 300
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(done)
		for i := range writes {
			if _, err := e.DB.Pool.Exec(e.ctx, `INSERT INTO outbox_ring (queue, payload, ordering_key) VALUES ('q', '\x7b7d', $1)`,
				fmt.Sprint("key-", i%16)); err != nil {
				t.Error(err)
				return
			}
		}
	})
	e.lanes("q")
	for _, m := range movers {
		wg.Go(func() {
			r := m.Claimer.(*byRing)
			for {
				if err := r.moveKeyed(); err != nil {
					t.Error(err)
					return
				}
				select {
				case <-done:
					if err := r.moveKeyed(); err != nil { // what the last writes left
						t.Error(err)
					}
					return
				default:
				}
			}
		})
	}
	wg.Wait()
	for _, m := range movers {
		m.stop()
	}
	var moved int
	if err := e.DB.Pool.QueryRow(e.ctx, "SELECT count(*) FROM outbox").Scan(&moved); err != nil {
		t.Fatal(err)
	}
	if moved != writes {
		t.Errorf("%d rows in the outbox table from %d keyed rows written into the ring", moved, writes)
	}
}

// ackChain acknowledges d and each row of its key that d's claim hands
// out after it, as the run's worker does, and returns their ids.
func ackChain(d *lease.Delivery) []int64 {
	var ids []int64
	for ; d != nil; d = d.Batch.Hold.(lease.Chain).Next(d) {
		d.Batch.Hold.Keep(lease.Outcome{D: d, Kind: lease.Ack})
		ids = append(ids, d.Row.ID)
	}
	return ids
}

// keyedRows writes n rows of one ordering key into the ring and returns
// their ids.
func (e *env) keyedRows(n int) []int64 {
	e.t.Helper()
	var ids []int64
	for range n {
		var id int64
		if err := e.DB.Pool.QueryRow(e.ctx, `INSERT INTO outbox_ring (queue, payload, ordering_key) VALUES ('q', '\x7b7d', 'k')
			RETURNING id`).Scan(&id); err != nil {
			e.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// A keyed lane's batch that fills ends at its largest id: the rows of
// the lane that its snapshot saw above that id are still to be read, so
// a turn keeps their partition, and the next claims deliver them, in
// order, each once.
func TestRingTurnKeepsTheRowsAboveAKeyedLanesBound(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ids := e.keyedRows(10)
	if turn, err := ring.Turn(e.ctx, e.DB.Pool, e.Queries, time.Minute, 0); err != nil || !turn.Moved {
		t.Fatalf("turn: %+v, %v; want writers moved on", turn, err)
	}
	var got []int64
	claim := func(n int32) {
		t.Helper()
		h := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, time.Minute }, "q")
		for range 8 { // one claim per lane
			if _, err := h.Claim(e.ctx, n); err != nil {
				t.Fatal(err)
			}
		}
		h.mu.Lock()
		handed := slices.Clone(h.handed)
		h.mu.Unlock()
		for _, d := range handed {
			got = append(got, ackChain(d)...)
		}
		h.stop()
	}
	claim(4)
	if diff := cmp.Diff(ids[:4], got); diff != "" {
		t.Fatalf("first batch (-want +got):\n%s", diff)
	}
	if _, err := ring.Turn(e.ctx, e.DB.Pool, e.Queries, time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := e.DB.Pool.QueryRow(e.ctx, "SELECT count(*) FROM outbox_ring").Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != len(ids) {
		t.Fatalf("%d rows left in the ring after a turn; want its %d (the partition holds rows still to be read)", left, len(ids))
	}
	claim(100)
	if diff := cmp.Diff(ids, got); diff != "" {
		t.Errorf("rows delivered (-want +got):\n%s", diff)
	}
}

// tableRow is a row of the outbox table as the tests of dead claims of
// keyed lanes read it: Due, whether it may be claimed now.
type tableRow struct {
	ID         int64
	Key        string
	Deliveries int32
	Due        bool
}

// claimUntilTableHolds claims queue q with a new claimer until the
// outbox table holds n rows (for up to 10 s), as the next reader of a
// dead claim's lanes, and returns the table's rows in id order.
func (e *env) claimUntilTableHolds(n int) []tableRow {
	e.t.Helper()
	next := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, 5*time.Second }, "q")
	defer next.stop()
	var got []tableRow
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < n && time.Now().Before(deadline) {
		if _, err := next.Claim(e.ctx, 100); err != nil {
			e.t.Fatal(err)
		}
		rows, err := e.DB.Pool.Query(e.ctx, "SELECT id, ordering_key, deliveries_count, next_attempt_at <= now() FROM outbox ORDER BY id")
		if err != nil {
			e.t.Fatal(err)
		}
		if got, err = pgx.CollectRows(rows, pgx.RowToStructByPos[tableRow]); err != nil {
			e.t.Fatal(err)
		}
	}
	return got
}

// A keyed lane's claim that dies counts a delivery of the one row of
// the key it handed out: the next reader moves every row the lane has
// not consumed into the outbox table, in order, keeping their ids and
// keys, the key's first with one delivery, due when the dead claim's
// lease would have expired, and the rest behind it with none (the claim
// never handed them out).
func TestRingKeyedClaimThatDiesMovesTheLaneBehindItsKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ids := e.keyedRows(10)
	h := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, 5*time.Second }, "q")
	for range 8 {
		if _, err := h.Claim(e.ctx, 4); err != nil {
			t.Fatal(err)
		}
		if len(h.ids()) > 0 {
			break
		}
	}
	if diff := cmp.Diff(ids[:1], h.ids()); diff != "" {
		t.Fatalf("handed out (-want +got): the key's first row only\n%s", diff)
	}
	e.endClaimBackend(h)

	got := e.claimUntilTableHolds(len(ids))
	// The row handed out is due when the dead claim's lease of 30 s
	// would have expired (its handler may run until then): the key waits
	// for it.
	var want []tableRow
	for i, id := range ids {
		want = append(want, tableRow{ID: id, Key: "k", Deliveries: map[bool]int32{true: 1, false: 0}[i == 0], Due: i > 0})
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the lane's rows in the outbox table (-want +got):\n%s", diff)
	}
}

// A keyed lane's claim records the acknowledgement of a key's row before
// it hands the key's next row out: when the claim dies after that, the
// next reader leaves the acknowledged row out of what it moves into the
// outbox table (a key's row is never delivered again after a later one
// ran), and counts the delivery of the row that ran next.
func TestRingKeyedClaimThatDiesDoesNotDeliverAnAcknowledgedRowAgain(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ids := e.keyedRows(4)
	h := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, 5*time.Second }, "q")
	var first []*lease.Delivery
	for range 8 {
		if first = h.claim(t, e.ctx, 4); len(first) > 0 {
			break
		}
	}
	if len(first) != 1 || first[0].Row.ID != ids[0] {
		t.Fatalf("handed out %v; want the key's first row only, %d", h.ids(), ids[0])
	}
	first[0].Batch.Hold.Keep(lease.Outcome{D: first[0], Kind: lease.Ack})
	second := first[0].Batch.Hold.(lease.Chain).Next(first[0])
	if second == nil || second.Row.ID != ids[1] {
		t.Fatalf("after the first row's acknowledgement the claim handed out %v; want row %d", second, ids[1])
	}
	e.endClaimBackend(h)
	// The claim's transaction is over: no acknowledgement of it is
	// recorded any more, so no next row of a key runs.
	if first[0].Batch.Hold.(*lockedClaim).acks.record(ids[1]) {
		t.Error("an acknowledgement of a claim whose backend was terminated was recorded")
	}

	got := e.claimUntilTableHolds(len(ids) - 1)
	want := []tableRow{{ids[1], "k", 1, false}, {ids[2], "k", 0, true}, {ids[3], "k", 0, true}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the lane's rows in the outbox table (-want +got):\n%s", diff)
	}
	if unread, err := ring.Unread(e.ctx, e.DB.Pool, e.Queries, time.Minute); err != nil || unread != 0 {
		t.Errorf("ring.Unread = %d, %v; want 0: the acknowledged row is consumed", unread, err)
	}
}

// lanesOf returns the lanes of ds's unkeyed ring rows (a row's id modulo
// 4), sorted.
func lanesOf(ds []*lease.Delivery) []int64 {
	var lanes []int64
	for _, d := range ds {
		lanes = append(lanes, d.Row.ID%4)
	}
	slices.Sort(lanes)
	return slices.Compact(lanes)
}

// lanesFree waits until no transaction holds a lane of e's ring.
func (e *env) lanesFree() {
	e.t.Helper()
	e.lanesHeld(0)
}

// lanesHeld waits until transactions hold n lanes of e's ring.
func (e *env) lanesHeld(n int) {
	e.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		tx, err := e.DB.Pool.Begin(e.ctx)
		if err != nil {
			e.t.Fatal(err)
		}
		var free, all int
		err = tx.QueryRow(e.ctx, `SELECT (SELECT count(*) FROM (SELECT FROM outbox_ring_lanes FOR UPDATE SKIP LOCKED) AS f),
			(SELECT count(*) FROM outbox_ring_lanes)`).Scan(&free, &all)
		_ = tx.Rollback(e.ctx)
		if err != nil {
			e.t.Fatal(err)
		}
		if all-free == n {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%d of %d lanes held; want %d", all-free, all, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A claim takes its share of the lanes that have rows, in one
// transaction: with two claims in flight, half of them each, so that
// rows in every lane are handed out by the next claims instead of one
// lane per claim.
func TestRingClaimTakesItsShareOfTheLanesWithRows(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, time.Minute }, "q")
	// A first claim gives every lane its progress (lanes without one are
	// ready to be given one).
	e.writeRing(1)
	ack(h.claim(t, e.ctx, 100))
	e.lanesFree()
	e.writeRing(8) // two rows in each unkeyed lane
	var claims [][]int64
	handed := 0
	for range InFlight {
		ds := h.claim(t, e.ctx, 100)
		claims = append(claims, lanesOf(ds))
		handed += len(ds)
	}
	if diff := cmp.Diff([][]int64{{0, 1}, {2, 3}}, claims); diff != "" {
		t.Errorf("lanes of each claim's rows (-want +got):\n%s", diff)
	}
	if handed != 8 {
		t.Errorf("%d rows handed out; want 8", handed)
	}
}

// A claim that finds every lane with rows held by the subscriber's own
// claims in flight takes none without a transaction: it waits for one of
// them to end (up to MinFetchInterval), and takes lanes again once one
// has.
func TestRingClaimOfLanesItsOwnClaimsHoldBeginsNoTransaction(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var takes atomic.Int32
	h := e.harness(func(env *Env) {
		// No lane's progress old enough to be written again: only
		// lanes with rows are ready.
		env.Ring, env.LockWindow, env.MinFetchInterval, env.RingTurnAge = true, time.Minute, 50*time.Millisecond, time.Hour
		queries := env.Queries
		env.Queries = func(d db.DBTX) *db.Queries { return queries(countTakes{DBTX: d, n: &takes}) }
	}, "q")
	e.writeRing(1)
	ack(h.claim(t, e.ctx, 100))
	e.lanesFree()
	e.writeRing(4) // a row in each unkeyed lane
	held := h.claim(t, e.ctx, 100)
	if diff := cmp.Diff([]int64{0, 1}, lanesOf(held)); diff != "" {
		t.Fatalf("lanes of the first claim's rows (-want +got):\n%s", diff)
	}
	second := h.claim(t, e.ctx, 100)
	if diff := cmp.Diff([]int64{2, 3}, lanesOf(second)); diff != "" {
		t.Fatalf("lanes of the second claim's rows (-want +got):\n%s", diff)
	}
	ack(second)
	e.lanesHeld(2)
	// The lanes with rows are the first claim's.
	before := takes.Load()
	if got := h.claim(t, e.ctx, 100); len(got) != 0 {
		t.Fatalf("a claim was handed %d rows of lanes the first claim holds", len(got))
	}
	if got := takes.Load() - before; got != 0 {
		t.Errorf("a claim tried to take lanes %d times while its own claim held every lane with rows; want 0", got)
	}
	// Once the first claim ends, its lanes are free again.
	ack(held)
	e.writeRing(4)
	h.drainTo(t, e.ctx, 100, 1+4+4)
}

// countTakes counts the statements that take lanes (RingTakeLanes) run
// through it.
type countTakes struct {
	db.DBTX
	n *atomic.Int32
}

func (c countTakes) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if strings.Contains(sql, "FOR UPDATE OF l SKIP LOCKED") {
		c.n.Add(1)
	}
	return c.DBTX.Query(ctx, sql, args...)
}

// A claim whose batch fills before it reads every lane it took leaves
// the next claim to start from the first lane it did not read, which
// then comes first: a lane held unread is never passed over.
func TestRingLaneTakenButNotReadComesNext(t *testing.T) {
	t.Parallel()
	e := setup(t)
	written := e.writeRing(8)
	h := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, time.Minute }, "q")
	var lanes [][]int64
	for i := range 3 {
		ds := h.claim(t, e.ctx, 2)
		lanes = append(lanes, lanesOf(ds))
		ack(ds)
		if i < 2 {
			e.lanesFree()
		}
		if i == 0 {
			// Its end wrote the progress of the lane it read, and of no
			// lane it held unread.
			var progressed []int16
			if err := e.DB.Pool.QueryRow(e.ctx, `SELECT coalesce(array_agg(DISTINCT lane ORDER BY lane), '{}') FROM outbox_ring_progress`).
				Scan(&progressed); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]int16{0}, progressed); diff != "" {
				t.Errorf("lanes with progress after the first claim (-want +got):\n%s", diff)
			}
		}
	}
	// The first claim took lanes 0 and 1 (and more) and read lane 0; the
	// next ones take a lane each, from lane 1.
	if diff := cmp.Diff([][]int64{{0}, {1}, {2}}, lanes); diff != "" {
		t.Errorf("lanes of each claim's rows (-want +got):\n%s", diff)
	}
	// The claims' ends wrote the progress of the lanes they read, and of
	// no lane they held unread: every row is handed out once.
	h.Ended()
	h.drainTo(t, e.ctx, 100, len(written))
	if diff := cmp.Diff(written, h.ids()); diff != "" {
		t.Errorf("rows handed out (-want +got):\n%s", diff)
	}
}

// pacedState is the outbox table's claimer of a claimer of the ring,
// each of whose claims takes at least took, and which records when each
// started and what it found.
type pacedState struct {
	Claimer
	took   time.Duration
	mu     sync.Mutex
	starts []time.Time
	found  []int
}

func (s *pacedState) Claim(ctx context.Context, n int32) (int, error) {
	start := time.Now()
	time.Sleep(s.took)
	got, err := s.Claimer.Claim(ctx, n)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.starts, s.found = append(s.starts, start), append(s.found, got)
	return got, err
}

func (s *pacedState) calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.starts)
}

// After a claim of the outbox table that found nothing, a claimer of the
// ring claims the table again only once a tenth of its time has gone to
// such claims (nine times as long as the last one took), however many
// claims of the ring leave room before then, unless rows may have come
// to the table since: a claim of the ring moved some there, a key was
// handed on, the table's last claim found rows, or the last claim found
// nothing at all.
func TestRingTableClaimsThatFindNothingTakeATenthOfTheTime(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := e.harness(func(env *Env) {
		env.Ring, env.LockWindow = true, time.Minute
		env.MinFetchInterval = time.Hour // the pace's cap, out of the way
	}, "q")
	br := h.Claimer.(*byRing)
	// Every lane read once, so that each has its progress and the next
	// claim takes the lane of the next row: claims until one finds no
	// lane to read.
	e.lanes("q")
	for e.writeRing(8); ; {
		if _, read, _, err := br.claimFreeLanes(e.ctx, 100, RingTurnAge); err != nil || read < 0 {
			if err != nil {
				t.Fatal(err)
			}
			break
		}
		h.mu.Lock()
		ds := slices.Clone(h.handed)
		h.handed = nil
		h.mu.Unlock()
		ack(ds)
		h.Ended()
	}
	paced := &pacedState{took: 100 * time.Millisecond}
	paced.Claimer, br.state = br.state, paced
	claimOne := func(what string) {
		t.Helper()
		ds := h.claim(t, e.ctx, 100)
		if len(ds) != 1 {
			t.Fatalf("%s: handed %d rows; want 1", what, len(ds))
		}
		ack(ds)
		h.Ended()
	}

	for range 6 {
		e.writeRing(1)
		claimOne("claim of one new row")
	}
	paced.mu.Lock()
	if len(paced.starts) == 0 {
		t.Fatal("no claim of the ring claimed the table")
	}
	for i := 1; i < len(paced.starts); i++ {
		if gap := paced.starts[i].Sub(paced.starts[i-1]); gap < 10*paced.took {
			t.Errorf("the table's claims %d and %d, the first of which found nothing, started %v apart; want at least %v",
				i-1, i, gap, 10*paced.took)
		}
	}
	paced.mu.Unlock()

	step := func(what string, before func()) {
		t.Helper()
		before()
		calls := paced.calls()
		e.writeRing(1)
		claimOne(what)
		if got := paced.calls(); got != calls+1 {
			t.Errorf("%s: the table was claimed %d times at the next claim; want once", what, got-calls)
		}
	}
	step("a key handed on", func() { h.HandedOn(nil) })
	step("a ring row moved into the table", func() {
		// Two rows of one lane (by id), the first not yet due.
		if _, err := e.DB.Pool.Exec(e.ctx, `INSERT INTO outbox_ring (id, queue, payload, next_attempt_at)
			VALUES (1 << 40, 'q', '\x7b7d', now() + interval '1 hour'), ((1 << 40) + 4, 'q', '\x7b7d', now())`); err != nil {
			t.Fatal(err)
		}
		claimOne("a claim that moves a row not yet due")
	})
	// A row written into the table (Behind: a hand-over completed) is
	// claimed, and the claim after one that found rows claims the table
	// again.
	calls := paced.calls()
	h.Behind()
	if _, err := e.DB.Pool.Exec(e.ctx, `INSERT INTO outbox (queue, payload) VALUES ('q', '\x7b7d')`); err != nil {
		t.Fatal(err)
	}
	e.writeRing(1)
	ds := h.claim(t, e.ctx, 100)
	if len(ds) != 2 || paced.calls() != calls+1 {
		t.Fatalf("handed %d rows in %d claims of the table; want the ring's row and the table's, in one", len(ds), paced.calls()-calls)
	}
	ack(ds)
	h.Ended()
	step("after a claim of the table that found rows", func() {})
	// A Claim that found nothing in either tier sends the fetcher to
	// wait (for MinFetchInterval, a writer's notification, its sleep
	// record): the claim after the wait looks at the table, where the
	// row a writer notified of may be.
	step("after a claim that found nothing", func() {
		if ds := h.claim(t, e.ctx, 100); len(ds) != 0 {
			t.Fatalf("a claim with nothing written handed %d rows", len(ds))
		}
	})
}

// A row of the outbox table does not wait for the ring's backlog: after
// a claim of the ring that filled its batch, the next claims the table
// first.
func TestRingTableRowsDoNotWaitForTheRingsBacklog(t *testing.T) {
	t.Parallel()
	e := setup(t)
	backlog := e.writeRing(40)
	table := pgtest.IDs(t, e.DB.Pool, `INSERT INTO outbox (queue, payload) VALUES ('q', '\x7b7d') RETURNING id`)[0]
	h := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, time.Minute }, "q")
	var claims [][]int64
	for len(claims) < 2 {
		ds := h.claim(t, e.ctx, 5)
		var ids []int64
		for _, d := range ds {
			ids = append(ids, d.Row.ID)
		}
		claims = append(claims, ids)
		ack(ds)
		h.Ended()
	}
	if !slices.Contains(claims[1], table) {
		t.Errorf("claims of 5 rows handed %v; want the table's row %d in the second, with the ring's %d rows still waiting",
			claims, table, len(backlog))
	}
}

// scanSpy runs the ring's reads a claimer sends under EXPLAIN ANALYZE
// first, where they run, and records how many rows each scanned and
// dropped: the lanes' reads (RingRead) and the look for lanes with rows
// (RingReadyLanes).
type scanSpy struct {
	db.DBTX
	mu      *sync.Mutex
	dropped map[string][]int
}

func (s scanSpy) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if name := strings.Fields(sql + "   ")[2]; name == "RingRead" || name == "RingReadyLanes" {
		var plan []struct{ Plan map[string]any }
		if err := s.DBTX.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+sql, args...).Scan(&plan); err != nil {
			return nil, err
		}
		s.mu.Lock()
		s.dropped[name] = append(s.dropped[name], filtered(plan[0].Plan))
		s.mu.Unlock()
	}
	return s.DBTX.Query(ctx, sql, args...)
}

// filtered returns how many rows the scans of plan n read and dropped
// by a filter.
func filtered(n map[string]any) int {
	removed := 0
	if v, ok := n["Rows Removed by Filter"].(float64); ok {
		removed += int(v)
	}
	if subs, ok := n["Plans"].([]any); ok {
		for _, sub := range subs {
			removed += filtered(sub.(map[string]any))
		}
	}
	return removed
}

// While a transaction that took an id stays open (holding the vacuum
// horizon, and every snapshot's xmin where it began), a read of a lane,
// and the look for lanes with rows, scan no more rows than were written
// since the lanes' last batches: not the 800 rows their earlier batches
// consumed since the transaction began. (A scan starts at the first
// transaction that ran at the last batch and is done now, so other
// clients' transactions make it read some rows the last batch consumed:
// up to 32 may be dropped, a quarter of the fewest rows a scan from the
// held transaction drops here, and the claims of the last rows are tried
// up to three times.)
func TestRingReadStepsOverWhatAHeldTransactionKeepsBehindIt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	holder, err := e.DB.Pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(e.ctx) }()
	if _, err := holder.Exec(e.ctx, "SELECT pg_current_xact_id()"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	dropped := map[string][]int{}
	h := e.harness(func(env *Env) {
		env.Ring, env.LockWindow = true, time.Minute
		queries := env.Queries
		env.Queries = func(d db.DBTX) *db.Queries { return queries(scanSpy{DBTX: d, mu: &mu, dropped: dropped}) }
	}, "q")
	drain := func(ids []int64) {
		t.Helper()
		h.drainTo(t, e.ctx, 1000, len(h.ids())+len(ids))
	}
	for range 4 {
		drain(e.writeRing(200)) // a lane's batch, 50 rows a lane, in each of four claims
	}
	const most = 32
	var last map[string][]int
	for range 3 {
		mu.Lock()
		clear(dropped)
		mu.Unlock()
		drain(e.writeRing(8))
		mu.Lock()
		last = maps.Clone(dropped)
		mu.Unlock()
		if len(last["RingRead"]) > 0 && slices.Max(last["RingRead"]) <= most && slices.Max(last["RingReadyLanes"]) <= most {
			return
		}
	}
	t.Errorf("rows that earlier batches consumed, scanned and dropped by each statement of the claims of 8 new rows: %v; want at most %d",
		last, most)
}

// A turn empties a partition only if every lane has read it all once no
// writer holds it: a writer still open when the turn found the partition
// read past, which commits before the turn locks it, keeps it, and its
// row is delivered.
func TestRingTurnKeepsARowCommittedAfterItsPartitionWasFoundReadPast(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, time.Minute }, "q")
	drain := func(want int) {
		t.Helper()
		h.drainTo(t, e.ctx, 100, want)
	}
	drain(len(e.writeRing(8)))
	writer, err := e.DB.Pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = writer.Rollback(e.ctx) }()
	var late int64
	if err := writer.QueryRow(e.ctx, `INSERT INTO outbox_ring (queue, payload) VALUES ('q', '\x7b7d') RETURNING id`).Scan(&late); err != nil {
		t.Fatal(err)
	}
	// Writers move on, and every lane has read what it sees of the
	// partition the writer wrote into.
	if turn, err := ring.Turn(e.ctx, e.DB.Pool, e.Queries, time.Minute, 0); err != nil || !turn.Moved {
		t.Fatalf("turn: %+v, %v; want writers moved", turn, err)
	}
	drain(8)
	var slot int16
	if err := e.DB.Pool.QueryRow(e.ctx, "SELECT slot FROM outbox_ring_turns WHERE done_below IS NOT NULL").Scan(&slot); err != nil {
		t.Fatal(err)
	}
	done, err := e.Q.RingDoneSlots(e.ctx)
	if err != nil || !slices.Contains(done, slot) {
		t.Fatalf("partitions read past: %v, %v; want %d, whose writer is still open", done, err, slot)
	}
	if err := writer.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if emptied, err := e.Q.RingTruncate(e.ctx, slot); err != nil || emptied {
		t.Fatalf("emptying partition %d after its writer committed: %t, %v; want it kept", slot, emptied, err)
	}
	drain(9)
	if ids := h.ids(); !slices.Contains(ids, late) {
		t.Errorf("rows handed out %v; want the late writer's row %d among them", ids, late)
	}
}

// A turn marks the partition writers left as written by transactions
// below its own: a writer that took its xid before the turn, and whose
// row is in that partition, is below the mark whatever had ended by then.
// (A snapshot's xmax, the mark before, is one past the newest xid that
// had ended: a writer whose xid came after that one was above the mark.
// Once a lane's progress passed the mark, the lane's reads left the
// partition out, its progress consumed the writer's row unread, and a
// turn emptied it.)
func TestRingTurnMarksAPartitionAboveEveryWriterOfIt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// Round the ring twice: a writer above the newest ended xid, as on an
	// idle server, is one the old mark missed.
	for range 8 {
		writer, err := e.DB.Pool.Begin(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		var slot int16
		var xid string
		if err := writer.QueryRow(e.ctx, `INSERT INTO outbox_ring (queue, payload) VALUES ('q', '\x7b7d') RETURNING slot, txid::text`).
			Scan(&slot, &xid); err != nil {
			t.Fatal(err)
		}
		if turn, err := ring.Turn(e.ctx, e.DB.Pool, e.Queries, time.Minute, 0); err != nil || !turn.Moved {
			t.Fatalf("turn: %+v, %v; want writers moved", turn, err)
		}
		var mark string
		var above bool
		if err := e.DB.Pool.QueryRow(e.ctx, `SELECT done_below::text, done_below > $2::xid8 FROM outbox_ring_turns WHERE slot = $1`, slot, xid).
			Scan(&mark, &above); err != nil {
			t.Fatal(err)
		}
		if !above {
			t.Errorf("partition %d marked as written below xid %s; want above its writer's, %s", slot, mark, xid)
		}
		// The row goes, and the next turn empties the partition.
		if err := writer.Rollback(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Two turns at once: one moves writers on and, before it marks the
// partition they left, the other moves them on again (the partition they
// passed through looked old, its time being set by the first's mark). The
// first's mark leaves the second's standing: the partition they passed
// through holds a row, and stays marked until every lane has read past
// it, so that no turn sends writers into it before it is emptied.
func TestRingTurnsAtOnceKeepEachOthersMarks(t *testing.T) {
	t.Parallel()
	e := setup(t)
	st, err := e.Q.RingTurnState(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if next, err := e.Q.RingNextSlot(e.ctx, st.Slot); err != nil || !next.Turned {
		t.Fatalf("first turn: %+v, %v; want writers moved", next, err)
	}
	var passed int16
	if err := e.DB.Pool.QueryRow(e.ctx, `INSERT INTO outbox_ring (queue, payload) VALUES ('q', '\x7b7d') RETURNING slot`).Scan(&passed); err != nil {
		t.Fatal(err)
	}
	if turn, err := ring.Turn(e.ctx, e.DB.Pool, e.Queries, time.Minute, 0); err != nil || !turn.Moved {
		t.Fatalf("second turn: %+v, %v; want writers moved", turn, err)
	}
	if err := e.Q.RingCloseSlot(e.ctx, st.Slot); err != nil {
		t.Fatal(err)
	}
	rows, err := e.DB.Pool.Query(e.ctx, `SELECT slot FROM outbox_ring_turns WHERE done_below IS NOT NULL ORDER BY slot`)
	if err != nil {
		t.Fatal(err)
	}
	marked, err := pgx.CollectRows(rows, pgx.RowTo[int16])
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int16{st.Slot, passed}, marked); diff != "" {
		t.Errorf("partitions marked as left (-want +got):\n%s", diff)
	}
}

// A turn that read the ring's state before other turns went round it
// does not move writers into the next partition while it is still
// marked (its rows not yet read past by every lane, and not emptied).
func TestRingTurnMovesWritersOnlyIntoAnOpenPartition(t *testing.T) {
	t.Parallel()
	e := setup(t)
	st, err := e.Q.RingTurnState(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.DB.Pool.Exec(e.ctx, `UPDATE outbox_ring_turns SET done_below = '1' WHERE slot = ($1::smallint + 1) % 4`, st.Slot); err != nil {
		t.Fatal(err)
	}
	next, err := e.Q.RingNextSlot(e.ctx, st.Slot)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(db.RingNextSlotRow{Slot: st.Slot, Turned: false}, next); diff != "" {
		t.Errorf("turn into a marked partition (-want +got):\n%s", diff)
	}
}

// Rows of a queue that no claimer has claimed yet (it has no lanes) keep
// their partition: the turn gives the queue its lanes instead of emptying
// it, and the queue's first claimer reads them.
func TestRingTurnKeepsTheRowsOfAQueueWithoutLanes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ids := pgtest.IDs(t, e.DB.Pool, `INSERT INTO outbox_ring (queue, payload) SELECT 'new', '\x7b7d' FROM generate_series(1, 6) RETURNING id`)
	for range 2 {
		if _, err := ring.Turn(e.ctx, e.DB.Pool, e.Queries, time.Minute, 0); err != nil {
			t.Fatal(err)
		}
	}
	var lanes, rows int
	if err := e.DB.Pool.QueryRow(e.ctx, `SELECT (SELECT count(*) FROM outbox_ring_lanes WHERE queue = 'new'),
		(SELECT count(*) FROM outbox_ring WHERE queue = 'new')`).Scan(&lanes, &rows); err != nil || lanes != 8 || rows != len(ids) {
		t.Fatalf("after two turns, the queue has %d lanes and %d rows (%v); want 8 and %d", lanes, rows, err, len(ids))
	}
	h := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, time.Minute }, "new")
	h.drainTo(t, e.ctx, 100, len(ids))
	if diff := cmp.Diff(ids, h.ids()); diff != "" {
		t.Errorf("rows handed out (-want +got):\n%s", diff)
	}
}

// A lane's progress that saw a writer's transaction running, and later
// ones done, is followed by a batch that starts at that writer's rows;
// when they fill it, its cut still sees the later transactions the
// progress saw, so no row is handed out twice (a cut that forgot them
// had the lane read their rows again), by lock and by lease.
func TestRingBatchCutAtATransactionTheProgressSawRunningReadsNoRowTwice(t *testing.T) {
	t.Parallel()
	for _, k := range []struct {
		name string
		set  func(*Env)
	}{
		{"lock", func(env *Env) { env.Ring, env.LockWindow = true, time.Minute }},
		{"lease", func(env *Env) { env.Ring, env.LockWindow = true, -1 }},
	} {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			// A writer whose transaction takes its id first (one row in
			// each unkeyed lane), and commits after the next writers'.
			early, err := e.DB.Pool.Begin(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer early.Rollback(e.ctx)
			held := pgtest.IDs(t, early, `INSERT INTO outbox_ring (queue, payload) SELECT 'q', '\x7b7d' FROM generate_series(1, 4) RETURNING id`)
			later := e.writeRing(8)
			h := e.harness(k.set, "q")
			h.drainTo(t, e.ctx, 100, len(later))
			if err := early.Commit(e.ctx); err != nil {
				t.Fatal(err)
			}
			// One row per batch: the early writer's row of a lane fills
			// its batch, and the cut comes right after its transaction.
			h.drainTo(t, e.ctx, 1, len(later)+len(held))
			for range 16 { // every lane read again: nothing is left
				ack(h.claim(t, e.ctx, 100))
				h.Ended()
			}
			want := slices.Sorted(slices.Values(append(held, later...)))
			if diff := cmp.Diff(want, h.ids()); diff != "" {
				t.Errorf("rows handed out (-want +got):\n%s", diff)
			}
		})
	}
}

// A claim of a keyed lane that keeps a key's rows back, because the
// outbox table holds rows of the key, moves them there as it ends, not
// as it begins: a move takes the key's lock, which the claim's
// transaction would hold while its handlers run, and the table's writes
// of the key (a publisher's row, a head's acknowledgement) would wait
// for its end.
func TestRingClaimKeepingAKeysRowsBackDoesNotHoldTheKeyWhileItsRowsRun(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// A key of the same lane as k, whose row the claim hands out.
	var other string
	if err := e.DB.Pool.QueryRow(e.ctx, `SELECT 'j' || g FROM generate_series(1, 1000) AS g
		WHERE ((hashtext('j' || g) % 4) + 4) % 4 = ((hashtext('k') % 4) + 4) % 4 ORDER BY g LIMIT 1`).Scan(&other); err != nil {
		t.Fatal(err)
	}
	tableRow := func(ctx context.Context) error {
		_, err := e.DB.Pool.Exec(ctx, `INSERT INTO outbox (queue, payload, ordering_key) VALUES ('q', '\x7b7d', 'k')`)
		return err
	}
	if err := tableRow(e.ctx); err != nil {
		t.Fatal(err)
	}
	ringRows := e.keyedRows(2)
	if _, err := e.DB.Pool.Exec(e.ctx, `INSERT INTO outbox_ring (queue, payload, ordering_key) VALUES ('q', '\x7b7d', $1)`, other); err != nil {
		t.Fatal(err)
	}
	h := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, time.Minute }, "q")
	// The ring's claim hands out the row of the other key, and the outbox
	// table's claim the row of k there.
	var ds []*lease.Delivery
	for range 8 {
		ds = append(ds, h.claim(t, e.ctx, 100)...)
		if len(ds) >= 2 {
			break
		}
	}
	var keys []string
	for _, d := range ds {
		keys = append(keys, *d.Row.OrderingKey)
	}
	slices.Sort(keys)
	if diff := cmp.Diff([]string{other, "k"}, keys); diff != "" {
		t.Fatalf("keys of the rows handed out (-want +got):\n%s", diff)
	}
	// The claim is open, its row unacknowledged: a publisher of k is not
	// held up by it.
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	if err := tableRow(ctx); err != nil {
		t.Fatalf("a publisher of a key the open claim keeps rows of back: %v", err)
	}
	ack(ds)
	h.Ended()
	var ids []int64
	rows, err := e.DB.Pool.Query(e.ctx, `SELECT id FROM outbox WHERE ordering_key = 'k' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	if ids, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
		t.Fatal(err)
	}
	// The head was acknowledged: the publisher's row and the ring's two
	// are left.
	if len(ids) != 3 {
		t.Errorf("rows of k in the outbox table: %v; want the publisher's and the ring's %v", ids, ringRows)
	}
}

// An open claim of lanes holds locks only on the ring's partitions its
// lanes' positions name: its statements that read the ring are planned
// for their parameters at every execution, however often its connection
// ran them before, so the ring turns past the other partitions while it
// runs (a cached generic plan locks every partition).
func TestRingOpenClaimLocksOnlyThePartitionsItsLanesRead(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pool := e.pool(MinLockingPoolConns)
	// Unkeyed rows only, and no lane's progress old enough to be written
	// again: the claims take unkeyed lanes with rows (a keyed lane reads
	// every partition not emptied).
	h := e.harness(func(env *Env) {
		env.Ring, env.LockWindow, env.Pool, env.RingTurnAge = true, time.Minute, pool, time.Hour
	}, "q")
	// More claims than PostgreSQL plans a statement for its parameters
	// before it may cache a generic plan (five), on each of the pool's
	// connections.
	for i := range 8 * MinLockingPoolConns {
		e.writeRing(4)
		h.drainTo(t, e.ctx, 100, 4*(i+1))
	}
	// Partitions 2 and 3 as left long ago (after the claimer's first
	// turn, which would empty them and open them again): no lane's
	// position names them.
	if _, err := e.DB.Pool.Exec(e.ctx, `UPDATE outbox_ring_turns SET done_below = '1' WHERE slot IN (2, 3)`); err != nil {
		t.Fatal(err)
	}
	e.writeRing(4)
	var ds []*lease.Delivery
	for range 8 {
		if ds = h.claim(t, e.ctx, 100); len(ds) > 0 {
			break
		}
	}
	if len(ds) == 0 {
		t.Fatal("no claim of the last rows")
	}
	pid := ds[0].Batch.Hold.(*lockedClaim).tx.Conn().PgConn().PID()
	rows, err := e.DB.Pool.Query(e.ctx, `SELECT c.relname::text FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation
		WHERE l.pid = $1 AND c.relname ~ '^outbox_ring_p[0-9]$' ORDER BY 1`, pid)
	if err != nil {
		t.Fatal(err)
	}
	locked, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"outbox_ring_p0", "outbox_ring_p1"}, locked); diff != "" {
		t.Errorf("partitions the open claim locks (-want +got):\n%s", diff)
	}
	ack(ds)
}
