package pgtest

import (
	"context"
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

// When every slot is taken, New waits until one is given back; the
// test's subtests share its slot, and it is given back when the test
// ends. (Not parallel: it takes every slot of the database for a moment,
// and other tests of this process would wait behind it.)
func TestNewWaitsForAFreeSlot(t *testing.T) {
	ctx := context.Background()
	count, err := slotCount(ctx, URL(t))
	if err != nil {
		t.Fatal(err)
	}
	blocker, err := pgx.Connect(ctx, URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close(ctx)
	for s := range count {
		if _, err := blocker.Exec(ctx, "SELECT pg_advisory_lock($1, $2)", slotLockClass, s); err != nil {
			t.Fatal(err)
		}
	}
	app := slotAppName(t.Name())
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
		slot, _ = slotLocks(t, check, app)
		t.Run("nested", func(t *testing.T) {
			New(t)
			if held, waiting := slotLocks(t, check, app); !cmp.Equal(held, slot) || len(waiting) != 0 {
				t.Errorf("a subtest's New: holds %v, waits for %v; want %v held as before", held, waiting, slot)
			}
		})
	})
	if diff := cmp.Diff([]int{0}, slot); diff != "" {
		t.Fatalf("the slots the test held (-want +got):\n%s", diff)
	}
	if held, waiting := slotLocks(t, check, app); len(held)+len(waiting) != 0 {
		t.Errorf("after the subtests ended, the test still holds %v and waits for %v", held, waiting)
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
			held, _ := slotLocks(t, check, slotAppName("TestReserveHoldsTheLowestSlots"))
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
