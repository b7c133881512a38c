package outbox

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
)

// A claim statement reads the records of claims by lock as they stood
// when it began. When a claim by lock is recorded while such a statement
// runs, and its connection dies before the statement reaches its rows,
// the statement finds them unlocked: still, neither a claim by lease nor
// one by lock hands them to a handler before the record's hold ends,
// LeaseTTL after the claim by lock.
//
// The claim is paused mid-statement by a row-level security policy on
// the outbox, whose function waits on an advisory lock the test holds
// when it reads the first row of the claim's first queue (policies bind
// the subscriber's role, not the owner or a superuser: setupOwned). Meanwhile a subscriber with
// the public defaults claims the row of the second queue by lock, its
// claim is recorded, and its backend is terminated.
func TestARowWhoseClaimDiedWhileAnotherClaimRanWaitsForItsRecord(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		lockWindow time.Duration
	}{
		{"by lease", -1},
		{"by lock", 0}, // the defaults: a subscriber's first claim is by lock
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setupOwned(t)
			paused := e.publish("first")
			id := e.publish("second")
			other := e.outboxOn(nil)
			role := roleOf(t, other)
			unlock := e.pauseWhen("pause(id bigint)", fmt.Sprintf("id = %d", paused))
			e.exec(`ALTER TABLE outbox ENABLE ROW LEVEL SECURITY`)
			e.exec(`CREATE POLICY pause ON outbox USING (pause(id))`)

			// The claim by lock must still hold its rows when the test
			// has read its record and ends its backend: its window is
			// the longest allowed (LeaseTTL/2), so that a loaded
			// machine's slow polls do not outlast it.
			const ttl = 10 * time.Second
			var (
				mu     sync.Mutex
				starts []time.Time
			)
			handler := func(ctx context.Context, m *Message[string]) error {
				if m.ID != id {
					return nil
				}
				mu.Lock()
				starts = append(starts, time.Now())
				first := len(starts) == 1
				mu.Unlock()
				if !first {
					return nil
				}
				<-ctx.Done()
				if !errors.Is(context.Cause(ctx), ErrLeaseLost) {
					t.Errorf("first handler's context ended with %v, want ErrLeaseLost", context.Cause(ctx))
				}
				return context.Cause(ctx)
			}
			pausedCfg := fastConfig[string](nil)
			pausedCfg.LeaseTTL, pausedCfg.LockWindow = ttl, tc.lockWindow
			startSub(t, other, []string{"first", "second"}, handler, pausedCfg)
			eventually(t, "the claim paused at the first queue's row", func() bool { return e.paused(role, "Claim|Lock") })
			lockCfg := fastConfig[string](nil)
			lockCfg.LeaseTTL, lockCfg.LockWindow = ttl, ttl/2
			startSub(t, e.ob, []string{"second"}, handler, lockCfg)
			eventually(t, "the claim by lock's handler running", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(starts) == 1
			})
			hold := e.recordHold(id)
			eventually(t, "the claim by lock's backend ended", func() bool { return e.terminateLockedClaims() == 1 })
			unlock()
			eventually(t, "the row handled again", func() bool { _, ok := e.row(id); return !ok })
			mu.Lock()
			defer mu.Unlock()
			if starts[1].Before(hold.Add(-time.Millisecond)) {
				t.Errorf("the second delivery started %v before the record's hold ended (%v after the first began)",
					hold.Sub(starts[1]), hold.Sub(starts[0]))
			}
		})
	}
}

// A claim by lock whose transaction ends after RecordLock found it in
// progress, but before the record committed, hands no row to a handler:
// its rows' locks went before the record could hold them, so another
// claim may have taken them unseen. The record statement is paused
// between its check and its commit by a restrictive row-level security
// policy on the records' table, whose check waits on an advisory lock
// the test holds; meanwhile the claim's backend is terminated.
func TestAClaimWhoseTransactionEndedBeforeItsRecordCommittedHandsNoRow(t *testing.T) {
	t.Parallel()
	e := setupOwned(t)
	id := e.publish("q")
	ob := e.ob
	role := roleOf(t, ob)
	unlock := e.pauseWhen("pause()", "true")
	e.exec(`ALTER TABLE outbox_locks ENABLE ROW LEVEL SECURITY`)
	e.exec(`CREATE POLICY records ON outbox_locks USING (true)`)
	e.exec(`CREATE POLICY pause ON outbox_locks AS RESTRICTIVE FOR INSERT WITH CHECK (pause())`)

	const ttl = 3 * time.Second
	var (
		mu     sync.Mutex
		starts []time.Time
	)
	cfg := fastConfig[string](nil)
	cfg.LeaseTTL = ttl
	startSub(t, ob, []string{"q"}, func(ctx context.Context, m *Message[string]) error {
		if m.ID == id {
			mu.Lock()
			starts = append(starts, time.Now())
			mu.Unlock()
		}
		return nil
	}, cfg)
	eventually(t, "the claim's record paused before its commit", func() bool { return e.paused(role, "RecordLock") })
	var ended int
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE usename = $1 AND state = 'idle in transaction' AND backend_xid IS NOT NULL`, role).Scan(&ended); err != nil || ended != 1 {
		t.Fatalf("terminated %d claims (%v); want the one claim by lock", ended, err)
	}
	unlock()
	hold := e.recordHold(id)
	eventually(t, "the row handled", func() bool { _, ok := e.row(id); return !ok })
	mu.Lock()
	defer mu.Unlock()
	if starts[0].Before(hold.Add(-time.Millisecond)) {
		t.Errorf("the row's first delivery started %v before the hold of its claim's record ended", hold.Sub(starts[0]))
	}
}

// pauseWhen makes the function signature in e's schema, a boolean that
// is always true but, when cond holds, first waits on an advisory lock
// held, in a transaction of its own (which keeps it on one server
// connection through a pooler), until unlock (or the test's end): a
// row-level security policy that calls it pauses, mid-statement, a
// statement of a role the policy binds.
func (e *env) pauseWhen(signature, cond string) (unlock func()) {
	e.t.Helper()
	h := fnv.New64a()
	h.Write([]byte(e.db.Schema))
	key := int64(h.Sum64())
	tx, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := tx.Exec(e.ctx, "SELECT pg_advisory_xact_lock($1)", key); err != nil {
		e.t.Fatal(err)
	}
	var once sync.Once
	unlock = func() {
		once.Do(func() {
			if err := tx.Commit(context.WithoutCancel(e.ctx)); err != nil {
				e.t.Error(err)
			}
		})
	}
	e.t.Cleanup(unlock)
	e.exec(fmt.Sprintf(`CREATE FUNCTION %s RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
		BEGIN
		    IF %s THEN PERFORM pg_advisory_xact_lock_shared(%d); END IF;
		    RETURN true;
		END $$`, signature, cond, key))
	return unlock
}

// paused reports whether a statement of role, one of the generated
// queries that names matches, waits on pauseWhen's lock.
func (e *env) paused(role, names string) bool {
	var n int
	err := e.db.Pool.QueryRow(e.ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND usename = $1
		  AND query ~ ('-- name: (' || $2 || ') ')`, role, names).Scan(&n)
	return err == nil && n > 0
}

