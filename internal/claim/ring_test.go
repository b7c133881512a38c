package claim

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/lease"
	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/internal/ring"
)

// ringEnv is e with the ring created; publish writes n rows of queue q
// into it as a plain SQL writer does, and returns their ids.
func (e *env) ring() func(n int) []int64 {
	e.t.Helper()
	if err := ring.Create(e.ctx, e.DB.Pool, e.Names); err != nil {
		e.t.Fatal(err)
	}
	return func(n int) []int64 {
		e.t.Helper()
		return pgtest.IDs(e.t, e.DB.Pool, `INSERT INTO outbox_ring (queue, payload) SELECT 'q', '\x7b7d' FROM generate_series(1, $1) RETURNING id`, n)
	}
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
	if _, err := e.DB.Pool.Exec(e.ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		e.t.Fatal(err)
	}
	h.stop()
}

// A claim of a lane whose transaction dies (its backend terminated while
// the batch's handlers run) counts as a delivery: the lane's next reader
// moves that batch into the outbox table, each row with one delivery,
// and the next claim of it is the second.
func TestRingClaimThatDiesCountsTowardMaxDeliveries(t *testing.T) {
	t.Parallel()
	e := setup(t)
	publish := e.ring()
	ids := publish(8) // one transaction: every row in one batch per lane
	h := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, 5*time.Second }, "q")
	n, err := h.Claim(e.ctx, 100)
	if err != nil || n == 0 {
		t.Fatalf("claim: %d rows, %v", n, err)
	}
	first := h.ids()
	e.endClaimBackend(h)

	next := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, 5*time.Second }, "q")
	got := map[int64]int32{}
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < len(ids) && time.Now().Before(deadline) {
		if _, err := next.Claim(e.ctx, 100); err != nil {
			t.Fatal(err)
		}
		next.mu.Lock()
		for _, d := range next.handed {
			// The first delivery of each: a claim's rows that its window
			// gives back are counted again by the next.
			if _, ok := got[d.Row.ID]; !ok {
				got[d.Row.ID] = d.Row.DeliveriesCount
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
}

// The ring turns: once writers moved on and every lane has read past a
// partition, a turn empties it; a partition a lane has not read past
// keeps its rows, and so does one whose reader holds it.
func TestRingTurnsOnlyPastWhatEveryLaneRead(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.ring()
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
	publish := e.ring()
	publish(8)
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
	publish := e.ring()
	ids := publish(8)
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
	e.ring()
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
	e.ring()
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
	e.ring()
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

// A keyed lane's claim that dies counts a delivery of each row its batch
// read: the next reader moves every row the lane has not consumed into
// the outbox table, in order, keeping their ids and keys, the rows of
// the dead batch with one delivery and the rest with none.
func TestRingKeyedClaimThatDiesMovesTheLaneBehindItsKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.ring()
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

	next := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, 5*time.Second }, "q")
	type row struct {
		ID         int64
		Key        string
		Deliveries int32
	}
	var got []row
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < len(ids) && time.Now().Before(deadline) {
		if _, err := next.Claim(e.ctx, 100); err != nil {
			t.Fatal(err)
		}
		rows, err := e.DB.Pool.Query(e.ctx, "SELECT id, ordering_key, deliveries_count FROM outbox ORDER BY id")
		if err != nil {
			t.Fatal(err)
		}
		if got, err = pgx.CollectRows(rows, pgx.RowToStructByPos[row]); err != nil {
			t.Fatal(err)
		}
	}
	next.stop()
	var want []row
	for i, id := range ids {
		want = append(want, row{ID: id, Key: "k", Deliveries: map[bool]int32{true: 1, false: 0}[i < 4]})
	}
	// The outbox table's claim may have taken the key's first row since:
	// its count then includes that delivery.
	if len(got) > 0 && got[0].Deliveries == 2 {
		want[0].Deliveries = 2
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the lane's rows in the outbox table (-want +got):\n%s", diff)
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
		if free == all {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%d of %d lanes still held", all-free, all)
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
	write := e.ring()
	h := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, time.Minute }, "q")
	// A first claim gives every lane its progress (lanes without one are
	// ready to be given one).
	write(1)
	ack(h.claim(t, e.ctx, 100))
	e.lanesFree()
	write(8) // two rows in each unkeyed lane
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

// A claim whose batch fills before it reads every lane it took leaves
// the next claim to start from the first lane it did not read, which
// then comes first: a lane held unread is never passed over.
func TestRingLaneTakenButNotReadComesNext(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.ring()(8)
	h := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, time.Minute }, "q")
	var lanes [][]int64
	for i := range 3 {
		ds := h.claim(t, e.ctx, 2)
		lanes = append(lanes, lanesOf(ds))
		ack(ds)
		if i < 2 {
			e.lanesFree()
		}
	}
	// The first claim took lanes 0 and 1 and read lane 0; the next ones
	// take a lane each, from lane 1.
	if diff := cmp.Diff([][]int64{{0}, {1}, {2}}, lanes); diff != "" {
		t.Errorf("lanes of each claim's rows (-want +got):\n%s", diff)
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
// handed on, or the table's last claim found rows.
func TestRingTableClaimsThatFindNothingTakeATenthOfTheTime(t *testing.T) {
	t.Parallel()
	e := setup(t)
	publish := e.ring()
	h := e.harness(func(env *Env) {
		env.Ring, env.LockWindow = true, time.Minute
		env.MinFetchInterval = time.Hour // the pace's cap, out of the way
	}, "q")
	br := h.Claimer.(*byRing)
	// Every lane read once, so that each has its progress and the next
	// claim takes the lane of the next row: claims until one finds no
	// lane to read.
	e.lanes("q")
	for publish(8); ; {
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
		publish(1)
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
		publish(1)
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
	publish(1)
	ds := h.claim(t, e.ctx, 100)
	if len(ds) != 2 || paced.calls() != calls+1 {
		t.Fatalf("handed %d rows in %d claims of the table; want the ring's row and the table's, in one", len(ds), paced.calls()-calls)
	}
	ack(ds)
	h.Ended()
	step("after a claim of the table that found rows", func() {})
}

// A row of the outbox table does not wait for the ring's backlog: after
// a claim of the ring that filled its batch, the next claims the table
// first.
func TestRingTableRowsDoNotWaitForTheRingsBacklog(t *testing.T) {
	t.Parallel()
	e := setup(t)
	publish := e.ring()
	backlog := publish(40)
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
// clients' transactions make it read some rows the last batch consumed;
// the claims of the last rows are tried up to three times.)
func TestRingReadStepsOverWhatAHeldTransactionKeepsBehindIt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	publish := e.ring()
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
		drain(publish(200)) // a lane's batch, 50 rows a lane, in each of four claims
	}
	var last map[string][]int
	for range 3 {
		mu.Lock()
		clear(dropped)
		mu.Unlock()
		drain(publish(8))
		mu.Lock()
		last = maps.Clone(dropped)
		mu.Unlock()
		if len(last["RingRead"]) > 0 && slices.Max(last["RingRead"]) <= 8 && slices.Max(last["RingReadyLanes"]) <= 8 {
			return
		}
	}
	t.Errorf("rows that earlier batches consumed, scanned and dropped by each statement of the claims of 8 new rows: %v; want at most 8",
		last)
}

// A turn empties a partition only if every lane has read it all once no
// writer holds it: a writer still open when the turn found the partition
// read past, which commits before the turn locks it, keeps it, and its
// row is delivered.
func TestRingTurnKeepsARowCommittedAfterItsPartitionWasFoundReadPast(t *testing.T) {
	t.Parallel()
	e := setup(t)
	publish := e.ring()
	h := e.harness(func(env *Env) { env.Ring, env.LockWindow = true, time.Minute }, "q")
	drain := func(want int) {
		t.Helper()
		h.drainTo(t, e.ctx, 100, want)
	}
	drain(len(publish(8)))
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

// Rows of a queue that no claimer has claimed yet (it has no lanes) keep
// their partition: the turn gives the queue its lanes instead of emptying
// it, and the queue's first claimer reads them.
func TestRingTurnKeepsTheRowsOfAQueueWithoutLanes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.ring()
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
