package outbox

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
)

// sleeping returns how many sleep records of the outbox hold, and how many
// exist.
func (e *env) sleeping() (holding, records int) {
	e.t.Helper()
	if err := e.db.Pool.QueryRow(e.ctx,
		"SELECT count(*) FILTER (WHERE until > now()), count(*) FROM outbox_sleepers").Scan(&holding, &records); err != nil {
		e.t.Fatal(err)
	}
	return holding, records
}

// waitAsleep waits until a subscriber's sleep record holds: a claim of it
// found nothing, and writers of its queues now notify it.
func (e *env) waitAsleep() {
	e.t.Helper()
	eventually(e.t, "the subscriber asleep", func() bool { h, _ := e.sleeping(); return h == 1 })
}

// write is a write to the outbox, after an optional preparation.
type write struct{ prepare, write func() }

// Writers notify a queue's channel only while a subscriber of the queue
// sleeps: inserts by any client, cleared leases, and unblocked key heads.
func TestWritersNotifyOnlyWhileASubscriberSleeps(t *testing.T) {
	t.Parallel()
	e := setup(t)
	l := listen(t, e.db.URL, e.ob.Channel())
	ch := e.ob.Channel() + ":"
	e.sleepOn("sentinel")
	// notes returns what write notified, after prepare's notifications.
	notes := func(w write) []string {
		t.Helper()
		if w.prepare != nil {
			w.prepare()
			e.publish("sentinel")
			l.until("sentinel")
		}
		w.write()
		e.publish("sentinel")
		return l.until("sentinel")
	}
	writes := map[string]write{
		"Publish":   {write: func() { e.publish("q") }},
		"plain SQL": {write: func() { e.exec("INSERT INTO outbox (queue, payload) VALUES ('q', 'x'), ('q', 'y')") }},
		"a cleared lease": {
			prepare: func() { e.claim(1, "q") },
			write: func() {
				e.exec("UPDATE outbox SET acquired_token = NULL, acquired_at = NULL, lease_expires_at = NULL WHERE acquired_token IS NOT NULL")
			},
		},
		"an unblocked head": {
			prepare: func() {
				e.exec("DELETE FROM outbox")
				e.publishKeyed("q", "k")
				e.publishKeyed("q", "k")
			},
			write: func() { e.ack(e.claim(1, "q")[0]) },
		},
	}
	for what, w := range writes {
		if got := notes(w); len(got) != 0 {
			t.Errorf("%s with nobody asleep notified %v", what, got)
		}
	}
	e.exec("DELETE FROM outbox")

	// A record of another queue, or one that lapsed, changes nothing.
	sleepOn(t, e.q, "other")
	lapsed := e.sleepOn("q")
	e.exec("UPDATE outbox_sleepers SET until = now() - interval '1 second' WHERE id = $1", lapsed)
	if got := notes(writes["Publish"]); len(got) != 0 {
		t.Errorf("with another queue's and a lapsed record: %v", got)
	}

	// A subscriber of q asleep: every kind of write notifies.
	id := e.sleepOn("q")
	for what, w := range writes {
		if diff := cmp.Diff([]string{ch + "q"}, notes(w)); diff != "" {
			t.Errorf("%s with a subscriber asleep (-want +got):\n%s", what, diff)
		}
	}

	// It woke: nothing again.
	if err := e.q.Wake(e.ctx, id); err != nil {
		t.Fatal(err)
	}
	if got := notes(writes["Publish"]); len(got) != 0 {
		t.Errorf("after the subscriber woke: %v", got)
	}
}

