package outbox

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/ring"
)

// The ring (package ring) under the privilege model: a migrator owns it,
// and the publisher and subscriber roles have only what Grants and
// ring.Grants give them.

// setupRingRoles is setupOwned with the ring beside the outbox table:
// e.pubPool is the publisher role's, e.ob the subscriber role's, e.owner
// the migrator's.
func setupRingRoles(t *testing.T) *env {
	t.Helper()
	return setupWith(t, TableDefault, true)
}

// A publisher role with only its grants writes into the ring with plain
// SQL, keyed and unkeyed rows and rows due later, at READ COMMITTED and
// REPEATABLE READ, while the subscribers sleep (its rows wake them: the
// wake trigger's WHEN reads the sleep horizon as the publisher) and while
// they work; subscriber roles with only their grants handle every row
// once, each key's in order, on both claim paths, and empty the ring's
// partitions by turning it.
func TestRingRolesWithOnlyTheirGrantsWriteDrainAndTurnTheRing(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		e := setupRingRoles(t)
		var (
			mu   sync.Mutex
			seen = map[string]int{}
			keys = map[string][]string{}
		)
		h := func(_ context.Context, m *Message[[]byte]) error {
			mu.Lock()
			defer mu.Unlock()
			seen[string(m.Payload)]++
			if m.OrderingKey != "" {
				keys[m.OrderingKey] = append(keys[m.OrderingKey], string(m.Payload))
			}
			return nil
		}
		// Subscribers that poll 30 s apart: only the writers' wake-ups
		// deliver within the test's bound.
		cfg := onPath(p, fastConfig[[]byte](nil))
		cfg.MinFetchInterval, cfg.MaxFetchInterval = 30*time.Second, 30*time.Second
		startSub(t, e.ob, []string{"q"}, h, cfg)
		startSub(t, e.ob, []string{"q"}, h, cfg)

		var want []string
		wantKeys := map[string][]string{}
		write := func(tag string, iso pgx.TxIsoLevel) {
			t.Helper()
			err := pgx.BeginTxFunc(e.ctx, e.pubPool, pgx.TxOptions{IsoLevel: iso}, func(tx pgx.Tx) error {
				for i := range 3 {
					un, k1, k2 := fmt.Sprintf("%s u%d", tag, i), fmt.Sprintf("%s a%d", tag, i), fmt.Sprintf("%s b%d", tag, i)
					if _, err := tx.Exec(e.ctx, `INSERT INTO outbox_ring (queue, payload, ordering_key) VALUES
						('q', convert_to($1, 'UTF8'), NULL), ('q', convert_to($2, 'UTF8'), 'a'), ('q', convert_to($3, 'UTF8'), 'b')`,
						un, k1, k2); err != nil {
						return err
					}
					want = append(want, un, k1, k2)
					wantKeys["a"], wantKeys["b"] = append(wantKeys["a"], k1), append(wantKeys["b"], k2)
				}
				later := tag + " later"
				if _, err := tx.Exec(e.ctx, `INSERT INTO outbox_ring (queue, payload, next_attempt_at)
					VALUES ('q', convert_to($1, 'UTF8'), now() + interval '300 milliseconds')`, later); err != nil {
					return err
				}
				want = append(want, later)
				return nil
			})
			if err != nil {
				t.Fatalf("%s: write into the ring as the publisher at %s: %v", tag, iso, err)
			}
		}
		handledAll := func(what string) {
			t.Helper()
			// Within 20 s: the subscribers' polls are 30 s apart.
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				mu.Lock()
				n := len(seen)
				mu.Unlock()
				if n == len(want) {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: %d of %d rows handled within 20 s", what, n, len(want))
				}
			}
		}
		for round, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead} {
			e.waitSleeping(2)
			write(fmt.Sprintf("asleep %d", round), iso)
			handledAll(fmt.Sprintf("the rows written at %s while the subscribers slept", iso))
			write(fmt.Sprintf("busy %d", round), iso)
			write(fmt.Sprintf("busy again %d", round), iso)
			handledAll(fmt.Sprintf("the rows written at %s while they worked", iso))
		}
		mu.Lock()
		got := make([]string, 0, len(seen))
		for s, n := range seen {
			got = append(got, s)
			if n != 1 {
				t.Errorf("%q handled %d times; want once", s, n)
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("handled (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(wantKeys, keys); diff != "" {
			t.Errorf("each key's rows in the order written (-want +got):\n%s", diff)
		}
		mu.Unlock()

		// Turns as the subscriber role move the writers on and empty
		// every partition the lanes have read past. The subscribers turn
		// the ring too, so the partitions may be empty before the test
		// turns it; either way only a turn as the subscriber role emptied
		// them: a row leaves the ring by outbox_ring_truncate alone, the
		// subscriber role may not DELETE (TestRingRefusesWhatItsGrantsDoNotGive).
		eventually(t, "the ring emptied by turns as the subscriber role", func() bool {
			if _, err := ring.Turn(e.ctx, e.ob.pool, e.ob.queries, 5*time.Second, 0); err != nil {
				t.Fatalf("a turn as the subscriber role: %v", err)
			}
			var n int
			if err := e.db.Pool.QueryRow(e.ctx, `SELECT count(*) FROM outbox_ring`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == 0
		})
	})
}

