package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/outboxgen/outboxgen/internal/dbx"
	"github.com/outboxgen/outboxgen/internal/naming"
	"github.com/outboxgen/outboxgen/internal/pgtest"
)

// upTo returns the rendered migrations of ob numbered at most version.
func upTo(ob *Outbox, version int64) fstest.MapFS {
	out := fstest.MapFS{}
	for name, f := range ob.migrations {
		if v, _ := migrationVersion(name); v <= version {
			out[name] = f
		}
	}
	return out
}

// migrateTo applies the library's migrations numbered at most version.
func migrateTo(t *testing.T, ob *Outbox, version int64) {
	t.Helper()
	if err := ob.withProvider(t.Context(), upTo(ob, version), func(p *goose.Provider) error {
		_, err := p.Up(t.Context())
		return err
	}); err != nil {
		t.Fatalf("migrate to %d: %v", version, err)
	}
}

// applyWithOwnGoose applies fsys the way a consuming repository does:
// its own goose, its own version table.
func applyWithOwnGoose(t *testing.T, d *pgtest.DB, fsys fstest.MapFS) {
	t.Helper()
	sqlDB := stdlib.OpenDBFromPool(d.Pool)
	defer func(db *sql.DB) { _ = db.Close() }(sqlDB)
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, fsys,
		goose.WithTableName(d.Schema+".goose_db_version"), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(t.Context()); err != nil {
		t.Fatalf("goose up: %v", err)
	}
}

func newOutbox(t *testing.T, d *pgtest.DB) *Outbox {
	t.Helper()
	ob, err := New(d.Pool, &Config{Schema: d.Schema})
	if err != nil {
		t.Fatal(err)
	}
	return ob
}

// atVersion returns a test outbox migrated only up to version.
func atVersion(t *testing.T, version int64) *env {
	t.Helper()
	d := pgtest.New(t)
	ob := newOutbox(t, d)
	migrateTo(t, ob, version)
	return newEnv(t, d, ob)
}

// A repository that applied the files of `outboxgen migrations` with its
// own goose has an up-to-date outbox: Migrate does nothing, Check passes,
// and the status says every migration is applied.
func TestMigrateAfterAnotherToolAppliedTheMigrations(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	ob := newOutbox(t, d)
	applyWithOwnGoose(t, d, ob.migrations)

	if err := ob.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate on an outbox another tool migrated: %v", err)
	}
	if err := ob.Check(t.Context()); err != nil {
		t.Errorf("Check: %v", err)
	}
	if hasHistory(t, d) {
		t.Errorf("Migrate of an up-to-date outbox created the library's migration history")
	}
	st, err := ob.MigrationStatus(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if !s.Applied {
			t.Errorf("status calls %s pending", s.Name)
		}
	}
}

// A repository whose goose applied migrations 1-3 is brought up to date
// by the library's Migrate, which applies only what the schema lacks.
func TestMigrateUpgradesWhatAnotherToolStarted(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	ob := newOutbox(t, d)
	applyWithOwnGoose(t, d, upTo(ob, 3))
	var se *SchemaError
	if err := ob.Check(t.Context()); !errors.As(err, &se) || se.Version != 3 || se.Want != ob.LatestSchemaVersion() {
		t.Fatalf("Check at version 3: %v", err)
	}
	if err := ob.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if v, err := ob.SchemaVersion(t.Context()); err != nil || v != ob.LatestSchemaVersion() {
		t.Errorf("version after Migrate = %d, %v; want %d", v, err, ob.LatestSchemaVersion())
	}
}

