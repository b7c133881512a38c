package outbox

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
	"github.com/outboxgen/outboxgen/internal/lease"
	"github.com/outboxgen/outboxgen/internal/pgtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(txChildDSN) != "" {
		// A subscriber process of TestTxEffectsHappenOnceThroughKills: it
		// runs until it is killed.
		if err := runTxChild(); err != nil {
			fmt.Fprintln(os.Stderr, "transactional subscriber child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv(crashChildDSN) != "" {
		// A subscriber process of TestClaimPromiseMaxDeliveriesCountsCrashes:
		// its handler kills it.
		if err := runCrashChild(); err != nil {
			fmt.Fprintln(os.Stderr, "crashing subscriber child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	pgtest.Main(m)
}

// env is one test's migrated outbox in its own schema.
type env struct {
	t   *testing.T
	ctx context.Context
	db  *pgtest.DB
	// ob is the outbox as subscribers and operators see it: on db.Pool,
	// or in the roles mode (pgtest.RolesMode) on a pool of the subscriber
	// role, whose URL obURL is.
	ob    *Outbox
	obURL string
	// owner is the outbox as its migrator sees it: ob, or in the roles
	// mode the migrator role's.
	owner *Outbox
	// pubPool is what tests publish through the public API on: db.Pool,
	// or in the roles mode a pool of the publisher role.
	pubPool *pgxpool.Pool
	// q runs the generated queries as db.Pool's role, for fixtures.
	q *db.Queries
}

// setup migrates an outbox with the default table name into a fresh schema.
func setup(t *testing.T) *env {
	t.Helper()
	return setupTable(t, TableDefault)
}

// In the roles mode (pgtest.RolesMode), a migrator role owns the outbox,
// and the env's outbox and publishing pool connect as roles with only
// what Grants gives them.
func setupTable(t *testing.T, table string) *env {
	t.Helper()
	return setupAs(t, table, pgtest.RolesMode())
}

// setupOwned is setup as the roles mode does it, in either mode: a
// migrator role, not a superuser, owns the outbox (and runs its SECURITY
// DEFINER functions), and e.ob connects as the subscriber role.
func setupOwned(t *testing.T) *env {
	t.Helper()
	return setupAs(t, TableDefault, true)
}

// setupMigrations is setup outside the roles mode: for the tests of the
// migrations.
func setupMigrations(t *testing.T) *env {
	t.Helper()
	return setupWith(t, TableDefault, false)
}

// setupAs is setupTable with the roles mode's roles when roles is set.
func setupAs(t *testing.T, table string, roles bool) *env {
	t.Helper()
	return setupWith(t, table, roles)
}

// setupWith is setupAs.
func setupWith(t *testing.T, table string, roles bool) *env {
	t.Helper()
	d := pgtest.New(t)
	cfg := &Config{Schema: d.Schema, Table: table}
	if !roles {
		ob, err := New(d.Pool, cfg)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		if err := ob.Migrate(t.Context()); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
		return newEnv(t, d, ob)
	}
	r := d.NewRoles(t)
	owner, err := New(d.PoolAs(t, r.Migrator), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := owner.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate as the migrator: %v", err)
	}
	if err := owner.Grant(t.Context(), Roles{Publisher: r.Publisher, Subscriber: r.Subscriber}); err != nil {
		t.Fatalf("Grant as the migrator: %v", err)
	}
	// The tables a test makes for its handlers' and publishers' own rows
	// are the application's, which its roles are given.
	if _, err := d.Pool.Exec(t.Context(), "ALTER DEFAULT PRIVILEGES IN SCHEMA "+pgx.Identifier{d.Schema}.Sanitize()+
		" GRANT ALL ON TABLES TO "+pgx.Identifier{r.Publisher}.Sanitize()+", "+pgx.Identifier{r.Subscriber}.Sanitize()+
		"; ALTER DEFAULT PRIVILEGES IN SCHEMA "+pgx.Identifier{d.Schema}.Sanitize()+
		" GRANT ALL ON SEQUENCES TO "+pgx.Identifier{r.Publisher}.Sanitize()+", "+pgx.Identifier{r.Subscriber}.Sanitize()); err != nil {
		t.Fatalf("grant the application's tables: %v", err)
	}
	ob, err := New(d.PoolAs(t, r.Subscriber), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e := newEnv(t, d, ob)
	e.obURL, e.pubPool, e.owner = d.URLAs(t, r.Subscriber), d.PoolAs(t, r.Publisher), owner
	return e
}

// newEnv wraps a test database and an outbox in it.
func newEnv(t *testing.T, d *pgtest.DB, ob *Outbox) *env {
	return &env{t: t, ctx: t.Context(), db: d, ob: ob, obURL: d.URL, owner: ob, pubPool: d.Pool, q: ob.queries(d.Pool)}
}

// outboxOn returns an outbox of e's schema on a pool of its own (as the
// role of e.ob), whose configuration set adjusts (nil: as e's), closed
// when the test ends.
func (e *env) outboxOn(set func(*pgxpool.Config)) *Outbox {
	e.t.Helper()
	cfg, err := pgxpool.ParseConfig(e.obURL)
	if err != nil {
		e.t.Fatal(err)
	}
	if set != nil {
		set(cfg)
	}
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(pool.Close)
	ob, err := New(pool, &Config{Schema: e.db.Schema, Table: e.ob.Table()})
	if err != nil {
		e.t.Fatal(err)
	}
	return ob
}

// obRole is the role e.ob connects as.
func (e *env) obRole() string {
	e.t.Helper()
	return roleOf(e.t, e.ob)
}

// fixtureTx begins a transaction as the test's own role, for fixtures and
// checks, rolled back when the test ends unless committed.
func (e *env) fixtureTx() pgx.Tx {
	e.t.Helper()
	tx, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// publish inserts a due row and returns its id.
func (e *env) publish(queue string) int64 {
	e.t.Helper()
	return e.publishWith(db.PublishParams{Queue: queue, Payload: []byte(`{}`)})
}

func (e *env) publishWith(p db.PublishParams) int64 {
	e.t.Helper()
	id, err := e.q.Publish(e.ctx, p)
	if err != nil {
		e.t.Fatalf("Publish: %v", err)
	}
	return id
}

// claimed is a claimed row with its claim's lease token.
type claimed struct {
	db.ClaimRow
	AcquiredToken pgtype.UUID
}

// claim claims up to n rows of queues with a one-minute lease and a fresh
// token, through the claim a subscriber of those queues uses (ClaimQueue
// for one queue).
func (e *env) claim(n int32, queues ...string) []claimed {
	e.t.Helper()
	var (
		rows []claimed
		err  error
	)
	tok := newToken()
	if len(queues) == 1 {
		var one []db.ClaimQueueRow
		one, err = e.q.ClaimQueue(e.ctx, db.ClaimQueueParams{Token: tok, Queue: queues[0], MaxRows: n, LeaseTtlSeconds: 60})
		for _, r := range claimRows(one, queues[0]) {
			rows = append(rows, claimed{r, tok})
		}
	} else {
		var all []db.ClaimRow
		all, err = e.q.Claim(e.ctx, db.ClaimParams{Token: tok, Queues: queues, MaxRows: n, LeaseTtlSeconds: 60})
		for _, r := range all {
			rows = append(rows, claimed{r, tok})
		}
	}
	if err != nil {
		e.t.Fatalf("Claim: %v", err)
	}
	return rows
}

// exec runs test-only SQL (search_path is the test's schema).
func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.db.Pool.Exec(e.ctx, sql, args...); err != nil {
		e.t.Fatalf("exec %q: %v", sql, err)
	}
}

// row reads one outbox row by id; ok is false when it does not exist.
func (e *env) row(id int64) (db.Outbox, bool) {
	e.t.Helper()
	rows, err := e.db.Pool.Query(e.ctx, `SELECT id, queue, payload, headers, ordering_key, timer_id,
		created_at, next_attempt_at, attempts_count, deliveries_count,
		first_attempt_at, last_attempt_at, acquired_at, acquired_token,
		lease_expires_at, last_error, blocked
		FROM `+pgx.Identifier{e.ob.Table()}.Sanitize()+` WHERE id = $1`, id)
	if err != nil {
		e.t.Fatalf("read row: %v", err)
	}
	r, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[db.Outbox])
	if err == pgx.ErrNoRows {
		return db.Outbox{}, false
	}
	if err != nil {
		e.t.Fatalf("read row: %v", err)
	}
	return r, true
}

// count counts table's rows; a count that fails to serialize (the
// database's default isolation may be SERIALIZABLE) is tried again.
func (e *env) count(table string) int {
	e.t.Helper()
	var n int
	for {
		err := e.db.Pool.QueryRow(e.ctx, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()).Scan(&n)
		if err == nil {
			return n
		}
		if dbx.Classify(err) != dbx.Doomed || e.ctx.Err() != nil {
			e.t.Fatalf("count %s: %v", table, err)
		}
	}
}

func (e *env) serverNow() time.Time {
	e.t.Helper()
	var now time.Time
	if err := e.db.Pool.QueryRow(e.ctx, "SELECT clock_timestamp()").Scan(&now); err != nil {
		e.t.Fatalf("now: %v", err)
	}
	return now
}

func ids(rows []claimed) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

// claimIDs returns the ids of rows a claim returned, in order.
func claimIDs(rows []db.ClaimRow) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

// tokens returns the lease tokens of rows, in order.
func tokens(rows ...claimed) []pgtype.UUID {
	out := make([]pgtype.UUID, len(rows))
	for i, r := range rows {
		out[i] = r.AcquiredToken
	}
	return out
}

// leasesOfRows returns the leases of rows, in order.
func leasesOfRows(rows ...claimed) []lease.Lease {
	out := make([]lease.Lease, len(rows))
	for i, r := range rows {
		out[i] = lease.Lease{ID: r.ID, Token: r.AcquiredToken}
	}
	return out
}

// sameLeases reports whether got and want hold the same leases in any
// order.
func sameLeases(got, want []lease.Lease) bool {
	return cmp.Equal(got, want, cmpopts.SortSlices(func(a, b lease.Lease) bool { return a.ID < b.ID }))
}

func token(t *testing.T, r claimed) pgtype.UUID {
	t.Helper()
	if !r.AcquiredToken.Valid {
		t.Fatalf("row %d has no lease token", r.ID)
	}
	return r.AcquiredToken
}

// newToken is a lease token no claim issued.
func newToken() pgtype.UUID { return pgtype.UUID{Bytes: uuid.New(), Valid: true} }

// claimRows converts ClaimQueue's rows of queue, which have Claim's
// columns but the queue.
func claimRows(rows []db.ClaimQueueRow, queue string) []db.ClaimRow {
	out := make([]db.ClaimRow, len(rows))
	for i, r := range rows {
		out[i] = db.ClaimRow{
			ID: r.ID, Queue: queue, Payload: r.Payload, Headers: r.Headers, OrderingKey: r.OrderingKey, TimerID: r.TimerID,
			CreatedAt: r.CreatedAt, AttemptsCount: r.AttemptsCount, DeliveriesCount: r.DeliveriesCount,
			SinceFirstAttemptSeconds: r.SinceFirstAttemptSeconds,
		}
	}
	return out
}

// newSleepID draws the id of a sleep record.
func newSleepID() pgtype.UUID { return newToken() }

// loginRole makes the role <schema>_<suffix>, which may log in and look
// into the test's schema and nothing else, dropped (with what it owns)
// when the test ends, and connects as it.
func (e *env) loginRole(suffix string) (name string, conn *pgx.Conn) {
	t := e.t
	t.Helper()
	name = e.db.Schema + "_" + suffix
	ident := pgx.Identifier{name}.Sanitize()
	e.exec("CREATE ROLE " + ident + " LOGIN")
	e.exec("GRANT USAGE ON SCHEMA " + pgx.Identifier{e.db.Schema}.Sanitize() + " TO " + ident)
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = e.db.Pool.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", name)
		if _, err := e.db.Pool.Exec(ctx, "DROP OWNED BY "+ident+"; DROP ROLE "+ident); err != nil {
			t.Errorf("drop role %s: %v", name, err)
		}
	})
	c, err := pgx.Connect(e.ctx, e.db.URLAs(t, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return name, c
}
