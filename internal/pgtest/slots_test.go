package pgtest

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
)

// slotLocks returns the slots the connection named app holds (granted)
// and waits for (not granted).
func slotLocks(t *testing.T, conn *pgx.Conn, app string) (held, waiting []int) {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT l.objid::int, l.granted
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.classid = $1 AND l.objsubid = 2 AND a.application_name = $2
		ORDER BY 1`, slotLockClass, app)
	if err != nil {
		t.Fatal(err)
	}
	type lock struct {
		Slot    int
		Granted bool
	}
	locks, err := pgx.CollectRows(rows, pgx.RowToStructByPos[lock])
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range locks {
		if l.Granted {
			held = append(held, l.Slot)
		} else {
			waiting = append(waiting, l.Slot)
		}
	}
	return held, waiting
}

// heldBy returns the slots the test named name holds, as this process
// counts them, and fails t unless the process's session holds them.
func heldBy(t *testing.T, conn *pgx.Conn, name string) []int {
	t.Helper()
	slots.mu.Lock()
	h := slots.held[name]
	slots.mu.Unlock()
	if h == nil {
		return nil
	}
	h.mu.Lock()
	taken := append([]int(nil), h.taken...)
	h.mu.Unlock()
	session, _ := slotLocks(t, conn, slotAppName())
	for _, s := range taken {
		if !slices.Contains(session, s) {
			t.Errorf("%s holds slot %d, which the process's session (holding %v) does not", name, s, session)
		}
	}
	slices.Sort(taken)
	return taken
}

// triesAgain waits until a session named app has run at least two more
// statements (it tries a lock again and again while it waits), and fails
// t after 30 s.
func triesAgain(t *testing.T, conn *pgx.Conn, app string) {
	t.Helper()
	var seen []time.Time
	deadline := time.Now().Add(30 * time.Second)
	for len(seen) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("no session named %q tried its lock again within 30s", app)
		}
		var at *time.Time
		if err := conn.QueryRow(context.Background(), `SELECT max(query_start) FROM pg_stat_activity
			WHERE application_name = $1 AND query LIKE '%pg_try_advisory_lock%'`, app).Scan(&at); err != nil {
			t.Fatal(err)
		}
		if at != nil && (len(seen) == 0 || at.After(seen[len(seen)-1])) {
			seen = append(seen, *at)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// holdEverySlot takes the count slots of the database on a session of
// its own, closed when t ends, and returns it.
func holdEverySlot(t *testing.T, count int) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	blocker, err := pgx.Connect(ctx, URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = blocker.Close(ctx) })
	for s := range count {
		if _, err := blocker.Exec(ctx, "SELECT pg_advisory_lock($1, $2)", slotLockClass, s); err != nil {
			t.Fatal(err)
		}
	}
	return blocker
}

// When every slot is taken, New waits until one is given back, on the
// one session that holds the process's slots; the test's subtests share
// its slot, and it is given back when the test ends. (Not parallel: it takes every slot of the database for a moment,
// and other tests of this process would wait behind it.)
func TestNewWaitsForAFreeSlot(t *testing.T) {
	ctx := context.Background()
	count, err := slotCount(ctx, URL(t))
	if err != nil {
		t.Fatal(err)
	}
	blocker := holdEverySlot(t, count)
	app := slotAppName()
	admitted := make(chan struct{})
	done := make(chan struct{})
	defer func() { <-done }()
	go func() {
		// Once the test has tried the slots and tries them again, give
		// one back.
		defer close(done)
		check, err := pgx.Connect(ctx, URL(t))
		if err != nil {
			t.Error(err)
			_, _ = blocker.Exec(ctx, "SELECT pg_advisory_unlock_all()")
			return
		}
		defer check.Close(ctx)
		triesAgain(t, check, app)
		var sessions int
		if err := check.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&sessions); err != nil {
			t.Error(err)
		} else if sessions != 1 {
			t.Errorf("%d sessions hold and wait for the process's slots, want 1", sessions)
		}
		select {
		case <-admitted:
			t.Error("admitted while every slot was held")
		default:
		}
		if _, err := blocker.Exec(ctx, "SELECT pg_advisory_unlock($1, 0)", slotLockClass); err != nil {
			t.Error(err)
		}
	}()

	check, err := pgx.Connect(ctx, URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close(ctx)
	var slot []int
	t.Run("first", func(t *testing.T) {
		New(t)
		close(admitted)
		slot = heldBy(t, check, t.Name())
		t.Run("nested", func(t *testing.T) {
			New(t)
			if held := heldBy(t, check, t.Name()); held != nil {
				t.Errorf("a subtest's New: it holds %v of its own; want it to share its test's", held)
			}
			if held, waiting := slotLocks(t, check, app); !cmp.Equal(held, slot) || len(waiting) != 0 {
				t.Errorf("a subtest's New: the process holds %v, waits for %v; want %v held as before", held, waiting, slot)
			}
		})
	})
	if diff := cmp.Diff([]int{0}, slot); diff != "" {
		t.Fatalf("the slots the test held (-want +got):\n%s", diff)
	}
	// The slot is given back when the subtests end.
	if held, waiting := slotLocks(t, check, app); len(held)+len(waiting) != 0 {
		t.Errorf("after the subtests ended, the process holds %v and waits for %v", held, waiting)
	}
}

// Reserve holds the lowest slots, as many as asked, and no more than
// there are.
func TestReserveHoldsTheLowestSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	count, err := slotCount(ctx, URL(t))
	if err != nil {
		t.Fatal(err)
	}
	check, err := pgx.Connect(ctx, URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close(ctx)
	for _, n := range []int{2, count + 5} {
		t.Run("", func(t *testing.T) {
			New(t)
			Reserve(t, n)
			want := make([]int, min(n, count))
			for i := range want {
				want[i] = i
			}
			held := heldBy(t, check, t.Name())
			if diff := cmp.Diff(want, held); diff != "" {
				t.Errorf("Reserve(%d) of %d slots: held (-want +got):\n%s", n, count, diff)
			}
		})
	}
}

// Of two tests that call Exclusive with one name, the second waits until
// the first has ended.
func TestExclusiveTestsRunOneAtATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := "exclusive " + randomHex(t, 4)
	check, err := pgx.Connect(ctx, URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close(ctx)
	// locks returns how many sessions hold name and how many wait for it.
	locks := func() (held, waiting int) {
		if err := check.QueryRow(ctx, `SELECT count(*) FILTER (WHERE l.granted), count(*) FILTER (WHERE NOT l.granted)
			FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND l.classid = $1 AND a.application_name = $2`,
			exclusiveLockClass, "pgtest exclusive "+name).Scan(&held, &waiting); err != nil {
			t.Fatal(err)
		}
		return held, waiting
	}
	check2, err := pgx.Connect(ctx, URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer check2.Close(ctx)
	firstEnds := make(chan struct{})
	var secondIn, firstOut time.Time
	t.Run("group", func(t *testing.T) {
		t.Run("first", func(t *testing.T) {
			t.Parallel()
			Exclusive(t, name)
			<-firstEnds
			firstOut = time.Now()
		})
		t.Run("second", func(t *testing.T) {
			t.Parallel()
			deadline := time.Now().Add(30 * time.Second)
			for held, _ := locks(); held == 0; held, _ = locks() {
				if time.Now().After(deadline) {
					t.Fatal("the first test never held the lock")
				}
				time.Sleep(10 * time.Millisecond)
			}
			go func() {
				// Once the second tries again, let the first end.
				defer close(firstEnds)
				triesAgain(t, check2, "pgtest exclusive "+name)
				if held, _ := locks(); held != 1 {
					t.Errorf("%d sessions hold the lock while the second waits, want 1", held)
				}
			}()
			Exclusive(t, name)
			secondIn = time.Now()
		})
	})
	if secondIn.IsZero() || !secondIn.After(firstOut) {
		t.Errorf("the second test ran alone from %v, the first ended at %v", secondIn, firstOut)
	}
}

// Parallel subtests of a test that holds no slot, each with a schema of
// its own, each take a slot of their own: together they count as the
// tests they are.
func TestSubtestsOfATestWithoutASlotTakeOneEach(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	check, err := pgx.Connect(ctx, URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close(ctx)
	var mu sync.Mutex // check is used by one subtest at a time
	t.Run("group", func(t *testing.T) {
		group := t.Name()
		for _, name := range []string{"a", "b"} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				New(t)
				mu.Lock()
				defer mu.Unlock()
				own := heldBy(t, check, t.Name())
				groups := heldBy(t, check, group)
				if len(own) != 1 || len(groups) != 0 {
					t.Errorf("subtest %s holds %v, the group %v; want one slot of its own", name, own, groups)
				}
			})
		}
	})
}

// While a test waits in Reserve for the low slots, tests that take one
// slot leave those to it and take the others: a low slot given back goes
// to the test that reserved it. (Not parallel: it takes every slot of the
// database for a moment, as TestNewWaitsForAFreeSlot.)
func TestReserveIsNotOvertakenByTestsThatTakeOneSlot(t *testing.T) {
	ctx := context.Background()
	count, err := slotCount(ctx, URL(t))
	if err != nil {
		t.Fatal(err)
	}
	if count < 3 {
		t.Skipf("%d slots: the test needs 3", count)
	}
	blocker := holdEverySlot(t, count)
	check, err := pgx.Connect(ctx, URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close(ctx)
	unlock := func(s int) {
		t.Helper()
		if _, err := blocker.Exec(ctx, "SELECT pg_advisory_unlock($1, $2)", slotLockClass, s); err != nil {
			t.Fatal(err)
		}
	}

	var reserved, single []int
	reserverWaits := make(chan struct{})
	t.Run("group", func(t *testing.T) {
		t.Run("reserver", func(t *testing.T) {
			t.Parallel()
			go func() {
				defer close(reserverWaits)
				// The reservation is said once Reserve waits for slot 0.
				for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
					var n int
					if err := check.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
						AND classid = $1::oid AND objid = 2 AND granted`, int64(reserveLockClass)).Scan(&n); err != nil {
						t.Error(err)
						return
					}
					if n == 1 {
						return
					}
					if time.Now().After(deadline) {
						t.Error("Reserve(2) never said it waits for slots 0 and 1")
						return
					}
				}
			}()
			Reserve(t, 2)
			reserved = heldBy(t, check, t.Name())
		})
		t.Run("single", func(t *testing.T) {
			t.Parallel()
			<-reserverWaits
			// Slot 1, which the reserver waits for, and the last slot are
			// given back: the test that takes one slot takes the last.
			unlock(1)
			unlock(count - 1)
			New(t)
			single = heldBy(t, check, t.Name())
			// Then slot 0: the reserver takes slots 0 and 1.
			unlock(0)
		})
	})
	if diff := cmp.Diff([]int{count - 1}, single); diff != "" {
		t.Errorf("the slot a test that takes one took while Reserve(2) waited (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{0, 1}, reserved); diff != "" {
		t.Errorf("the slots Reserve(2) took (-want +got):\n%s", diff)
	}
	var left int
	if err := check.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND classid = $1::oid AND granted`, int64(reserveLockClass)).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d reservations said after Reserve took its slots; want none", left)
	}
}
