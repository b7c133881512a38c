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
	released := false
	done := make(chan struct{})
	defer func() { <-done }()
	go func() {
		// Once the test waits for a slot, give one back.
		defer close(done)
		defer func() {
			if !released {
				_, _ = blocker.Exec(ctx, "SELECT pg_advisory_unlock_all()")
			}
		}()
		deadline := time.Now().Add(30 * time.Second)
		check, err := pgx.Connect(ctx, URL(t))
		if err != nil {
			t.Error(err)
			return
		}
		defer check.Close(ctx)
		for time.Now().Before(deadline) {
			if _, waiting := slotLocks(t, check, app); len(waiting) == 1 {
				select {
				case <-admitted:
					t.Errorf("admitted while waiting for slot %d", waiting[0])
				default:
				}
				if _, err := blocker.Exec(ctx, "SELECT pg_advisory_unlock($1, $2)", slotLockClass, waiting[0]); err != nil {
					t.Error(err)
				}
				released = true
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Error("New never waited for a slot")
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
	if len(slot) != 1 {
		t.Fatalf("the test held slots %v, want one", slot)
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
				// Once the second waits, let the first end.
				defer close(firstEnds)
				for time.Now().Before(deadline) {
					if held, waiting := locks(); held == 1 && waiting == 1 {
						return
					}
					time.Sleep(10 * time.Millisecond)
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