// recordHold waits for a record of a claim by lock naming row id, and
// returns when the latest such hold ends, on the server's clock (the
// test's: one host).
func (e *env) recordHold(id int64) time.Time {
	e.t.Helper()
	var hold *time.Time
	eventually(e.t, "a record naming the row", func() bool {
		err := e.db.Pool.QueryRow(e.ctx, `SELECT max(until) FROM outbox_locks WHERE ids @> $1::bigint`, id).Scan(&hold)
		return err == nil && hold != nil
	})
	return *hold
}

// roleOf is the role ob's pool connects as.
func roleOf(t *testing.T, ob *Outbox) string {
	t.Helper()
	var role string
	if err := ob.pool.QueryRow(t.Context(), "SELECT current_user").Scan(&role); err != nil {
		t.Fatal(err)
	}
	return role
}

// A recorded hand-over is completed at READ COMMITTED whatever the
// isolation the subscriber's sessions default to: the hand-over looks the
// key's rows up after it took the key's lock, and at REPEATABLE READ its
// snapshot, taken before that lock, would miss a row whose publisher
// committed in between, which would then stay blocked behind a
// hand-over already consumed. The hand-over is paused, after its
// snapshot and before the key's lock, by a row-level security policy on
// the hand-over records (forced on their owner, not a superuser, which
// runs the hand-over), while the publisher commits.
func TestHandOverOnARepeatableReadPoolSeesARowCommittedWhileItRan(t *testing.T) {
	t.Parallel()
	e := setupOwned(t)
	head := e.publishKeyed("q", "k")
	publisher := e.fixtureTx()
	next, err := e.ob.queries(publisher).Publish(e.ctx, db.PublishParams{Queue: "q", Payload: []byte(`{}`), OrderingKey: ptr("k")})
	if err != nil {
		t.Fatal(err)
	}
	unlock := e.pauseWhen("pause()", "true")
	e.exec(`ALTER TABLE outbox_handoff ENABLE ROW LEVEL SECURITY`)
	e.exec(`ALTER TABLE outbox_handoff FORCE ROW LEVEL SECURITY`)
	e.exec(`CREATE POLICY records ON outbox_handoff USING (true)`)
	e.exec(`CREATE POLICY pause ON outbox_handoff AS RESTRICTIVE FOR SELECT USING (pause())`)

	// As a DBA sets it, which reaches the server through a pooler too;
	// the role's sessions so far (a pooler's among them) end.
	role := e.obRole()
	e.exec(`ALTER ROLE ` + pgx.Identifier{role}.Sanitize() + ` SET default_transaction_isolation = 'repeatable read'`)
	e.exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, role)
	ob := e.outboxOn(nil)
	eventually(t, "the subscriber's sessions at REPEATABLE READ", func() bool {
		var isolation string
		err := ob.pool.QueryRow(e.ctx, "SHOW transaction_isolation").Scan(&isolation)
		return err == nil && isolation == "repeatable read"
	})
	startSub(t, ob, []string{"q"}, func(context.Context, *Message[string]) error { return nil }, fastConfig[string](nil))
	eventually(t, "the head handled, its hand-over recorded", func() bool {
		_, ok := e.row(head)
		return !ok && e.count("outbox_handoff") == 1
	})
	eventually(t, "the hand-over paused", func() bool { return e.paused(role, "HandOff") })
	if err := publisher.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	unlock()
	eventually(t, "the key's next row handled", func() bool { _, ok := e.row(next); return !ok })
}