// MigrationStatus only reads: on a schema nothing migrated it reports every
// migration pending and creates nothing.
func TestMigrationStatusChangesNothing(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	ob := newOutbox(t, d)
	st, err := ob.MigrationStatus(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != int(ob.LatestSchemaVersion()) {
		t.Fatalf("status lists %d migrations, want %d", len(st), ob.LatestSchemaVersion())
	}
	for i, s := range st {
		if s.Applied || s.Version != int64(i+1) {
			t.Errorf("status[%d] = %+v, want version %d pending", i, s, i+1)
		}
	}
	if got := pgtest.Catalog(t, d.Pool, d.Schema); len(got) != 0 {
		t.Errorf("MigrationStatus created %v", got)
	}
}

// hasHistory reports whether the library's migration history (goose's
// version table) exists in the test's schema.
func hasHistory(t *testing.T, d *pgtest.DB) bool {
	t.Helper()
	var ok bool
	if err := d.Pool.QueryRow(t.Context(), "SELECT to_regclass($1) IS NOT NULL",
		pgx.Identifier{d.Schema, "outbox_goose_version"}.Sanitize()).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// Check names the fix for a missing or older schema, and Run refuses to
// start on one instead of logging errors forever.
func TestCheckAndRunNameTheFixForAMissingOrOldSchema(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	ob := newOutbox(t, d)
	var se *SchemaError
	err := ob.Check(t.Context())
	if !errors.As(err, &se) || se.Version != 0 || !strings.Contains(err.Error(), "outboxgen migrate up") {
		t.Errorf("Check of a missing outbox: %v", err)
	}
	sub, err := NewSubscriber(ob, []string{"q"}, func(context.Context, *Message[string]) error { return nil }, fastConfig[string](nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Run(t.Context()); !errors.As(err, &se) {
		t.Errorf("Run on a missing outbox: %v, want a *SchemaError", err)
	}

	migrateTo(t, ob, 3)
	err = ob.Check(t.Context())
	want := fmt.Sprintf("outbox: %s.outbox is at schema version 3 and this library needs %d: run `outboxgen migrate up`", d.Schema, ob.LatestSchemaVersion())
	if !errors.As(err, &se) || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("Check at version 3: %v\nwant it to start %q", err, want)
	}
}

// Many processes starting at once on a brand-new schema all succeed.
func TestConcurrentMigrateOfANewSchema(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	schema := d.Schema + "_fresh"
	t.Cleanup(func() {
		_, _ = d.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	var wg sync.WaitGroup
	errs := make([]error, 24)
	start := make(chan struct{})
	for i := range errs {
		wg.Go(func() {
			ob, err := New(d.Pool, &Config{Schema: schema})
			<-start
			if err == nil {
				err = ob.Migrate(t.Context())
			}
			errs[i] = err
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Migrate %d: %v", i, err)
		}
	}
}

// The upgrade from schema 3 keeps rows in every state and gives each the
// lease state it had: live leases stay held (for 30 s from their claim),
// stale leases and due rows are claimable, scheduled rows wait.
func TestUpgradeFromSchema3KeepsRowsInEveryState(t *testing.T) {
	t.Parallel()
	e := atVersion(t, 3)
	d, ob := e.db, e.ob
	e.exec(`INSERT INTO outbox (queue, payload, headers, ordering_key, timer_id, next_attempt_at,
			attempts_count, deliveries_count, first_attempt_at, last_attempt_at, acquired_at, acquired_token) VALUES
		('q', 'due', '{"content-type":"text/plain; charset=utf-8"}', NULL, NULL, now(), 0, 0, NULL, NULL, NULL, NULL),
		('q', 'scheduled', NULL, NULL, 'timer-1', now() + interval '1 hour', 0, 0, NULL, NULL, NULL, NULL),
		('q', 'leased', NULL, 'k', NULL, now(), 0, 1, NULL, NULL, now(), gen_random_uuid()),
		('q', 'stale', NULL, NULL, NULL, now(), 0, 1, NULL, NULL, now() - interval '1 hour', gen_random_uuid()),
		('q', 'retrying', NULL, 'k2', NULL, now() - interval '1 second', 2, 2, now() - interval '1 minute', now(), NULL, NULL)`)
	e.exec(`INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason, last_error)
		VALUES (999, 'q', 'dead', 3, 3, now(), 'rejected', 'no')`)

	if err := ob.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate from 3: %v", err)
	}
	if err := ob.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	var leasedFor time.Duration
	if err := d.Pool.QueryRow(e.ctx, `SELECT lease_expires_at - acquired_at FROM outbox WHERE payload = 'leased'`).Scan(&leasedFor); err != nil {
		t.Fatal(err)
	}
	if leasedFor != 30*time.Second {
		t.Errorf("live lease expires %v after its claim, want 30s", leasedFor)
	}
	var claimed []string
	for _, r := range e.claim(100, "q") {
		claimed = append(claimed, string(r.Payload))
	}
	slices.Sort(claimed)
	if diff := cmp.Diff([]string{"due", "retrying", "stale"}, claimed); diff != "" {
		t.Errorf("claimable after the upgrade (-want +got):\n%s", diff)
	}
	if n := e.count("outbox"); n != 5 {
		t.Errorf("%d rows after the upgrade, want 5", n)
	}
	if n := e.count("outbox_dlq"); n != 1 {
		t.Errorf("%d dead letters after the upgrade, want 1", n)
	}

	// A subscriber of an older release claims without stamping the lease
	// expiry; schema 4 refuses that claim rather than lose the row.
	_, err := d.Pool.Exec(e.ctx, `UPDATE outbox SET acquired_token = gen_random_uuid(), acquired_at = now() WHERE payload = 'scheduled'`)
	if dbx.SQLState(err) != "23514" {
		t.Errorf("an old-style claim under schema 4: %v, want a check violation", err)
	}

	// And back down to 3 and up again, rows still there.
	if err := ob.MigrateDownTo(t.Context(), 3); err != nil {
		t.Fatalf("down to 3: %v", err)
	}
	if v, _ := ob.SchemaVersion(t.Context()); v != 3 {
		t.Errorf("version after down to 3 = %d", v)
	}
	if err := ob.Migrate(t.Context()); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if n := e.count("outbox"); n != 5 {
		t.Errorf("%d rows after down and up, want 5", n)
	}
}

// No two outboxes share a channel: outbox foo's scheduled channel is not
// outbox foo_scheduled's due channel, in any schema.
func TestChannelsOfTwoOutboxesNeverCollide(t *testing.T) {
	t.Parallel()
	seen := map[string]string{}
	for _, c := range []naming.Names{
		{Schema: "public", Table: "foo"}, {Schema: "public", Table: "foo_scheduled"}, {Schema: "public", Table: "foo_scheduled_scheduled"},
		{Schema: "foo", Table: "scheduled"}, {Schema: "foo", Table: "bar"}, {Schema: "foo", Table: "bar_scheduled"}, {Schema: "foo_bar", Table: "baz"}, {Schema: "foo", Table: "bar_baz"},
	} {
		who := c.Schema + "." + c.Table
		for _, ch := range []string{c.Channel(), c.ScheduledChannel()} {
			if other, ok := seen[ch]; ok {
				t.Errorf("channel %q is both %s's and %s's", ch, other, who)
			}
			seen[ch] = who
		}
	}
}

// Upgrading from schema 4 orders the keys that already have rows: each
// key's lowest row and any leased row stay claimable, every other row of a
// key waits behind them, and unkeyed rows are untouched.
func TestUpgradeFromSchema4OrdersKeyedRowsInEveryState(t *testing.T) {
	t.Parallel()
	e := atVersion(t, 4)
	d, ob := e.db, e.ob
	e.exec(`INSERT INTO outbox (queue, payload, ordering_key, next_attempt_at, attempts_count, deliveries_count,
			first_attempt_at, acquired_at, acquired_token, lease_expires_at) VALUES
		('q', 'a1 leased',     'a', now(), 0, 1, NULL, now(), gen_random_uuid(), now() + interval '1 minute'),
		('q', 'a2 due',        'a', now(), 0, 0, NULL, NULL, NULL, NULL),
		('q', 'a3 scheduled',  'a', now() + interval '1 hour', 0, 0, NULL, NULL, NULL, NULL),
		('q', 'b1 retrying',   'b', now() + interval '1 hour', 1, 1, now(), NULL, NULL, NULL),
		('q', 'b2 due',        'b', now(), 0, 0, NULL, NULL, NULL, NULL),
		('q', 'c1 due',        'c', now(), 0, 0, NULL, NULL, NULL, NULL),
		('q', 'c2 leased',     'c', now(), 0, 1, NULL, now(), gen_random_uuid(), now() + interval '1 minute'),
		('q', 'c3 due',        'c', now(), 0, 0, NULL, NULL, NULL, NULL),
		('q', 'd1 scheduled',  'd', now() + interval '1 hour', 0, 0, NULL, NULL, NULL, NULL),
		('q', 'd2 due',        'd', now(), 0, 0, NULL, NULL, NULL, NULL),
		('q', 'e1 expired',    'e', now(), 0, 1, NULL, now() - interval '2 minutes', gen_random_uuid(), now() - interval '1 minute'),
		('q', 'e2 due',        'e', now(), 0, 0, NULL, NULL, NULL, NULL),
		('q', 'u due',         NULL, now(), 0, 0, NULL, NULL, NULL, NULL),
		('r', 'a1 other queue', 'a', now(), 0, 0, NULL, NULL, NULL, NULL)`)
	e.exec(`INSERT INTO outbox_dlq (id, queue, payload, ordering_key, deliveries_count, attempts_count, created_at, failure_reason)
		VALUES (999, 'q', 'dead', 'a', 3, 3, now(), 'rejected')`)

	blocked := func() []string {
		t.Helper()
		rows, err := d.Pool.Query(e.ctx, `SELECT convert_from(payload, 'UTF8') FROM outbox WHERE blocked ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	wantBlocked := []string{"a2 due", "a3 scheduled", "b2 due", "c3 due", "d2 due", "e2 due"}
	upAndBack(t, ob, 4, func() {
		if v, _ := ob.SchemaVersion(t.Context()); v != 4 {
			t.Errorf("version after down to 4 = %d", v)
		}
	}, func(step string) {
		if diff := cmp.Diff(wantBlocked, blocked()); diff != "" {
			t.Errorf("%s: blocked rows (-want +got):\n%s", step, diff)
		}
		if n := e.count("outbox"); n != 14 {
			t.Errorf("%s: %d rows, want 14", step, n)
		}
	})

	payloads := func(rows []claimed) []string {
		out := make([]string, len(rows))
		for i, r := range rows {
			out[i] = string(r.Payload)
		}
		slices.Sort(out)
		return out
	}
	first := e.claim(100, "q", "r")
	if diff := cmp.Diff([]string{"a1 other queue", "c1 due", "e1 expired", "u due"}, payloads(first)); diff != "" {
		t.Errorf("claimable after the upgrade (-want +got):\n%s", diff)
	}
	// The rows leased before the upgrade finish under their old tokens,
	// and hand their keys on.
	e.exec(`DELETE FROM outbox WHERE convert_from(payload, 'UTF8') IN ('a1 leased', 'c2 leased')`)
	e.ack(first...)
	if diff := cmp.Diff([]string{"a2 due", "c3 due", "e2 due"}, payloads(e.claim(100, "q"))); diff != "" {
		t.Errorf("claimable once the old leases ended (-want +got):\n%s", diff)
	}
	if n := e.count("outbox_dlq"); n != 1 {
		t.Errorf("%d dead letters, want 1", n)
	}

	// A subscriber of an older release claims without knowing blocked
	// rows; schema 5 refuses a claim that reaches one.
	_, err := d.Pool.Exec(e.ctx, `UPDATE outbox SET acquired_token = gen_random_uuid(), acquired_at = now(),
		lease_expires_at = now() + interval '1 minute' WHERE blocked`)
	if dbx.SQLState(err) != "23514" {
		t.Errorf("an old-style claim of blocked rows under schema 5: %v, want a check violation", err)
	}
}

// Migration 6 leaves one lease check whichever form of schema 5 it finds:
// the one the migrations make (one check for the whole lease since
// migration 4) or the one an earlier migration 4 made (separate checks
// for the token, the expiry and last_error). Rolling back to 5 leaves the
// one check.
func TestUpgradeFromEitherFormOfSchema5FoldsTheLeaseChecks(t *testing.T) {
	t.Parallel()
	checks := func(t *testing.T, d *pgtest.DB) []string {
		t.Helper()
		rows, err := d.Pool.Query(t.Context(), `SELECT conname::text FROM pg_constraint
			WHERE conrelid = 'outbox'::regclass AND contype = 'c' ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	folded := []string{"outbox_blocked_chk", "outbox_headers_chk", "outbox_lease_state_chk", "outbox_queue_chk"}
	separate := []string{"outbox_blocked_chk", "outbox_headers_chk", "outbox_last_error_chk", "outbox_lease_chk", "outbox_lease_expiry_chk", "outbox_queue_chk"}
	for _, form := range [][]string{folded, separate} {
		t.Run(fmt.Sprintf("%d checks", len(form)), func(t *testing.T) {
			t.Parallel()
			e := atVersion(t, 5)
			d, ob := e.db, e.ob
			if len(form) == len(separate) {
				if _, err := d.Pool.Exec(t.Context(), `ALTER TABLE outbox
					DROP CONSTRAINT outbox_lease_state_chk,
					ADD CONSTRAINT outbox_lease_chk CHECK ((acquired_token IS NULL) = (acquired_at IS NULL)),
					ADD CONSTRAINT outbox_lease_expiry_chk CHECK ((acquired_token IS NULL) = (lease_expires_at IS NULL)),
					ADD CONSTRAINT outbox_last_error_chk CHECK (octet_length(last_error) <= 8192)`); err != nil {
					t.Fatal(err)
				}
			}
			if diff := cmp.Diff(form, checks(t, d)); diff != "" {
				t.Fatalf("checks of schema 5 (-want +got):\n%s", diff)
			}
			if err := ob.Migrate(t.Context()); err != nil {
				t.Fatalf("Migrate from 5: %v", err)
			}
			if diff := cmp.Diff(folded, checks(t, d)); diff != "" {
				t.Errorf("checks after the upgrade (-want +got):\n%s", diff)
			}
			if err := ob.MigrateDownTo(t.Context(), 5); err != nil {
				t.Fatalf("down to 5: %v", err)
			}
			if diff := cmp.Diff(folded, checks(t, d)); diff != "" {
				t.Errorf("checks after rolling back to 5 (-want +got):\n%s", diff)
			}
		})
	}
}

// Upgrading from schema 5 leaves rows in every state as they were; from
// then on writers notify only while a subscriber sleeps, and down at 5
// again they notify on every write.
func TestUpgradeFromSchema5KeepsRowsInEveryState(t *testing.T) {
	t.Parallel()
	e := atVersion(t, 5)
	ob := e.ob
	state := e.seedEveryState()
	before := state()
	l := listen(t, e.db.URL, ob.Channel())
	// notified publishes a row of q and reports whether it notified.
	notified := func() bool {
		t.Helper()
		e.publish("q")
		e.exec(`NOTIFY ` + pgx.Identifier{ob.Channel()}.Sanitize() + `, 'sentinel'`)
		got := len(l.until("sentinel")) > 0
		e.exec(`DELETE FROM outbox WHERE id = (SELECT max(id) FROM outbox)`)
		return got
	}

	upAndBack(t, ob, 5, func() {
		if diff := cmp.Diff(before, state()); diff != "" {
			t.Errorf("rows at 5 again (-want +got):\n%s", diff)
		}
		if !notified() {
			t.Errorf("schema 5 did not notify")
		}
	}, func(step string) {
		if diff := cmp.Diff(before, state()); diff != "" {
			t.Errorf("%s: rows (-want +got):\n%s", step, diff)
		}
		if notified() {
			t.Errorf("%s: notified with nobody asleep", step)
		}
		id := e.sleepOn("q")
		if !notified() {
			t.Errorf("%s: did not notify a sleeping subscriber", step)
		}
		if err := e.q.Leave(e.ctx, id); err != nil {
			t.Fatal(err)
		}
	})

	var claimed []string
	for _, r := range e.claim(100, "q") {
		claimed = append(claimed, string(r.Payload))
	}
	slices.Sort(claimed)
	if diff := cmp.Diff([]string{"due", "expired", "k head", "retrying"}, claimed); diff != "" {
		t.Errorf("claimable after the upgrade (-want +got):\n%s", diff)
	}
}

// seedEveryState writes rows of queue q in every state a row can be in
// since schema 5, a recorded hand-over and a dead letter, and returns a
// function that describes them.
func (e *env) seedEveryState() (state func() []string) {
	t := e.t
	e.exec(`INSERT INTO outbox (queue, payload, ordering_key, next_attempt_at, attempts_count, deliveries_count,
			first_attempt_at, acquired_at, acquired_token, lease_expires_at) VALUES
		('q', 'leased',    NULL, now(), 0, 1, NULL, now(), gen_random_uuid(), now() + interval '1 minute'),
		('q', 'expired',   NULL, now(), 0, 1, NULL, now() - interval '2 minutes', gen_random_uuid(), now() - interval '1 minute'),
		('q', 'due',       NULL, now(), 0, 0, NULL, NULL, NULL, NULL),
		('q', 'scheduled', NULL, now() + interval '1 hour', 0, 0, NULL, NULL, NULL, NULL),
		('q', 'retrying',  NULL, now() - interval '1 second', 2, 2, now() - interval '1 minute', NULL, NULL, NULL),
		('q', 'k head',    'k', now(), 0, 0, NULL, NULL, NULL, NULL),
		('q', 'k next',    'k', now(), 0, 0, NULL, NULL, NULL, NULL)`)
	e.exec(`INSERT INTO outbox_handoff (queue, ordering_key) VALUES ('q', 'k')`)
	e.exec(`INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason)
		VALUES (999, 'q', 'dead', 3, 3, now(), 'rejected')`)
	state = func() []string {
		t.Helper()
		rows, err := e.db.Pool.Query(e.ctx, `SELECT format('%s blocked=%s leased=%s due=%s', convert_from(payload, 'UTF8'),
				blocked, acquired_token IS NOT NULL, next_attempt_at <= now())
			FROM outbox ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return append(got, fmt.Sprintf("dead letters=%d hand-overs=%d", e.count("outbox_dlq"), e.count("outbox_handoff")))
	}
	return state
}

// Upgrading from schema 6 leaves rows in every state as they were, and
// so does going down to 6 and up again; a subscriber then claims by lock
// and handles every row that is due, expired leases and a key's rows in
// order included.
func TestUpgradeFromSchema6KeepsRowsInEveryState(t *testing.T) {
	t.Parallel()
	e := atVersion(t, 6)
	ob := e.ob
	state := e.seedEveryState()
	before := state()
	upAndBack(t, ob, 6, func() {
		if diff := cmp.Diff(before, state()); diff != "" {
			t.Errorf("rows at 6 again (-want +got):\n%s", diff)
		}
	}, func(step string) {
		if diff := cmp.Diff(before, state()); diff != "" {
			t.Errorf("%s: rows (-want +got):\n%s", step, diff)
		}
	})
	e.handlesEveryDueRow()
}

// Upgrading from schema 7 keeps rows in every state, a record of an
// aborted locked claim and sleep records in every state (holding, woken,
// lapsed); going down to 7 and up again does too. The horizon starts at
// the records that hold, and follows records written as schema 7's
// subscribers write them: a writer notifies while one holds and not after
// it ends.
func TestUpgradeFromSchema7KeepsRowsAndSleepRecords(t *testing.T) {
	t.Parallel()
	e := atVersion(t, 7)
	rows := e.seedEveryState()
	e.exec(`INSERT INTO outbox_locks (xid, ids, until) SELECT $1, int8multirange(int8range(min(id), max(id), '[]')), now() - interval '1 minute' FROM outbox`,
		e.abortedXid())
	holding := newSleepID()
	e.exec(`INSERT INTO outbox_sleepers (id, queues, until) VALUES
		($1, '{q,n}', now() + interval '1 hour'),
		(gen_random_uuid(), '{q}', '-infinity'),
		(gen_random_uuid(), '{q}', now() - interval '1 minute')`, holding)
	state := func() []string {
		t.Helper()
		var sleepers string
		if err := e.db.Pool.QueryRow(e.ctx, `SELECT string_agg(format('%s %s', queues,
				CASE WHEN until = '-infinity' THEN 'woken' WHEN until > now() THEN 'holds' ELSE 'lapsed' END), ', ' ORDER BY until)
			FROM outbox_sleepers`).Scan(&sleepers); err != nil {
			t.Fatal(err)
		}
		return append(rows(), fmt.Sprintf("claim records=%d", e.count("outbox_locks")), "sleepers: "+sleepers)
	}
	before := state()
	horizonAt := func(step string) {
		t.Helper()
		if got, want := e.horizon(); got != want || want == 0 {
			t.Errorf("%s: horizon %d, want %d", step, got, want)
		}
	}
	upAndBack(t, e.ob, 7, func() {
		if diff := cmp.Diff(before, state()); diff != "" {
			t.Errorf("at 7 again (-want +got):\n%s", diff)
		}
		var gone bool
		if err := e.db.Pool.QueryRow(e.ctx, "SELECT to_regclass('outbox_sleep_horizon') IS NULL").Scan(&gone); err != nil || !gone {
			t.Errorf("at 7 again the horizon is left (%v)", err)
		}
	}, func(step string) {
		if diff := cmp.Diff(before, state()); diff != "" {
			t.Errorf("%s (-want +got):\n%s", step, diff)
		}
		horizonAt(step)
	})

	l := listen(t, e.db.URL, e.ob.Channel())
	e.sleepOn("sentinel")
	e.exec("INSERT INTO outbox (queue, payload) VALUES ('n', 'x')")
	e.publish("sentinel")
	if diff := cmp.Diff([]string{e.ob.Channel() + ":n"}, l.until("sentinel")); diff != "" {
		t.Errorf("a record written at 7 (-want +got):\n%s", diff)
	}
	// Schema 7's Wake; the sentinel's record still holds.
	e.exec("UPDATE outbox_sleepers AS s SET until = '-infinity' WHERE s.id = $1", holding)
	horizonAt("the record at 7 woke")
	e.exec("INSERT INTO outbox (queue, payload) VALUES ('n', 'x')")
	e.publish("sentinel")
	if got := l.until("sentinel"); len(got) != 0 {
		t.Errorf("after the record at 7 woke: %v", got)
	}
	e.handlesEveryDueRow()
}

// handlesEveryDueRow checks that a subscriber of queue q handles every
// due row seedEveryState wrote, expired leases and a key's rows in order
// included.
func (e *env) handlesEveryDueRow(more ...string) {
	t := e.t
	t.Helper()
	var (
		mu      sync.Mutex
		handled []string
	)
	s := startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[[]byte]) error {
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, string(m.Payload))
		return nil
	}, fastConfig[[]byte](nil))
	want := append([]string{"due", "expired", "k head", "k next", "retrying"}, more...)
	slices.Sort(want)
	eventually(t, "every due row handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(handled) >= len(want) })
	if err := s.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if i, j := slices.Index(handled, "k head"), slices.Index(handled, "k next"); i > j {
		t.Errorf("key k handled out of order: %v", handled)
	}
	slices.Sort(handled)
	if diff := cmp.Diff(want, handled); diff != "" {
		t.Errorf("handled after the upgrade (-want +got):\n%s", diff)
	}
}

// upAndBack upgrades ob, at schema from, to the latest schema, then goes
// down to from and up again. After the way down it calls atFrom; after
// each way up it checks the schema and calls upgraded with the step's
// name.
func upAndBack(t *testing.T, ob *Outbox, from int64, atFrom func(), upgraded func(step string)) {
	t.Helper()
	for _, step := range []string{"upgrade", fmt.Sprintf("down to %d and up again", from)} {
		if step != "upgrade" {
			if err := ob.MigrateDownTo(t.Context(), from); err != nil {
				t.Fatalf("down to %d: %v", from, err)
			}
			atFrom()
		}
		if err := ob.Migrate(t.Context()); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if err := ob.Check(t.Context()); err != nil {
			t.Fatal(err)
		}
		upgraded(step)
	}
}

// Upgrading from schema 8 keeps rows in every state, a record of an
// aborted locked claim, sleep records and the horizon; so does going down
// to 8 and up again. At 9 the keys' locks are seeded with the outbox's
// secret, and at 8 again they are schema 8's.
func TestUpgradeFromSchema8KeepsRowsAndSleepRecords(t *testing.T) {
	t.Parallel()
	e := atVersion(t, 8)
	rows := e.seedEveryState()
	e.exec(`INSERT INTO outbox_locks (xid, ids, until) SELECT $1, int8multirange(int8range(min(id), max(id), '[]')), now() - interval '1 minute' FROM outbox`,
		e.abortedXid())
	e.exec(`INSERT INTO outbox_sleepers (id, queues, until) VALUES
		(gen_random_uuid(), '{q,n}', now() + interval '1 hour'),
		(gen_random_uuid(), '{q}', '-infinity'),
		(gen_random_uuid(), '{q}', now() - interval '1 minute')`)
	state := func() []string {
		t.Helper()
		var sleepers string
		if err := e.db.Pool.QueryRow(e.ctx, `SELECT string_agg(format('%s %s', queues,
				CASE WHEN until = '-infinity' THEN 'woken' WHEN until > now() THEN 'holds' ELSE 'lapsed' END), ', ' ORDER BY until)
			FROM outbox_sleepers`).Scan(&sleepers); err != nil {
			t.Fatal(err)
		}
		return append(rows(), fmt.Sprintf("claim records=%d", e.count("outbox_locks")), "sleepers: "+sleepers)
	}
	keyLock := func() (lock int64, seeded bool) {
		t.Helper()
		if err := e.db.Pool.QueryRow(e.ctx, `SELECT outbox_key_lock('q', 'k'),
				to_regclass('outbox_lock_seed') IS NOT NULL`).Scan(&lock, &seeded); err != nil {
			t.Fatal(err)
		}
		return lock, seeded
	}
	at8, _ := keyLock()
	before := state()
	upAndBack(t, e.ob, 8, func() {
		if diff := cmp.Diff(before, state()); diff != "" {
			t.Errorf("at 8 again (-want +got):\n%s", diff)
		}
		if lock, seeded := keyLock(); lock != at8 || seeded {
			t.Errorf("at 8 again: key lock %d (seed table %v), want schema 8's %d", lock, seeded, at8)
		}
	}, func(step string) {
		if diff := cmp.Diff(before, state()); diff != "" {
			t.Errorf("%s (-want +got):\n%s", step, diff)
		}
		if got, want := e.horizon(); got != want || want == 0 {
			t.Errorf("%s: horizon %d, want %d", step, got, want)
		}
		if lock, seeded := keyLock(); lock == at8 || !seeded {
			t.Errorf("%s: key lock %d (seed table %v), schema 8's was %d", step, lock, seeded, at8)
		}
	})
	e.handlesEveryDueRow()
}

// Upgrading from schema 9 keeps rows in every state, recorded hand-overs
// and sleep records; so does going down to 9 and up again. Schema 10
// changes only the key triggers and their functions: at 9 again a
// statement's rows of one key still wait behind its first, and after the
// upgrade a subscriber handles every due row, the key's in order.
func TestUpgradeFromSchema9KeepsRowsAndHandOvers(t *testing.T) {
	t.Parallel()
	e := atVersion(t, 9)
	rows := e.seedEveryState()
	e.exec(`INSERT INTO outbox_sleepers (id, queues, until) VALUES
		(gen_random_uuid(), '{q,n}', now() + interval '1 hour'),
		(gen_random_uuid(), '{q}', now() - interval '1 minute')`)
	state := func() []string {
		t.Helper()
		return append(rows(), fmt.Sprintf("sleepers=%d", e.count("outbox_sleepers")))
	}
	before := state()
	upAndBack(t, e.ob, 9, func() {
		if diff := cmp.Diff(before, state()); diff != "" {
			t.Errorf("at 9 again (-want +got):\n%s", diff)
		}
		tx, err := e.db.Pool.Begin(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		r, err := tx.Query(e.ctx, `INSERT INTO outbox (queue, payload, ordering_key) VALUES ('n', 'x', 'k9'), ('n', 'y', 'k9') RETURNING blocked`)
		if err != nil {
			t.Fatal(err)
		}
		blocked, err := pgx.CollectRows(r, pgx.RowTo[bool])
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]bool{false, true}, blocked); diff != "" {
			t.Errorf("at 9 again, a statement's rows of one key (-want +got):\n%s", diff)
		}
	}, func(step string) {
		if diff := cmp.Diff(before, state()); diff != "" {
			t.Errorf("%s (-want +got):\n%s", step, diff)
		}
	})
	e.handlesEveryDueRow()
}

// Upgrading from schema 10 keeps rows in every state, a record of an
// aborted locked claim, recorded hand-overs and sleep records; so does
// going down to 10 and up again. At 11 PUBLIC executes none of the
// owner's functions but the schema's version, nor reads the sleep
// horizon, and a keyed row is decided by its trigger whatever the
// writer's settings say; at 10 again PUBLIC has them back and schema
// 10's key trigger trusts outboxgen.insert_key again.
func TestUpgradeFromSchema10KeepsRowsAndTakesTheOwnersFunctionsFromPublic(t *testing.T) {
	t.Parallel()
	e := atVersion(t, 10)
	rows := e.seedEveryState()
	e.exec(`INSERT INTO outbox_locks (xid, ids, until) SELECT $1, int8multirange(int8range(min(id), max(id), '[]')), now() - interval '1 minute' FROM outbox`,
		e.abortedXid())
	e.exec(`INSERT INTO outbox_sleepers (id, queues, until) VALUES
		(gen_random_uuid(), '{q,n}', now() + interval '1 hour'),
		(gen_random_uuid(), '{q}', '-infinity'),
		(gen_random_uuid(), '{q}', now() - interval '1 minute')`)
	state := func() []string {
		t.Helper()
		return append(rows(), fmt.Sprintf("claim records=%d sleepers=%d", e.count("outbox_locks"), e.count("outbox_sleepers")))
	}
	// public says what PUBLIC may execute and read of the outbox's, and
	// whether a row of a key without rows that arrives blocked, after
	// the writer set outboxgen.insert_key to name its key, stays blocked.
	public := func() string {
		t.Helper()
		var fns []string
		var horizon bool
		if err := e.db.Pool.QueryRow(e.ctx, `SELECT coalesce(array_agg(p.proname ORDER BY p.proname)
				FILTER (WHERE has_function_privilege('public', p.oid, 'EXECUTE')), '{}'),
			has_sequence_privilege('public', 'outbox_sleep_horizon', 'SELECT')
			FROM pg_proc AS p WHERE p.pronamespace = $1::regnamespace`, e.db.Schema).Scan(&fns, &horizon); err != nil {
			t.Fatal(err)
		}
		tx := e.fixtureTx()
		defer func() { _ = tx.Rollback(context.Background()) }()
		var id int64
		if err := tx.QueryRow(e.ctx, `WITH s AS (SELECT set_config('outboxgen.insert_key', '1' || E'\x1f' || 'n' || E'\x1f' || 'lonely', true))
			INSERT INTO outbox (queue, payload, ordering_key, blocked) SELECT 'n', 'x', 'lonely', true FROM s RETURNING id`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		var stranded bool
		if err := tx.QueryRow(e.ctx, "SELECT blocked FROM outbox WHERE id = $1", id).Scan(&stranded); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("PUBLIC executes %v, reads the horizon: %v; a forged key stranded: %v", fns, horizon, stranded)
	}
	at10 := public()
	if !strings.Contains(at10, "outbox_key_insert") || !strings.HasSuffix(at10, "stranded: true") {
		t.Fatalf("at 10: %s", at10)
	}
	before := state()
	upAndBack(t, e.ob, 10, func() {
		if diff := cmp.Diff(before, state()); diff != "" {
			t.Errorf("at 10 again (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(at10, public()); diff != "" {
			t.Errorf("at 10 again (-want +got):\n%s", diff)
		}
	}, func(step string) {
		if diff := cmp.Diff(before, state()); diff != "" {
			t.Errorf("%s (-want +got):\n%s", step, diff)
		}
		if diff := cmp.Diff("PUBLIC executes [outbox_schema_version], reads the horizon: false; a forged key stranded: false", public()); diff != "" {
			t.Errorf("%s (-want +got):\n%s", step, diff)
		}
	})
	e.handlesEveryDueRow()
}

// Upgrading from schema 11 keeps rows in every state, a record of an
// aborted locked claim, a recorded hand-over (which keeps no id to look
// past) and sleep records; so does going down to 11 and up again. At 12
// a head deleted where the deleting transaction cannot hand its key on
// records the head's id, and a subscriber's hand-over completes records
// with and without one, the key's rows in order.
func TestUpgradeFromSchema11KeepsRowsAndHandOversWithoutAnIdToLookPast(t *testing.T) {
	t.Parallel()
	e := atVersion(t, 11)
	state := e.seedEveryStateAndRecords()
	before := state()
	upAndBack(t, e.ob, 11, func() {
		if diff := cmp.Diff(before, state()); diff != "" {
			t.Errorf("at 11 again (-want +got):\n%s", diff)
		}
	}, func(step string) {
		if diff := cmp.Diff(before, state()); diff != "" {
			t.Errorf("%s (-want +got):\n%s", step, diff)
		}
	})

	// Key m of queue n: a head and two rows behind it. The head is
	// deleted at REPEATABLE READ, whose snapshot may predate rows of the
	// key, so the hand-over is recorded with the head's id.
	var ids []int64
	for _, p := range []string{"m0", "m1", "m2"} {
		var id int64
		if err := e.db.Pool.QueryRow(e.ctx, `INSERT INTO outbox (queue, payload, ordering_key) VALUES ('n', $1, 'm') RETURNING id`,
			[]byte(p)).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	tx, err := e.db.Pool.BeginTx(e.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(e.ctx, "DELETE FROM outbox WHERE id = $1", ids[0]); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	records := func() []string {
		t.Helper()
		r, err := e.db.Pool.Query(e.ctx, `SELECT format('%s/%s after %s', queue, ordering_key, coalesce(after_id::text, 'none'))
			FROM outbox_handoff ORDER BY queue, ordering_key`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(r, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if diff := cmp.Diff([]string{fmt.Sprintf("n/m after %d", ids[0]), "q/k after none"}, records()); diff != "" {
		t.Errorf("recorded hand-overs (-want +got):\n%s", diff)
	}
	if _, err := e.handOff("n"); err != nil {
		t.Fatal(err)
	}
	var blocked []bool
	r, err := e.db.Pool.Query(e.ctx, "SELECT blocked FROM outbox WHERE queue = 'n' ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	if blocked, err = pgx.CollectRows(r, pgx.RowTo[bool]); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]bool{false, true}, blocked); diff != "" {
		t.Errorf("key m's rows after its hand-over (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"q/k after none"}, records()); diff != "" {
		t.Errorf("recorded hand-overs after queue n's (-want +got):\n%s", diff)
	}
	e.handlesEveryDueRow()
}

// Upgrading from schema 12 keeps rows in every state, a record of an
// aborted locked claim and sleep records, while a claim by lock holds a
// row: the ring is made beside the outbox table without waiting for the
// table's writers or claims. Going down to 12 and up again keeps them too.
func TestUpgradeFromSchema12AddsTheRingWhileClaimsHoldRows(t *testing.T) {
	t.Parallel()
	e := atVersion(t, 12)
	state := e.seedEveryStateAndRecords()
	before := state()

	// A claim by lock of schema 12's subscribers, in flight: its
	// transaction holds the due row's lock, and a keyed writer's.
	claim, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = claim.Rollback(context.Background()) }()
	if _, err := claim.Exec(e.ctx, `SELECT id FROM outbox WHERE payload = 'due' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	if _, err := claim.Exec(e.ctx, `INSERT INTO outbox (queue, payload, ordering_key) VALUES ('n', 'open', 'k')`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
	defer cancel()
	if err := e.ob.Migrate(ctx); err != nil {
		t.Fatalf("upgrade while a claim holds a row: %v", err)
	}
	if err := claim.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, state()); diff != "" {
		t.Errorf("upgraded (-want +got):\n%s", diff)
	}
	upAndBack(t, e.ob, 12, func() {
		if diff := cmp.Diff(before, state()); diff != "" {
			t.Errorf("at 12 again (-want +got):\n%s", diff)
		}
		if ringExists(t, e) {
			t.Errorf("at 12 again, the ring is still there")
		}
	}, func(step string) {
		if diff := cmp.Diff(before, state()); diff != "" {
			t.Errorf("%s (-want +got):\n%s", step, diff)
		}
		if !ringExists(t, e) {
			t.Errorf("%s: no ring", step)
		}
	})
	e.handlesEveryDueRow()
}

// ringExists reports whether e's outbox has the ring.
func ringExists(t *testing.T, e *env) bool {
	t.Helper()
	var ok bool
	if err := e.db.Pool.QueryRow(e.ctx, "SELECT to_regclass('outbox_ring') IS NOT NULL").Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// Going down from schema 13 moves into the outbox table every row of the
// ring that no lane consumed, with its id, and leaves out those a
// subscriber handled; up again, each of them is delivered once, from the
// table, a key's rows in order, and the scheduled one is kept for later.
func TestDownFromSchema13MovesTheRingsUnreadRowsIntoTheTable(t *testing.T) {
	t.Parallel()
	e := setupMigrations(t)
	write := func(rows string) []int64 {
		t.Helper()
		return pgtest.IDs(t, e.db.Pool, `INSERT INTO outbox_ring (queue, payload, ordering_key, next_attempt_at)
			SELECT 'q', convert_to(r.p, 'UTF8'), r.k, now() + r.later FROM (VALUES `+rows+`) AS r(p, k, later) ORDER BY r.p RETURNING id`)
	}
	// Handled at 13: their lanes' progress consumes them.
	write(`('a1', NULL, interval '0'), ('a2', NULL, interval '0'), ('a3', 'j', interval '0'), ('a4', 'j', interval '0')`)
	var (
		mu      sync.Mutex
		handled []string
	)
	handle := func(_ context.Context, m *Message[[]byte]) error {
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, string(m.Payload))
		return nil
	}
	s := startSub(t, e.ob, []string{"q"}, handle, fastConfig[[]byte](nil))
	eventually(t, "the first rows handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(handled) >= 4 })
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	// Written after: no lane has read them.
	unread := write(`('b1', NULL, interval '0'), ('b2', NULL, interval '0'), ('b3', 'j', interval '0'), ('b4', 'j', interval '0'), ('b5', NULL, interval '1 hour')`)

	if err := e.ob.MigrateDownTo(e.ctx, 12); err != nil {
		t.Fatalf("down to 12: %v", err)
	}
	if ringExists(t, e) {
		t.Fatal("the ring is still there at 12")
	}
	r, err := e.db.Pool.Query(e.ctx, `SELECT id FROM outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(r, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(unread, ids); diff != "" {
		t.Errorf("the outbox table at 12 (-the ring's unread rows +got):\n%s", diff)
	}

	if err := e.ob.Migrate(e.ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	handled = nil
	mu.Unlock()
	s = startSub(t, e.ob, []string{"q"}, handle, fastConfig[[]byte](nil))
	eventually(t, "the moved rows handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(handled) >= 4 })
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if i, j := slices.Index(handled, "b3"), slices.Index(handled, "b4"); i > j {
		t.Errorf("key j handled out of order: %v", handled)
	}
	slices.Sort(handled)
	if diff := cmp.Diff([]string{"b1", "b2", "b3", "b4"}, handled); diff != "" {
		t.Errorf("handled at 12 (-want +got):\n%s", diff)
	}
	if n := e.count("outbox"); n != 1 {
		t.Errorf("%d rows left in the outbox table, want the scheduled one", n)
	}
}

// seedEveryStateAndRecords is seedEveryState with a record of an aborted
// claim by lock and two sleep records (one holding, one woken), counted
// by the state it returns.
func (e *env) seedEveryStateAndRecords() (state func() []string) {
	t := e.t
	rows := e.seedEveryState()
	e.exec(`INSERT INTO outbox_locks (xid, ids, until) SELECT $1, int8multirange(int8range(min(id), max(id), '[]')), now() - interval '1 minute' FROM outbox`,
		e.abortedXid())
	e.exec(`INSERT INTO outbox_sleepers (id, queues, until) VALUES
		(gen_random_uuid(), '{q,n}', now() + interval '1 hour'),
		(gen_random_uuid(), '{q}', '-infinity')`)
	return func() []string {
		t.Helper()
		return append(rows(), fmt.Sprintf("claim records=%d sleepers=%d", e.count("outbox_locks"), e.count("outbox_sleepers")))
	}
}
