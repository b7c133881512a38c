package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
	"github.com/outboxgen/outboxgen/internal/pgtest"
)

// roleEnv is an outbox that a migrator role owns, and outboxes of it as
// seen by a publishing and a subscribing role with only the privileges
// Grants gives them.
type roleEnv struct {
	*env
	pub, sub *Outbox
	// roles are the migrator's, the publisher's and the subscriber's names.
	roles [3]string
}

// setupRoles makes three login roles of the test's own (dropped when it
// ends), gives the test's schema to the migrator, migrates the outbox as
// the migrator, grants the others what Grants lists, as the migrator,
// and connects as each role.
func setupRoles(t *testing.T) *roleEnv {
	t.Helper()
	d := pgtest.New(t)
	ctx := t.Context()
	r := d.NewRoles(t)
	connect := func(role string) *Outbox {
		t.Helper()
		ob, err := New(d.PoolAs(t, role), &Config{Schema: d.Schema})
		if err != nil {
			t.Fatal(err)
		}
		return ob
	}
	owner := connect(r.Migrator)
	if err := owner.Migrate(ctx); err != nil {
		t.Fatalf("Migrate as the migrator: %v", err)
	}
	if err := owner.Grant(ctx, Roles{Publisher: r.Publisher, Subscriber: r.Subscriber}); err != nil {
		t.Fatalf("Grant as the migrator: %v", err)
	}
	ob, err := New(d.Pool, &Config{Schema: d.Schema})
	if err != nil {
		t.Fatal(err)
	}
	return &roleEnv{env: newEnv(t, d, ob), pub: connect(r.Publisher), sub: connect(r.Subscriber),
		roles: [3]string{r.Migrator, r.Publisher, r.Subscriber}}
}

