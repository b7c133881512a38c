package outbox

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/pgtest"
)

// listener is a connection listening on one or more outbox channels.
type listener struct {
	t    *testing.T
	conn *pgx.Conn
}

// listen LISTENs on channels through a connection to url, or straight to
// the server when the test database is behind a pooler that cannot
// LISTEN (pgtest.ListenURL).
func listen(t *testing.T, url string, channels ...string) *listener {
	t.Helper()
	if direct := pgtest.ListenURL(); direct != "" {
		url = direct
	}
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	for _, ch := range channels {
		if _, err := conn.Exec(t.Context(), "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	}
	return &listener{t: t, conn: conn}
}

// until returns the "channel:payload" of every notification that arrives
// before the one whose payload is sentinel. PostgreSQL delivers
// notifications in commit order, so publishing a sentinel after an action
// proves what that action did or did not send without sleeping.
func (l *listener) until(sentinel string) []string {
	l.t.Helper()
	var got []string
	for {
		ctx, cancel := context.WithTimeout(l.t.Context(), 10*time.Second)
		n, err := l.conn.WaitForNotification(ctx)
		cancel()
		if err != nil {
			l.t.Fatalf("waiting for notification %q (got %v): %v", sentinel, got, err)
		}
		if n.Payload == sentinel {
			return got
		}
		got = append(got, n.Channel+":"+n.Payload)
	}
}

// sleepOn records a sleeping subscriber of queues in the outbox of q, as
// a subscriber's fetcher does before it waits, so that writers of those
// queues notify. It returns the record's id.
func sleepOn(t *testing.T, q *db.Queries, queues ...string) pgtype.UUID {
	t.Helper()
	id := newSleepID()
	if err := q.Sleep(t.Context(), db.SleepParams{ID: id, Queues: queues, ForSeconds: 3600}); err != nil {
		t.Fatal(err)
	}
	return id
}

func (e *env) sleepOn(queues ...string) pgtype.UUID {
	e.t.Helper()
	return sleepOn(e.t, e.q, queues...)
}

func TestNotifyOnCommitOnly(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.sleepOn("orders", "sentinel-1", "sentinel-2", "sentinel-3")
	l := listen(t, e.db.URL, e.ob.Channel())
	ch := e.ob.Channel() + ":"

	tx, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.ob.queries(tx).Publish(e.ctx, db.PublishParams{Queue: "orders", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	e.publish("sentinel-1")
	if got := l.until("sentinel-1"); len(got) != 0 {
		t.Errorf("before commit: %v, want nothing", got)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.publish("sentinel-2")
	if diff := cmp.Diff([]string{ch + "orders"}, l.until("sentinel-2")); diff != "" {
		t.Errorf("after commit (-want +got):\n%s", diff)
	}

	tx, err = e.db.Pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.ob.queries(tx).Publish(e.ctx, db.PublishParams{Queue: "orders", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.publish("sentinel-3")
	if got := l.until("sentinel-3"); len(got) != 0 {
		t.Errorf("after rollback: %v, want nothing", got)
	}
}

func TestNotifyOncePerStatementPerQueue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.sleepOn("a", "b", "c", "sentinel")
	l := listen(t, e.db.URL, e.ob.Channel())
	ch := e.ob.Channel() + ":"

	var rows []db.PublishCopyParams
	for _, q := range []string{"a", "b", "a", "a", "b"} {
		rows = append(rows, db.PublishCopyParams{Queue: q, Payload: []byte{1}})
	}
	if _, err := e.q.PublishCopy(e.ctx, rows); err != nil {
		t.Fatal(err)
	}
	if _, err := e.q.PublishBatch(e.ctx, db.PublishBatchParams{
		Queue: "c", Payloads: [][]byte{{1}, {2}},
	}); err != nil {
		t.Fatal(err)
	}
	e.publish("a")
	e.publish("sentinel")
	got := l.until("sentinel")
	slices.Sort(got)
	if diff := cmp.Diff([]string{ch + "a", ch + "a", ch + "b", ch + "c"}, got); diff != "" {
		t.Errorf("notifications (-want +got):\n%s", diff)
	}
}

func TestNotifySkipsFutureRows(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.sleepOn("later", "now", "sentinel")
	l := listen(t, e.db.URL, e.ob.Channel())
	sched := listen(t, e.db.URL, e.ob.ScheduledChannel())
	e.publishWith(db.PublishParams{Queue: "later", Payload: []byte("x"), DelaySeconds: 60})
	e.exec("INSERT INTO outbox (queue, payload, next_attempt_at) VALUES ('later', '\\x00', now() + interval '1 hour'), ('now', '\\x00', now())")
	e.publish("sentinel")
	if diff := cmp.Diff([]string{e.ob.Channel() + ":now"}, l.until("sentinel")); diff != "" {
		t.Errorf("due channel (-want +got):\n%s", diff)
	}
	e.publishWith(db.PublishParams{Queue: "sentinel", Payload: []byte("x"), DelaySeconds: 60})
	want := []string{e.ob.ScheduledChannel() + ":later", e.ob.ScheduledChannel() + ":later"}
	if diff := cmp.Diff(want, sched.until("sentinel")); diff != "" {
		t.Errorf("scheduled channel (-want +got):\n%s", diff)
	}
}

func TestNotifyForRowsWrittenByPlainSQL(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.sleepOn("plain", "sentinel")
	l := listen(t, e.db.URL, e.ob.Channel())
	e.exec("INSERT INTO outbox (queue, payload) VALUES ('plain', 'hello'), ('plain', 'again')")
	e.publish("sentinel")
	if diff := cmp.Diff([]string{e.ob.Channel() + ":plain"}, l.until("sentinel")); diff != "" {
		t.Errorf("notifications (-want +got):\n%s", diff)
	}
}
