package pgtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvSlots, when set to a positive number, is how many tests may hold a
// schema of the test database at once, across every test process of a
// run; unset, it follows from the server's max_connections (see
// [connectionsPerTest]).
const EnvSlots = "TEST_DATABASE_SLOTS"

// connectionsPerTest is how many connections a test running on the test
// database is counted to use: its pools, its subscribers' listeners,
// and its fixtures' connections (the settings test's roles use 12). A
// test that uses many more says so with [Reserve].
const connectionsPerTest = 12

// spareConnections are the server's connections left to what is not a
// test: each test process's session that holds its slots, psql
// sessions, tests of packages that do not take slots.
const spareConnections = 10

// slotLockClass is the first key of the advisory locks that are the slots
// ("otst"): the two-key form, which no code under test uses.
const slotLockClass = 0x6f747374

// The slots are advisory locks on the test database. make test runs many
// test processes at once (packages, modules, and a second copy a
// developer starts beside the first), and each runs several tests at
// once: without a limit they open more connections than the server
// allows, and tests fail with "too many clients" when nothing is wrong.
// A test takes a slot before it creates its schema and gives it back when
// it ends. Its subtests share its slot; a test that holds none (a group
// of parallel subtests, each with a schema of its own) has each subtest
// take one.
//
// One session of the process holds its slots and tries the ones its tests
// wait for, so that waiting costs no connection per test.
var slots struct {
	once  sync.Once
	count int
	err   error

	mu   sync.Mutex
	held map[string]*slotHold // by the name of the test that holds them

	sessMu sync.Mutex   // held while the session runs a statement
	sess   *pgx.Conn    // the session that holds the process's slots
	mine   map[int]bool // the slots sess holds
}

// slotHold is a test's slots, and how many of its tests (and subtests)
// still use them.
type slotHold struct {
	users int // guarded by slots.mu

	mu    sync.Mutex // held while slots are taken
	taken []int
}

// slotCount returns how many slots the test database has.
func slotCount(ctx context.Context, base string) (int, error) {
	slots.once.Do(func() {
		if v := os.Getenv(EnvSlots); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				slots.err = fmt.Errorf("%s=%q: want a positive number", EnvSlots, v)
			}
			slots.count = n
			return
		}
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			slots.err = err
			return
		}
		defer conn.Close(ctx)
		// reserved_connections (PostgreSQL 16) is read as 0 before it.
		var most, reserved int
		slots.err = conn.QueryRow(ctx, `SELECT current_setting('max_connections')::int,
			current_setting('superuser_reserved_connections')::int
			+ coalesce(current_setting('reserved_connections', true)::int, 0)`).Scan(&most, &reserved)
		slots.count = max((most-reserved-spareConnections)/connectionsPerTest, 2)
	})
	return slots.count, slots.err
}