// A writer outside READ COMMITTED reads the sleep records in a snapshot
// that may predate them, so while any subscriber sleeps it notifies
// whether or not one of its queue does. It reads the sleep horizon
// outside any snapshot, so while nobody sleeps it does not notify.
func TestWritersOutsideReadCommittedNotifyWhileAnyoneSleeps(t *testing.T) {
	t.Parallel()
	e := setup(t)
	l := listen(t, e.db.URL, e.ob.Channel())
	publishIn := func(iso pgx.TxIsoLevel) {
		t.Helper()
		tx, err := e.db.Pool.BeginTx(e.ctx, pgx.TxOptions{IsoLevel: iso})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.ob.queries(tx).Publish(e.ctx, db.PublishParams{Queue: "q", Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	isolations := []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable}
	for _, iso := range isolations {
		publishIn(iso)
	}
	// Notifications arrive in commit order: any of the publishes above
	// would come before the sentinel.
	e.sleepOn("sentinel")
	e.publish("sentinel")
	if got := l.until("sentinel"); len(got) != 0 {
		t.Errorf("with nobody asleep: %v", got)
	}
	for _, iso := range isolations {
		publishIn(iso)
		e.publish("sentinel")
		if diff := cmp.Diff([]string{e.ob.Channel() + ":q"}, l.until("sentinel")); diff != "" {
			t.Errorf("%s publish (-want +got):\n%s", iso, diff)
		}
	}
}

// horizon returns the sleep horizon, and what the records that hold make
// it: the latest end of one, in milliseconds since the epoch, or 0.
func (e *env) horizon() (got, want int64) {
	e.t.Helper()
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT pg_sequence_last_value('outbox_sleep_horizon'),
		coalesce((SELECT ceil(date_part('epoch', max(until)) * 1000)::bigint FROM outbox_sleepers WHERE until > now()), 0)`,
	).Scan(&got, &want); err != nil {
		e.t.Fatal(err)
	}
	return got, want
}

// sleepFor records sleeper id asleep on queue q for seconds.
func (e *env) sleepFor(q *db.Queries, id pgtype.UUID, seconds float64) {
	e.t.Helper()
	if err := q.Sleep(e.ctx, db.SleepParams{ID: id, Queues: []string{"q"}, ForSeconds: seconds}); err != nil {
		e.t.Fatal(err)
	}
}

// Every change to the sleep records, whoever makes it, sets the horizon to
// the latest end of a record that holds; a change that rolls back can
// leave it later, never earlier.
func TestSleepHorizonFollowsTheRecords(t *testing.T) {
	t.Parallel()
	e := setup(t)
	exact := func(step string, none bool) {
		t.Helper()
		got, want := e.horizon()
		if got != want || (want == 0) != none {
			t.Errorf("%s: horizon %d, want %d (none: %v)", step, got, want, none)
		}
	}
	exact("no records", true)
	a, b, c := newSleepID(), newSleepID(), newSleepID()
	e.sleepFor(e.q, a, 60)
	exact("a asleep", false)
	e.sleepFor(e.q, b, 120)
	exact("b asleep longer", false)
	if err := e.q.Wake(e.ctx, b); err != nil {
		t.Fatal(err)
	}
	exact("b woke", false)
	e.exec("UPDATE outbox_sleepers SET until = now() - interval '1 second' WHERE id = $1", a)
	exact("a's record lapsed", true)

	e.sleepFor(e.q, a, 60)
	aOnly, _ := e.horizon()
	tx := e.fixtureTx()
	e.sleepFor(e.ob.queries(tx), c, 600)
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := e.horizon(); got <= aOnly || want != aOnly {
		t.Errorf("after a record that rolled back: horizon %d, records' %d; want it past a's %d", got, want, aOnly)
	}
	if err := e.q.Leave(e.ctx, a); err != nil {
		t.Fatal(err)
	}
	exact("a left", true)
	e.sleepFor(e.q, a, 60)
	e.exec("TRUNCATE outbox_sleepers")
	exact("records truncated", true)

	// Concurrent changes take turns: after each round of them the horizon
	// is the records' again.
	ids := make([]pgtype.UUID, 8)
	for w := range ids {
		ids[w] = newSleepID()
	}
	for round := range 30 {
		var wg sync.WaitGroup
		for w, id := range ids {
			wg.Go(func() {
				var err error
				if (round+w)%3 != 0 {
					err = e.q.Sleep(e.ctx, db.SleepParams{ID: id, Queues: []string{"q"}, ForSeconds: float64(60 + 7*w + round)})
				} else {
					err = e.q.Wake(e.ctx, id)
				}
				if err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if got, want := e.horizon(); got != want {
			t.Fatalf("after round %d of concurrent changes: horizon %d, want %d", round, got, want)
		}
	}
	exact("after concurrent changes", false)
}

// The horizon needs no privilege of its own: a role that may publish and
// write sleep records, as before schema 8, still may.
func TestSleepHorizonNeedsNoNewPrivilege(t *testing.T) {
	t.Parallel()
	e := setup(t)
	role := e.db.Schema + "_role"
	ident := pgx.Identifier{role}.Sanitize()
	e.exec("CREATE ROLE " + ident)
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = e.db.Pool.Exec(ctx, "DROP OWNED BY "+ident)
		_, _ = e.db.Pool.Exec(ctx, "DROP ROLE "+ident)
	})
	schema := pgx.Identifier{e.db.Schema}.Sanitize()
	e.exec("GRANT USAGE ON SCHEMA " + schema + " TO " + ident)
	e.exec("GRANT SELECT, INSERT ON outbox TO " + ident)
	e.exec("GRANT USAGE ON SEQUENCE outbox_id_seq TO " + ident)
	e.exec("GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_sleepers TO " + ident)
	// A sleep record leaves the paused queues out (schema 14).
	e.exec("GRANT SELECT ON outbox_pauses TO " + ident)
	asRole := func(what string, fn func(q *db.Queries) error) {
		t.Helper()
		tx := e.fixtureTx()
		defer func() { _ = tx.Rollback(e.ctx) }()
		if _, err := tx.Exec(e.ctx, "SET LOCAL ROLE "+ident); err != nil {
			t.Fatal(err)
		}
		if err := fn(e.ob.queries(tx)); err != nil {
			t.Fatalf("%s as a role without privileges on the horizon: %v", what, err)
		}
		if err := tx.Commit(e.ctx); err != nil {
			t.Fatalf("%s: commit: %v", what, err)
		}
	}
	publish := func(q *db.Queries) error {
		_, err := q.Publish(e.ctx, db.PublishParams{Queue: "q", Payload: []byte("x")})
		return err
	}
	asRole("publish, nobody asleep", publish)
	id := newSleepID()
	asRole("sleep", func(q *db.Queries) error {
		return q.Sleep(e.ctx, db.SleepParams{ID: id, Queues: []string{"q"}, ForSeconds: 60})
	})
	if got, want := e.horizon(); got != want || want == 0 {
		t.Errorf("after the role's sleep: horizon %d, want %d", got, want)
	}
	asRole("publish, a subscriber asleep", publish)
	asRole("wake", func(q *db.Queries) error { return q.Wake(e.ctx, id) })
	if n := e.count("outbox"); n != 2 {
		t.Errorf("%d rows published, want 2", n)
	}
}

// A full notification queue fails every notifying transaction at commit,
// so writers stop notifying while it is half full: publishing still
// succeeds, and subscribers find the rows by polling.
func TestWritersSkipNotifyWhileTheNotificationQueueIsHalfFull(t *testing.T) {
	t.Parallel()
	e := setup(t)
	l := listen(t, e.db.URL, e.ob.Channel())
	e.sleepOn("q", "sentinel")
	for _, c := range []struct {
		usage  string
		notify bool
	}{{"0.49", true}, {"0.5", false}, {"0.99", false}} {
		e.exec("CREATE OR REPLACE FUNCTION outbox_notify_queue_usage() RETURNS float8 LANGUAGE sql AS 'SELECT " + c.usage + "::float8'")
		e.publish("q")
		e.exec("CREATE OR REPLACE FUNCTION outbox_notify_queue_usage() RETURNS float8 LANGUAGE sql AS 'SELECT pg_notification_queue_usage()'")
		e.publish("sentinel")
		got := l.until("sentinel")
		if notified := len(got) > 0; notified != c.notify {
			t.Errorf("queue %s full: notified %v, want %v", c.usage, got, c.notify)
		}
	}
	if n := e.count("outbox"); n != 6 {
		t.Errorf("%d rows published, want 6", n)
	}
}

// A subscriber records its sleep when it finds nothing to claim, ends the
// record while claims keep finding rows, and removes it when it stops.
func TestSubscriberSleepRecordFollowsItsWork(t *testing.T) {
	t.Parallel()
	e := setup(t)
	proceed := make(chan struct{})
	cfg := fastConfig[string](nil)
	cfg.Workers, cfg.FetchBatchSize = 1, 2
	s := startSub(t, e.ob, []string{"q"}, func(ctx context.Context, _ *Message[string]) error {
		select {
		case <-proceed:
		case <-ctx.Done():
		}
		return nil
	}, cfg)
	eventually(t, "an idle subscriber's sleep record", func() bool { h, _ := e.sleeping(); return h == 1 })

	// One transaction, so that claims keep finding rows.
	e.exec(`INSERT INTO outbox (queue, payload) SELECT 'q', '"x"' FROM generate_series(1, 10)`)
	// Ended: deleted (each sleep makes a record of its own).
	eventually(t, "a busy subscriber's record ended", func() bool { _, n := e.sleeping(); return n == 0 })
	close(proceed)
	eventually(t, "the backlog handled", func() bool { return e.count("outbox") == 0 })
	eventually(t, "the record made again", func() bool { h, _ := e.sleeping(); return h == 1 })

	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	if h, n := e.sleeping(); n != 0 {
		t.Errorf("after the stop: %d records (%d holding), want none", n, h)
	}
}

// A subscriber that keeps up with a stream of rows, each claim finding the
// few published since the last, keeps its sleep record while the stream is
// short (under the engine's wakeAfterBusy, 50 ms, and wakeAfterRows, 24
// rows): at 1,000 messages/s such a
// subscriber runs dry every few milliseconds, and ending its record at
// every second claim and making it again at the next empty one cost it
// four statements a cycle. A backlog (full batches) ends the record at
// once, as TestSubscriberSleepRecordFollowsItsWork checks.
//
// The stream holds fewer rows than wakeAfterRows. The record may end only
// after two claims in a row found rows: a machine that stalls the
// subscriber for 50 ms makes it fall behind, which by design ends the
// record. So a stream whose record was written again though no two claims
// in a row found rows fails at once; one that had such claims is tried
// again, up to three streams.
func TestSubscriberKeepingUpWithAStreamKeepsItsSleepRecord(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var handled atomic.Int64
	rec := &events{}
	cfg := fastConfig[string](rec)
	cfg.MaxFetchInterval = 5 * time.Second // the record is not refreshed during the stream
	s := startSub(t, e.ob, []string{"q"}, func(context.Context, *Message[string]) error {
		handled.Add(1)
		return nil
	}, cfg)
	e.waitAsleep()
	// The record's row version: Wake, Sleep and a refresh each write a new one.
	record := func() string {
		var xmin string
		if err := e.db.Pool.QueryRow(e.ctx, "SELECT xmin::text FROM outbox_sleepers").Scan(&xmin); err != nil {
			t.Fatal(err)
		}
		return xmin
	}
	// claims returns the rows each claim past the first skip found, in
	// order.
	claims := func(skip int) []int {
		var found []int
		for _, ev := range rec.named(EventFetched)[skip:] {
			found = append(found, ev.Count)
		}
		return found
	}
	const streamRows = 16 // fewer than wakeAfterRows
	published := 0
	for try := 1; ; try++ {
		before, seen := record(), len(rec.named(EventFetched))
		streamed := 0
		for start := time.Now(); time.Since(start) < 15*time.Millisecond && streamed < streamRows; streamed++ {
			e.publish("q")
		}
		published += streamed
		eventually(t, "the stream handled", func() bool { return handled.Load() == int64(published) })
		// The claim that ran dry after the stream, so that its events are in.
		eventually(t, "an empty claim", func() bool { c := claims(seen); return len(c) > 0 && c[len(c)-1] == 0 })
		after := record()
		if after == before {
			break
		}
		found := claims(seen)
		if !hasRun(found) {
			t.Fatalf("the sleep record was written again (row version %s, was %s) while the subscriber kept up with %d rows in 15 ms; claims found %v", after, before, streamed, found)
		}
		if try == 3 {
			t.Fatalf("in each of %d streams the sleep record was written again after two claims in a row found rows; the last one's claims found %v", try, found)
		}
		t.Logf("stream %d: two claims in a row found rows (claims found %v), as when the subscriber falls behind, and its record was written again; streaming again", try, found)
		e.waitAsleep()
	}
	if h, _ := e.sleeping(); h != 1 {
		t.Errorf("%d sleep records hold after the stream, want 1", h)
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
}

// hasRun reports whether two claims in a row found rows.
func hasRun(found []int) bool {
	for i := 1; i < len(found); i++ {
		if found[i-1] > 0 && found[i] > 0 {
			return true
		}
	}
	return false
}

// A publisher that looked for sleep records just before the subscriber
// made its record sends no notification; the subscriber waits for such
// writers to end and claims again, so the row is not left to the next
// poll.
func TestRowOfAWriterInFlightAsTheSubscriberFallsAsleepIsNotLeftToPolling(t *testing.T) {
	t.Parallel()
	e := setup(t)
	l := listen(t, e.db.URL, e.ob.Channel())
	tx := e.begin()
	if _, err := e.ob.queries(tx).Publish(e.ctx, db.PublishParams{Queue: "q", Payload: []byte(`"x"`)}); err != nil {
		t.Fatal(err)
	}
	handled := idleSubscriber(t, e, nil) // polls every 30 s
	eventually(t, "the LISTEN connection", func() bool { return len(e.listeners(e.ob.Channel())) == 1 })
	e.waitAsleep()
	time.Sleep(200 * time.Millisecond) // past the claim the listener's start triggers
	committed := time.Now()
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if lat := within(t, handled, 10*time.Second, "the in-flight row").Sub(committed); lat > 5*time.Second {
		t.Errorf("handled %v after the commit; the poll interval is 30 s, the writer's end should be seen at once", lat)
	}
	// The in-flight publisher did not notify: the delivery above came
	// from the subscriber's own wait.
	e.sleepOn("sentinel")
	e.publish("sentinel")
	if got := l.until("sentinel"); len(got) != 0 {
		t.Errorf("the in-flight publisher notified %v", got)
	}
}

// A change to the sleep records in a transaction whose snapshot predates
// a record committed since (REPEATABLE READ, SERIALIZABLE) never sets the
// horizon below that record's end, so writers of its queues still notify.
func TestAChangeToTheSleepersAtRepeatableReadKeepsTheHorizonAtACommittedRecord(t *testing.T) {
	t.Parallel()
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			l := listen(t, e.db.URL, e.ob.Channel())
			own := newSleepID()
			e.sleepFor(e.q, own, 60)

			tx, err := e.db.Pool.BeginTx(e.ctx, pgx.TxOptions{IsoLevel: iso})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(e.ctx) }()
			if _, err := tx.Exec(e.ctx, "SELECT 1"); err != nil {
				t.Fatal(err)
			}
			// Committed after tx's snapshot was taken.
			e.sleepOn("q", "sentinel")
			// tx ends its own record, as a subscriber's Wake does.
			if err := e.ob.queries(tx).Wake(e.ctx, own); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(e.ctx); err != nil {
				t.Fatal(err)
			}
			if got, want := e.horizon(); got < want {
				t.Errorf("horizon %d, below the committed record's end %d", got, want)
			}
			e.publish("q")
			e.publish("sentinel")
			if diff := cmp.Diff([]string{e.ob.Channel() + ":q"}, l.until("sentinel")); diff != "" {
				t.Errorf("a row of the sleeping subscriber's queue (-want +got):\n%s", diff)
			}
		})
	}
}