// A publishing role with only the grants Grants gives publishes keyed,
// unkeyed, scheduled and timer rows, in batches, at READ COMMITTED and
// REPEATABLE READ, and cancels timers, while the subscribers sleep and
// while they work; a subscribing role with only its grants handles every
// row, each key's in order, reads the queue statistics and depths, and
// replays dead letters.
func TestRolesWithOnlyTheDocumentedGrantsPublishSubscribeAndOperate(t *testing.T) {
	t.Parallel()
	e := setupRoles(t)
	ctx := e.ctx
	pub, err := NewPublisher[string](e.pub, "q", nil)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		handled []string
	)
	h := func(_ context.Context, m *Message[string]) error {
		if m.Payload == "reject" {
			return Reject(errors.New("rejected"))
		}
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, m.Payload)
		time.Sleep(time.Millisecond)
		return nil
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(handled) }
	subs := []*started{
		startSub(t, e.sub, []string{"q"}, h, fastConfig[string](nil)),
		startSub(t, e.sub, []string{"q"}, h, nil),
	}
	asleep := func() bool {
		var n int
		if err := e.db.Pool.QueryRow(ctx, "SELECT count(*) FROM outbox_sleepers WHERE until > now()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == len(subs)
	}

	var want []string
	// publishAll publishes, as the publishing role, one row of every kind
	// whose payloads start with tag, and returns them.
	publishAll := func(tag string) {
		t.Helper()
		in := func(iso pgx.TxIsoLevel, fn func(tx pgx.Tx) error) {
			t.Helper()
			if err := pgx.BeginTxFunc(ctx, e.pub.pool, pgx.TxOptions{IsoLevel: iso}, fn); err != nil {
				t.Fatalf("%s: publish at %s: %v", tag, iso, err)
			}
		}
		for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead} {
			p := fmt.Sprintf("%s %s ", tag, iso)
			in(iso, func(tx pgx.Tx) error {
				if _, err := pub.Publish(ctx, tx, p+"unkeyed", nil); err != nil {
					return err
				}
				if _, err := pub.Publish(ctx, tx, p+"k1", &PublishOpts{OrderingKey: "k-" + tag}); err != nil {
					return err
				}
				if _, err := pub.PublishBatch(ctx, tx, []string{p + "k2", p + "k3"}, &PublishOpts{OrderingKey: "k-" + tag}); err != nil {
					return err
				}
				if _, err := pub.Publish(ctx, tx, p+"scheduled", &PublishOpts{Delay: 50 * time.Millisecond}); err != nil {
					return err
				}
				if _, err := pub.Publish(ctx, tx, p+"timer", &PublishOpts{TimerID: p + "timer", Delay: 50 * time.Millisecond}); err != nil {
					return err
				}
				if _, err := pub.Publish(ctx, tx, p+"cancelled", &PublishOpts{TimerID: p + "cancelled", Delay: time.Hour}); err != nil {
					return err
				}
				if ok, err := e.pub.CancelTimer(ctx, tx, "q", p+"cancelled"); err != nil || !ok {
					return fmt.Errorf("CancelTimer = %v, %w", ok, err)
				}
				return nil
			})
			want = append(want, p+"unkeyed", p+"k1", p+"k2", p+"k3", p+"scheduled", p+"timer")
		}
		// Autocommit, through the pool.
		if _, err := pub.Publish(ctx, e.pub.pool, tag+" autocommit", &PublishOpts{OrderingKey: "k-" + tag}); err != nil {
			t.Fatalf("%s: publish in autocommit: %v", tag, err)
		}
		want = append(want, tag+" autocommit")
	}

	eventually(t, "both subscribers asleep", asleep)
	publishAll("asleep")
	eventually(t, "the rows published while the subscribers slept handled", func() bool { return count() >= len(want) })

	// While they work: a backlog, and every kind of row published into it.
	backlog := make([]string, 300)
	for i := range backlog {
		backlog[i] = fmt.Sprintf("backlog %d", i)
	}
	if _, err := pub.PublishBatch(ctx, e.pub.pool, backlog, nil); err != nil {
		t.Fatal(err)
	}
	want = append(want, backlog...)
	publishAll("working")
	eventually(t, "every row handled", func() bool { return count() >= len(want) })

	// Dead letters, replayed by the subscribing role.
	if _, err := pub.Publish(ctx, e.pub.pool, "reject", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the rejected row dead-lettered", func() bool { return e.count("outbox_dlq") == 1 })
	if _, err := e.sub.QueueStats(ctx); err != nil {
		t.Errorf("QueueStats as the subscribing role: %v", err)
	}
	if _, err := e.sub.QueueDepths(ctx, nil); err != nil {
		t.Errorf("QueueDepths as the subscribing role: %v", err)
	}
	if dl, err := e.sub.DeadLetters(ctx, DeadLetterFilter{Queue: "q"}, 0, 10); err != nil || len(dl) != 1 {
		t.Errorf("DeadLetters as the subscribing role = %d rows, %v; want 1", len(dl), err)
	}
	if r, err := e.sub.ReplayDeadLetters(ctx, DeadLetterFilter{Queue: "q"}, nil); err != nil || r.Replayed != 1 {
		t.Errorf("ReplayDeadLetters as the subscribing role = %+v, %v", r, err)
	}
	eventually(t, "the replayed row dead-lettered again", func() bool { return e.count("outbox_dlq") == 1 })
	if res, err := e.sub.PurgeDeadLetters(ctx, DeadLetterFilter{Queue: "q"}, nil); err != nil || res.Deleted != 1 {
		t.Errorf("PurgeDeadLetters as the subscribing role = %+v, %v", res, err)
	}

	for i, s := range subs {
		if err := s.stop(); err != nil {
			t.Errorf("Run of subscriber %d: %v", i, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, tag := range []string{"asleep", "working"} {
		var keyed []string
		for _, p := range handled {
			if k := slices.Index([]string{"k1", "k2", "k3", "autocommit"}, lastWord(p)); k >= 0 && firstWord(p) == tag {
				keyed = append(keyed, p)
			}
		}
		wantKeyed := []string{tag + " read committed k1", tag + " read committed k2", tag + " read committed k3",
			tag + " repeatable read k1", tag + " repeatable read k2", tag + " repeatable read k3", tag + " autocommit"}
		if diff := cmp.Diff(wantKeyed, keyed); diff != "" {
			t.Errorf("key k-%s handled out of order (-want +got):\n%s", tag, diff)
		}
	}
	slices.Sort(handled)
	slices.Sort(want)
	if diff := cmp.Diff(want, handled); diff != "" {
		t.Errorf("handled (-want +got):\n%s", diff)
	}
	if n := e.count("outbox"); n != 0 {
		t.Errorf("%d rows left", n)
	}
}

func firstWord(s string) string {
	for i, r := range s {
		if r == ' ' {
			return s[:i]
		}
	}
	return s
}

func lastWord(s string) string {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == ' ' {
			return s[i+1:]
		}
	}
	return s
}

// A role with no grants on the outbox cannot hold what publishers or
// subscribers wait for: the advisory locks that schema 8 derived from
// public names (a key's, and the sleep horizon's) are no longer the ones
// the outbox takes, and the functions that compute or take the outbox's
// locks refuse it.
func TestARoleWithoutGrantsCannotStallPublishersOrSleepingSubscribers(t *testing.T) {
	t.Parallel()
	e := setupRoles(t)
	ctx := e.ctx
	// It may look into the schema, as every role may into public.
	_, c := e.loginRole("outsider")
	table := pgx.Identifier{e.db.Schema, "outbox"}.Sanitize()
	// Schema 8's lock of key ('q', 'k') and its horizon's, computed from
	// names every role can read, held for the session.
	if _, err := c.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended(q || E'\x1f' || k, hashtext($1)))
		FROM (VALUES ('q', 'k'), ('', '')) AS v(q, k)`, table); err != nil {
		t.Fatal(err)
	}
	for _, fn := range []string{
		"SELECT " + pgx.Identifier{e.db.Schema, "outbox_key_lock"}.Sanitize() + "('q', 'k')",
		"SELECT " + pgx.Identifier{e.db.Schema, "outbox_hand_off"}.Sanitize() + "('{q}', 1)",
		"SELECT last_value FROM " + pgx.Identifier{e.db.Schema, "outbox_lock_seed"}.Sanitize(),
		"SELECT FROM " + pgx.Identifier{e.db.Schema, "outbox_sleepers_turn"}.Sanitize() + " FOR UPDATE",
	} {
		if _, err := c.Exec(ctx, fn); dbx.SQLState(err) != "42501" {
			t.Errorf("%s as a role without grants: %v, want permission denied", fn, err)
		}
	}
	// The seed's value through the function: permission denied up to
	// PostgreSQL 17; from 18 on, NULL for a role that may not read it.
	seed := "SELECT pg_sequence_last_value('" + pgx.Identifier{e.db.Schema, "outbox_lock_seed"}.Sanitize() + "')"
	var value *int64
	if err := c.QueryRow(ctx, seed).Scan(&value); dbx.SQLState(err) != "42501" && (err != nil || value != nil) {
		t.Errorf("%s as a role without grants: %v (%v), want permission denied or NULL", seed, err, value)
	}

	pub, err := NewPublisher[string](e.pub, "q", nil)
	if err != nil {
		t.Fatal(err)
	}
	bounded, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := pub.Publish(bounded, e.pub.pool, "keyed", &PublishOpts{OrderingKey: "k"}); err != nil {
		t.Errorf("a keyed publish while a role without grants holds schema 8's lock of the key: %v", err)
	}
	if err := e.sub.queries(e.sub.pool).Sleep(bounded, db.SleepParams{ID: newSleepID(), Queues: []string{"q"}, ForSeconds: 60}); err != nil {
		t.Errorf("a sleep record while a role without grants holds schema 8's lock of the horizon: %v", err)
	}
}