// waitSleeping waits until n subscribers of e sleep (their sleep records
// hold).
func (e *env) waitSleeping(n int) {
	e.t.Helper()
	eventually(e.t, fmt.Sprintf("%d subscribers asleep", n), func() bool { h, _ := e.sleeping(); return h == n })
}

// What the ring's grants do not give is refused, asked of PostgreSQL as
// each role: a role with no grant can neither write into the ring nor
// call its functions; the publisher cannot place a row (its id, txid or
// slot), read payloads, change or remove rows, hold a lane, record
// progress, turn or empty the ring; the subscriber cannot write into the
// ring, change or remove its rows, or empty a partition but through the
// function that checks every lane read past it; and the ring's trigger
// functions (insert, wake, update) run only as its triggers, even for
// the owner.
func TestRingRefusesWhatItsGrantsDoNotGive(t *testing.T) {
	t.Parallel()
	e := setupRingRoles(t)
	_, outsider := e.loginRole("outsider")
	const (
		insert     = `INSERT INTO outbox_ring (queue, payload) VALUES ('q', 'x')`
		placeID    = `INSERT INTO outbox_ring (id, queue, payload) VALUES (1 << 50, 'q', 'x')`
		placeTxid  = `INSERT INTO outbox_ring (queue, payload, txid) VALUES ('q', 'x', '1')`
		placeSlot  = `INSERT INTO outbox_ring (queue, payload, slot) VALUES ('q', 'x', 3)`
		read       = `SELECT payload FROM outbox_ring`
		update     = `UPDATE outbox_ring SET next_attempt_at = now()`
		remove     = `DELETE FROM outbox_ring`
		truncate   = `TRUNCATE outbox_ring_p1`
		lock       = `LOCK TABLE outbox_ring_p1 IN ACCESS EXCLUSIVE MODE`
		empty      = `SELECT outbox_ring_truncate(1::smallint)`
		readPast   = `SELECT outbox_ring_read_past(1::smallint)`
		since      = `SELECT outbox_ring_since('1:1:', '1:1:')`
		slotNow    = `SELECT outbox_ring_slot_now()`
		turn       = `SELECT nextval('outbox_ring_slot')`
		holdLane   = `SELECT * FROM outbox_ring_lanes FOR UPDATE`
		addLane    = `INSERT INTO outbox_ring_lanes (queue, lane) VALUES ('q', 0)`
		progress   = `INSERT INTO outbox_ring_progress (queue, lane, snap) VALUES ('q', 0, pg_current_snapshot())`
		forget     = `DELETE FROM outbox_ring_progress`
		ack        = `INSERT INTO outbox_ring_acks (xid, ids) VALUES ('1', '{1}')`
		reopen     = `UPDATE outbox_ring_turns SET done_below = NULL`
		horizon    = `SELECT pg_sequence_last_value('outbox_sleep_horizon')`
		dropRing   = `DROP TABLE outbox_ring`
		attachKey  = `CREATE TRIGGER k BEFORE INSERT ON pg_temp.look FOR EACH ROW EXECUTE FUNCTION outbox_ring_key_insert()`
		attachWake = `CREATE TRIGGER w AFTER INSERT ON pg_temp.look FOR EACH ROW EXECUTE FUNCTION outbox_ring_wake()`
		attachMove = `CREATE TRIGGER u BEFORE UPDATE ON pg_temp.look FOR EACH ROW EXECUTE FUNCTION outbox_ring_row_update()`
	)
	// try runs each statement as c's role, in a savepoint of one
	// transaction that is rolled back, beside a TEMP table of its own to
	// attach triggers to; and says how each ended.
	try := func(c *pgx.Conn, statements ...string) map[string]string {
		t.Helper()
		tx, err := c.Begin(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		if _, err := tx.Exec(e.ctx, "SET LOCAL search_path TO "+pgx.Identifier{e.db.Schema}.Sanitize()+
			"; CREATE TEMP TABLE look (id bigint, queue text, ordering_key text, next_attempt_at timestamptz) ON COMMIT DROP"); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, s := range statements {
			got[s] = step(e.ctx, tx, s)
		}
		return got
	}
	conn := func(pool *pgxpool.Pool) *pgx.Conn {
		t.Helper()
		c, err := pool.Acquire(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Release)
		return c.Conn()
	}
	all := []string{insert, placeID, placeTxid, placeSlot, read, update, remove, truncate, lock, empty, readPast, since,
		slotNow, turn, holdLane, addLane, progress, forget, ack, reopen, horizon, dropRing, attachKey, attachWake, attachMove}
	want := func(ran ...string) map[string]string {
		m := map[string]string{}
		for _, s := range all {
			m[s] = "refused"
		}
		for _, s := range ran {
			m[s] = "ran"
		}
		return m
	}
	if diff := cmp.Diff(want(), try(outsider, all...)); diff != "" {
		t.Errorf("a role with no grant (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want(insert, slotNow, horizon), try(conn(e.pubPool), all...)); diff != "" {
		t.Errorf("the publisher role (-want +got):\n%s", diff)
	}
	// The subscriber's turn (nextval) is not tried: a sequence's step is
	// not rolled back, and a turn is its to take.
	sub := slices.DeleteFunc(slices.Clone(all), func(s string) bool { return s == turn })
	wantSub := want(read, empty, readPast, since, slotNow, holdLane, addLane, progress, forget, ack, reopen)
	delete(wantSub, turn)
	if diff := cmp.Diff(wantSub, try(conn(e.ob.pool), sub...)); diff != "" {
		t.Errorf("the subscriber role (-want +got):\n%s", diff)
	}
	// The owner may attach the trigger functions, which refuse to run as
	// anything but the ring's triggers.
	fire := `INSERT INTO pg_temp.look VALUES (1, 'q', 'k', now())`
	if diff := cmp.Diff(map[string]string{attachKey: "ran", fire: "refused"}, try(conn(e.owner.pool), attachKey, fire)); diff != "" {
		t.Errorf("the owner's key trigger function on another table (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]string{attachWake: "ran", fire: "refused"}, try(conn(e.owner.pool), attachWake, fire)); diff != "" {
		t.Errorf("the owner's wake trigger function on another table (-want +got):\n%s", diff)
	}
	move := `UPDATE pg_temp.look SET next_attempt_at = now()`
	if diff := cmp.Diff(map[string]string{attachMove: "ran", fire: "ran", move: "refused"}, try(conn(e.owner.pool), attachMove, fire, move)); diff != "" {
		t.Errorf("the owner's update trigger function on another table (-want +got):\n%s", diff)
	}
}
