package outbox

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/internal/pgtest"
)

// otherDatabase returns dsn pointed at another database of the same
// server, where notifications of dsn's database never arrive.
func otherDatabase(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if u.Path == "/postgres" {
		u.Path = "/template1"
	} else {
		u.Path = "/postgres"
	}
	return u.String()
}

// health runs Health and fails the test on its error.
func (e *env) health(opts *HealthOptions) Health {
	e.t.Helper()
	h, err := e.ob.Health(e.ctx, opts)
	if err != nil {
		e.t.Fatalf("Health: %v", err)
	}
	return h
}

// problem returns the first problem that contains all of parts, or "".
func (h *Health) problem(parts ...string) string {
	for _, p := range h.Problems {
		ok := true
		for _, part := range parts {
			ok = ok && strings.Contains(p, part)
		}
		if ok {
			return p
		}
	}
	return ""
}

// A migrated outbox whose notifications arrive is healthy.
func TestHealthOfAWorkingOutbox(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := e.health(nil)
	if h.SchemaVersion != e.ob.LatestSchemaVersion() || h.LibraryVersion != e.ob.LatestSchemaVersion() {
		t.Errorf("versions %d and %d, want %d", h.SchemaVersion, h.LibraryVersion, e.ob.LatestSchemaVersion())
	}
	if !h.NotifyHeard || h.NotifyTook <= 0 || h.NotifyTook > 2*time.Second || h.NotifyError != "" {
		t.Errorf("NOTIFY probe: heard %v in %v (%q)", h.NotifyHeard, h.NotifyTook, h.NotifyError)
	}
	if h.XidAge <= 0 {
		t.Errorf("the table's transaction-id age is %d", h.XidAge)
	}
	if len(h.Problems) != 0 {
		t.Errorf("problems: %q", h.Problems)
	}
}

// Without an outbox table, Health still answers, and says how to make it.
func TestHealthOfAMissingOutbox(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	ob := newOutbox(t, d) // never migrated
	h, err := ob.Health(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if h.SchemaVersion != 0 || h.problem("does not exist", "outboxgen migrate up") == "" {
		t.Errorf("version %d, problems %q", h.SchemaVersion, h.Problems)
	}
	if !h.NotifyHeard {
		t.Errorf("NOTIFY needs no table, yet was not heard: %s", h.NotifyError)
	}
}

// NotifyTimeout bounds the wait for the notification, not the setting up
// of the probe: a LISTEN connection slower to connect than NotifyTimeout,
// as on a busy server, still hears it.
func TestHealthWaitsNotifyTimeoutFromTheNotification(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const timeout = 300 * time.Millisecond
	slow := func(ctx context.Context) (*pgx.Conn, error) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(2 * timeout):
		}
		return pgx.Connect(ctx, e.db.URL)
	}
	h := e.health(&HealthOptions{ListenConnect: slow, NotifyTimeout: timeout})
	if !h.NotifyHeard || h.NotifyError != "" || h.problem("NOTIFY") != "" {
		t.Errorf("a LISTEN connection that took %v to connect: heard %v (%q), problems %q", 2*timeout, h.NotifyHeard, h.NotifyError, h.Problems)
	}
}

// A LISTEN connection that never hears the notification, as through a
// pooler in transaction mode, is a problem naming the fix. Here the
// listener is in another database, where this database's notifications
// never arrive.
func TestHealthReportsANotificationThatNeverArrives(t *testing.T) {
	t.Parallel()
	e := setup(t)
	h := e.health(&HealthOptions{ListenDSN: otherDatabase(t, e.db.URL), NotifyTimeout: 300 * time.Millisecond})
	if h.NotifyHeard || !strings.Contains(h.NotifyError, "heard nothing") {
		t.Errorf("heard %v (%q)", h.NotifyHeard, h.NotifyError)
	}
	if h.problem("NOTIFY did not reach", "ListenDSN") == "" {
		t.Errorf("problems: %q", h.Problems)
	}
	h = e.health(&HealthOptions{ListenDSN: "postgres://nobody@127.0.0.1:1/none?connect_timeout=1", NotifyTimeout: 300 * time.Millisecond})
	if h.NotifyHeard || !strings.Contains(h.NotifyError, "connecting the LISTEN connection") {
		t.Errorf("an unreachable listener: heard %v (%q)", h.NotifyHeard, h.NotifyError)
	}
}

// oldestWait is how long a test waits for its open transaction to be
// the oldest in the cluster: until every older transaction of the tests
// running beside it has ended, which on a loaded machine took more than
// a minute.
const oldestWait = 5 * time.Minute