// admit has tb's test, or the test above it that holds slots, hold n
// slots (at most all of them) until it and its subtests end, waiting
// until they are free.
func admit(tb testing.TB, base string, n int) {
	tb.Helper()
	ctx := context.Background()
	count, err := slotCount(ctx, base)
	if err != nil {
		tb.Fatalf("pgtest: how many tests the database serves at once: %v", err)
	}
	slots.mu.Lock()
	if slots.held == nil {
		slots.held = map[string]*slotHold{}
	}
	top := holder(tb.Name())
	h := slots.held[top]
	if h == nil {
		h = &slotHold{}
		slots.held[top] = h
	}
	h.users++
	slots.mu.Unlock()
	tb.Cleanup(func() { release(top, h) })

	h.mu.Lock()
	defer h.mu.Unlock()
	want := min(n, count)
	if len(h.taken) >= want {
		return
	}
	if want == 1 {
		// Any free slot, tried in turn from one picked at random, but
		// those a test waiting in Reserve waits for.
		start := rand.IntN(count)
		err := waitUntil(func() (bool, error) {
			reserved, err := reservedBelow(base)
			if err != nil {
				return false, err
			}
			for i := range count {
				s := (start + i) % count
				if s < reserved {
					continue
				}
				ok, err := takeSlot(base, s)
				if err != nil {
					return false, err
				}
				if ok {
					h.taken = append(h.taken, s)
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			tb.Fatalf("pgtest: take a slot: %v", err)
		}
		return
	}
	// Several: let go of what is held, then take slots 0 to want-1 in
	// order. A test waiting for a slot then holds none but lower ones,
	// so no two tests each hold a slot the other waits for. While it
	// waits, it says so (reserveLockClass), and tests that take one slot
	// leave slots 0 to want-1 to it: without that, each of those slots
	// given back went to whichever waiting test tried it first, and a
	// test that reserved three waited minutes behind dozens that each
	// needed one.
	if err := giveBack(h.taken); err != nil {
		tb.Fatalf("pgtest: give back slots: %v", err)
	}
	h.taken = nil
	if err := reserving(base, want, true); err != nil {
		tb.Fatalf("pgtest: say that slots 0 to %d are waited for: %v", want-1, err)
	}
	for s := range want {
		if err := waitUntil(func() (bool, error) { return takeSlot(base, s) }); err != nil {
			tb.Fatalf("pgtest: wait for slot %d: %v", s, err)
		}
		h.taken = append(h.taken, s)
	}
	if err := reserving(base, want, false); err != nil {
		tb.Fatalf("pgtest: say that slots 0 to %d are no longer waited for: %v", want-1, err)
	}
}

// reserveLockClass is the first key of the advisory locks ("otsr") that
// say a test waits for the slots below the second key: every such test
// holds one, shared, on its process's session while it waits.
const reserveLockClass = 0x6f747372

// reserving says (on) or stops saying that a test of this process waits
// for slots 0 to want-1.
func reserving(base string, want int, on bool) error {
	stmt := "SELECT pg_advisory_unlock_shared($1, $2)::text"
	if on {
		stmt = "SELECT pg_advisory_lock_shared($1, $2)::text"
	}
	return onSession(base, func(conn *pgx.Conn) error {
		var ignored string
		return conn.QueryRow(context.Background(), stmt, reserveLockClass, int32(want)).Scan(&ignored)
	})
}

// reservedBelow returns the number of low slots that tests waiting in
// Reserve, of any process, wait for: 0 when none waits.
func reservedBelow(base string) (n int, err error) {
	err = onSession(base, func(conn *pgx.Conn) error {
		return conn.QueryRow(context.Background(), `SELECT coalesce(max(objid), 0)::int FROM pg_catalog.pg_locks
			WHERE locktype = 'advisory' AND classid = $1::oid AND objsubid = 2 AND granted
			AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())`,
			int64(reserveLockClass)).Scan(&n)
	})
	return n, err
}

// onSession runs fn on the session that holds the process's slots,
// opening it first unless it is open. A failure of fn closes the session
// (its locks end with it; the next call opens another).
func onSession(base string, fn func(conn *pgx.Conn) error) error {
	slots.sessMu.Lock()
	defer slots.sessMu.Unlock()
	if slots.sess == nil {
		conn, err := dial(base, slotAppName())
		if err != nil {
			return err
		}
		slots.sess, slots.mine = conn, map[int]bool{}
	}
	if err := fn(slots.sess); err != nil {
		dropSession()
		return err
	}
	return nil
}

// takeSlot takes slot s on the process's session, opening it first, and
// reports whether it was free.
func takeSlot(base string, s int) (ok bool, err error) {
	err = onSession(base, func(conn *pgx.Conn) error {
		if slots.mine[s] {
			// A session takes an advisory lock it holds again: the
			// process's own tests are told apart here.
			return nil
		}
		if ok, err = tryLock(conn, slotLockClass, int32(s)); ok {
			slots.mine[s] = true
		}
		return err
	})
	return ok, err
}

// giveBack lets go of slots held by the process's session.
func giveBack(taken []int) error {
	slots.sessMu.Lock()
	defer slots.sessMu.Unlock()
	for _, s := range taken {
		if !slots.mine[s] {
			continue // the session they were held by has ended
		}
		delete(slots.mine, s)
		if _, err := slots.sess.Exec(context.Background(), "SELECT pg_advisory_unlock($1, $2)", slotLockClass, int32(s)); err != nil {
			dropSession()
			return err
		}
	}
	return nil
}

// closeSlots ends the process's session, when its tests are over.
func closeSlots() {
	slots.sessMu.Lock()
	defer slots.sessMu.Unlock()
	dropSession()
}

// dropSession closes the process's session, which ends every lock it
// holds. Call it with slots.sessMu held.
func dropSession() {
	if slots.sess != nil {
		_ = slots.sess.Close(context.Background())
	}
	slots.sess, slots.mine = nil, nil
}

// waitLock takes the advisory lock (class, key) on conn, waiting until it
// is free. It tries it again and again rather than waiting in one
// statement: a session waiting in a statement keeps its snapshot, which
// holds back vacuum and is the oldest snapshot the tests that look for
// theirs see.
func waitLock(conn *pgx.Conn, class, key int32) error {
	return waitUntil(func() (bool, error) { return tryLock(conn, class, key) })
}

// waitUntil calls try until it reports success or fails, pausing between
// tries (see [lockPause]).
func waitUntil(try func() (bool, error)) error {
	for {
		if ok, err := try(); err != nil || ok {
			return err
		}
		lockPause()
	}
}

// tryLock takes the advisory lock (class, key) on conn if it is free.
func tryLock(conn *pgx.Conn, class, key int32) (bool, error) {
	var ok bool
	err := conn.QueryRow(context.Background(), "SELECT pg_try_advisory_lock($1, $2)", class, key).Scan(&ok)
	return ok, err
}

// lockPause is how long a test waiting for a lock waits before it tries
// again: 20 to 80 ms, so that waiters do not try in step.
func lockPause() {
	time.Sleep(time.Duration(20+rand.IntN(60)) * time.Millisecond)
}

// connectAs opens a connection of its own to base, named app
// (application_name), failing tb when it cannot.
func connectAs(tb testing.TB, base, app string) *pgx.Conn {
	tb.Helper()
	conn, err := dial(base, app)
	if err != nil {
		tb.Fatalf("pgtest: connect as %q: %v", app, err)
	}
	return conn
}

// dial opens a connection of its own to base, named app
// (application_name).
func dial(base, app string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(base)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", EnvURL, err)
	}
	cfg.RuntimeParams["application_name"] = app
	return pgx.ConnectConfig(context.Background(), cfg)
}

// holder returns the name of the test whose slots the test named name
// uses: the outermost test above it that holds slots, or itself. A
// subtest waiting for a slot thus never waits while a test above it
// holds one, which those above could wait for in turn. Call it with
// slots.mu held.
func holder(name string) string {
	for i, r := range name {
		if r == '/' {
			if _, ok := slots.held[name[:i]]; ok {
				return name[:i]
			}
		}
	}
	return name
}

// slotAppName is the application_name of the session that holds this
// process's slots.
func slotAppName() string {
	return fmt.Sprintf("pgtest slots %d", os.Getpid())
}

// release gives back top's slots when the last of its tests ends.
func release(top string, h *slotHold) {
	slots.mu.Lock()
	h.users--
	last := h.users == 0
	if last {
		delete(slots.held, top)
	}
	slots.mu.Unlock()
	if !last {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	// A slot not given back is given back when the process's session
	// ends: the error is the next test's to see.
	_ = giveBack(h.taken)
	h.taken = nil
}

// Reserve counts tb's test as n tests (n slots) for as long as it runs: a
// test that opens several times connectionsPerTest connections (processes
// of its own, pools of dozens) calls it before it opens them, so that the
// tests beside it wait instead of failing for want of connections.
func Reserve(tb testing.TB, n int) {
	tb.Helper()
	if Pooled(tb) {
		return
	}
	admit(tb, URL(tb), n)
}

// exclusiveLockClass is the first key of the advisory locks [Exclusive]
// takes ("otsx").
const exclusiveLockClass = 0x6f747378

// Exclusive has tb's test run alone among the tests, of any process on
// the test database, that call Exclusive with the same name: it waits
// until none of them runs, and holds name until tb ends. A test calls it
// when what it proves is a property of the whole server that such tests
// change, e.g. which session holds back vacuum the longest.
//
// Behind a pooler, whose sessions are not the clients', it does nothing.
func Exclusive(tb testing.TB, name string) {
	tb.Helper()
	if Pooled(tb) {
		return
	}
	ctx := context.Background()
	conn := connectAs(tb, URL(tb), "pgtest exclusive "+name)
	tb.Cleanup(func() { _ = conn.Close(context.Background()) })
	var key int32
	if err := conn.QueryRow(ctx, "SELECT hashtext($1)", name).Scan(&key); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	if err := waitLock(conn, exclusiveLockClass, key); err != nil {
		tb.Fatalf("pgtest: wait to run alone among the %s tests: %v", name, err)
	}
}