// A transaction left open is named as what holds back vacuum, once it is
// the oldest in the cluster, and is a problem past the thresholds.
func TestHealthNamesATransactionHoldingBackVacuum(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if pgtest.RolesMode() {
		// The holder is another role's session, which Health reads with
		// pg_read_all_stats (the next test shows what it says without).
		e.exec("GRANT pg_read_all_stats TO " + pgx.Identifier{e.obRole()}.Sanitize())
	}
	app := "health-" + e.db.Schema
	tx := e.holdSnapshot(app)
	opts := &HealthOptions{XminDuration: time.Millisecond}
	var h Health
	eventuallyWithin(t, "the open transaction is the oldest", oldestWait, func() bool {
		h = e.health(opts)
		return h.OldestXmin != nil && strings.Contains(h.OldestXmin.Name, app)
	})
	if x := h.OldestXmin; x.Kind != "session" || x.State != "idle in transaction" || x.Open <= 0 {
		t.Errorf("holder %+v", *x)
	}
	if h.problem("holds back vacuum", app) == "" {
		t.Errorf("problems: %q", h.Problems)
	}
	if h := e.health(nil); h.problem("holds back vacuum") != "" {
		t.Errorf("a transaction open for seconds is a problem at the default thresholds: %q", h.Problems)
	}
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
}

// A role that may not read how long another role's session has held back
// vacuum marks that holder hidden and judges it on its age alone, and
// judges it on how long it has been open once it has pg_read_all_stats.
func TestHealthSaysWhenItMayNotReadAHoldersActivity(t *testing.T) {
	t.Parallel()
	e := setupRoles(t)
	app := "hidden-" + e.db.Schema
	e.holdSnapshot(app)
	opts := &HealthOptions{XminDuration: time.Millisecond}
	var (
		h   Health
		err error
	)
	eventuallyWithin(t, "the open transaction is the oldest", oldestWait, func() bool {
		h, err = e.sub.Health(e.ctx, opts)
		if err != nil {
			t.Fatalf("Health: %v", err)
		}
		return h.OldestXmin != nil && strings.Contains(h.OldestXmin.Name, app)
	})
	if x := h.OldestXmin; !x.Hidden || x.State != "" || x.Open != 0 {
		t.Errorf("a holder the subscriber may not read: %+v", *x)
	}
	if h.problem("holds back vacuum", app) != "" {
		t.Errorf("a hidden holder young in transactions is a problem: %q", h.Problems)
	}
	h, err = e.sub.Health(e.ctx, &HealthOptions{XminAge: 1})
	if err != nil {
		t.Fatalf("Health: %v", err)
	}
	if h.problem("holds back vacuum") == "" {
		t.Errorf("a hidden holder past the age threshold: problems %q", h.Problems)
	}
	e.exec("GRANT pg_read_all_stats TO " + pgx.Identifier{e.roles[2]}.Sanitize())
	// Another test's transaction may be the oldest for a moment.
	eventuallyWithin(t, "the open transaction is the oldest, read with pg_read_all_stats", oldestWait, func() bool {
		h, err = e.sub.Health(e.ctx, opts)
		if err != nil {
			t.Fatalf("Health: %v", err)
		}
		return h.OldestXmin != nil && strings.Contains(h.OldestXmin.Name, app)
	})
	if x := h.OldestXmin; x == nil || x.Hidden || x.State != "idle in transaction" || x.Open <= 0 {
		t.Errorf("with pg_read_all_stats: %+v", x)
	}
	if h.problem("holds back vacuum", app, "open for") == "" {
		t.Errorf("with pg_read_all_stats: problems %q", h.Problems)
	}
}

// Dead row versions, the table's transaction-id age and an unread
// notification queue are problems past their thresholds.
func TestHealthReportsDeadRowsXidAgeAndTheNotificationQueue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.exec(`INSERT INTO outbox (queue, payload) SELECT 'q', 'x' FROM generate_series(1, 100)`)
	e.exec(`DELETE FROM outbox`)

	// A session that LISTENs and then stays in a transaction reads no
	// notification, so it holds those sent since in the server's queue.
	idle := listen(t, e.db.URL, "health_unread_"+e.db.Schema)
	stuck, err := idle.conn.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stuck.Rollback(context.Background()) }()
	for range 10 {
		e.exec("SELECT pg_notify($1, repeat('x', 7000))", "health_unread_"+e.db.Schema)
	}
	opts := &HealthOptions{DeadTuples: 50, XidAge: 1, NotifyQueueUsage: 1e-12}
	var h Health
	eventually(t, "the statistics of the deletes", func() bool { h = e.health(opts); return h.DeadTuples >= 100 })
	if h.problem("100 dead row versions") == "" && h.problem("dead row versions and 0 live") == "" {
		t.Errorf("dead rows %d: problems %q", h.DeadTuples, h.Problems)
	}
	if h.problem("oldest unfrozen row") == "" {
		t.Errorf("xid age %d: problems %q", h.XidAge, h.Problems)
	}
	if h.NotificationQueueUsage <= 0 || h.problem("notification queue") == "" {
		t.Errorf("queue usage %v: problems %q", h.NotificationQueueUsage, h.Problems)
	}
	if h := e.health(nil); len(h.Problems) != 0 {
		t.Errorf("at the default thresholds: %q", h.Problems)
	}
}
