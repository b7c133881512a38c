package main

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// stripHeader drops the first line of a command's output when it is the
// line that names the outbox and its database.
func stripHeader(s string) string {
	first, rest, _ := strings.Cut(s, "\n")
	if strings.HasPrefix(first, "outbox ") && strings.Contains(first, " in ") && strings.Contains(first, "@") {
		return rest
	}
	return s
}

type result struct {
	code           int
	stdout, stderr string
}

func runCLI(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(t.Context(), args, &out, &errOut, func(k string) string { return env[k] })
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

// embeddedMigrations returns the names of the library's migrations, in
// order.
func embeddedMigrations(t *testing.T) []string {
	t.Helper()
	fsys, err := outbox.Migrations(nil)
	if err != nil {
		t.Fatal(err)
	}
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil || len(names) < 2 {
		t.Fatalf("embedded migrations %v: %v", names, err)
	}
	return names
}

func TestMigrateUpDownUp(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := map[string]string{"DATABASE_URL": pgtest.URL(t)}
	tables := func() []string {
		rows, err := d.Pool.Query(t.Context(),
			"SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY 1", d.Schema)
		if err != nil {
			t.Fatal(err)
		}
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	all := []string{"events", "events_dlq", "events_goose_version", "events_handoff", "events_locks", "events_pauses", "events_ring", "events_ring_acks",
		"events_ring_claims", "events_ring_lanes", "events_ring_p0", "events_ring_p1", "events_ring_p2", "events_ring_p3",
		"events_ring_progress", "events_ring_turns", "events_sleepers", "events_sleepers_turn", "events_subscribers"}
	at13 := slices.DeleteFunc(slices.Clone(all), func(t string) bool { return t == "events_pauses" || t == "events_subscribers" })
	at12 := slices.DeleteFunc(slices.Clone(at13), func(t string) bool { return strings.HasPrefix(t, "events_ring") })
	// As in goose, down is one step: the last migration drops the pauses
	// and the presence records,
	// the one before it the ring, the three before that drop no table,
	// the one before them drops events_sleepers_turn.
	for _, step := range []struct {
		action string
		code   int
		want   []string
	}{
		{"up", 0, all},
		{"down", 0, at13},
		{"down", 0, at12},
		{"down", 0, at12},
		{"down", 0, at12},
		{"down", 0, at12},
		{"down", 0, at12[:len(at12)-1]},
		{"up", 0, all},
		{"down-to 1", 0, []string{"events", "events_goose_version"}},
		// To 0 only with -yes, even when the outbox is empty.
		{"reset", 2, []string{"events", "events_goose_version"}},
		{"down", 2, []string{"events", "events_goose_version"}},
		{"reset -yes", 0, []string{"events_goose_version"}},
		{"down", 0, []string{"events_goose_version"}},
		{"up", 0, all},
	} {
		args := append([]string{"migrate", "-schema", d.Schema, "-table", "events"}, strings.Fields(step.action)...)
		r := runCLI(t, env, args...)
		if r.code != step.code {
			t.Fatalf("migrate %s: exit %d, want %d: %s%s", step.action, r.code, step.code, r.stdout, r.stderr)
		}
		if diff := cmp.Diff(step.want, tables()); diff != "" {
			t.Errorf("tables after %s (-want +got):\n%s", step.action, diff)
		}
	}
	r := runCLI(t, env, "migrate", "-schema", d.Schema, "-table", "events", "status")
	if r.code != 0 || strings.Count(r.stdout, "pending") != 0 || strings.Count(r.stdout, ".sql") != len(embeddedMigrations(t)) {
		t.Errorf("status: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

func TestCLIErrors(t *testing.T) {
	t.Parallel()
	dead := map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"}
	tests := []struct {
		name string
		env  map[string]string
		args []string
		code int
		msg  string
	}{
		{"no command", nil, nil, 2, "no command given"},
		{"unknown command", nil, []string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{"unknown flag", nil, []string{"migrate", "-bogus", "up"}, 2, "flag provided but not defined: -bogus"},
		{"no action", nil, []string{"migrate"}, 2, "want one of up, down, down-to N, reset, status"},
		{"down-to without a version", nil, []string{"migrate", "down-to"}, 2, "want one version number"},
		{"down-to a bad version", nil, []string{"migrate", "down-to", "x"}, 2, `version "x" is not a number`},
		{"extra arguments", nil, []string{"migrate", "up", "now"}, 2, "unexpected arguments"},
		{"unknown action", nil, []string{"migrate", "sideways"}, 2, `unknown action "sideways"`},
		{"no database", map[string]string{"PGHOST": "127.0.0.1", "PGPORT": "1", "PGUSER": "nobody", "PGDATABASE": "none", "PGCONNECT_TIMEOUT": "1"},
			[]string{"migrate", "up"}, 1, "migrate up: cannot reach nobody@127.0.0.1:1/none (from PostgreSQL's client defaults; set DATABASE_URL, pass -dsn"},
		{"mistyped command", nil, []string{"migrte", "up"}, 2, `unknown command "migrte"; did you mean "migrate"?`},
		{"mistyped action", nil, []string{"migrate", "stauts"}, 2, `unknown action "stauts"; did you mean "status"?`},
		{"bad table", dead, []string{"migrate", "-table", "Bad", "up"}, 2, `usage error: migrate up: Config.Table "Bad"`},
		{"unreachable database", dead, []string{"migrate", "up"}, 1, "migrate up: cannot reach nobody@127.0.0.1:1/none (from DATABASE_URL): failed to connect"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, tt.env, tt.args...)
			if r.code != tt.code || !strings.Contains(r.stderr, tt.msg) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", r.code, r.stderr, tt.code, tt.msg)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"migrate", "migrations", "inspect", "dlq", "bind"} {
		r := runCLI(t, nil, cmd, "-h")
		if r.code != 0 || !strings.Contains(r.stderr, "Example") {
			t.Errorf("%s -h: exit %d, %q", cmd, r.code, r.stderr)
		}
	}
	r := runCLI(t, nil, "help")
	for _, cmd := range []string{"migrate", "migrations", "inspect", "dlq", "bind"} {
		if !strings.Contains(r.stdout, "  "+cmd) {
			t.Errorf("help does not list %s:\n%s", cmd, r.stdout)
		}
	}
}

func TestFlagsBeforeOrAfterSubcommand(t *testing.T) {
	t.Parallel()
	d, _, env, _ := migrated(t)
	if _, err := d.Pool.Exec(t.Context(), `INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason)
		VALUES (7, 'orders', 'x', 1, 1, now(), 'rejected')`); err != nil {
		t.Fatal(err)
	}
	s := d.Schema
	for _, c := range []struct{ before, after []string }{
		{[]string{"migrate", "-schema", s, "status"}, []string{"migrate", "status", "-schema", s}},
		{[]string{"dlq", "-schema", s, "list"}, []string{"dlq", "list", "-schema", s}},
		{[]string{"dlq", "-schema", s, "-json", "show", "7"}, []string{"dlq", "show", "7", "-json", "-schema", s}},
		{[]string{"dlq", "-schema", s, "-queue", "none", "purge", "-yes"}, []string{"dlq", "purge", "-yes", "-queue", "none", "-schema", s}},
		{[]string{"inspect", "-schema", s, "-json"}, []string{"inspect", "-json", "-schema", s}},
	} {
		first := runCLI(t, env, c.before...)
		if first.code != 0 {
			t.Errorf("%v: exit %d: %s", c.before, first.code, first.stderr)
		}
		if diff := cmp.Diff(first, runCLI(t, env, c.after...), cmp.AllowUnexported(result{})); diff != "" {
			t.Errorf("%v and %v differ (-before +after):\n%s", c.before, c.after, diff)
		}
	}
	if r := runCLI(t, env, "migrate", "up", "-schema", s, "-table", "events"); r.code != 0 {
		t.Fatalf("migrate up -schema -table: exit %d: %s", r.code, r.stderr)
	}
	if r := runCLI(t, env, "migrate", "-table", "events", "down-to", "-schema", s, "2"); r.code != 0 {
		t.Fatalf("migrate -table down-to -schema 2: exit %d: %s", r.code, r.stderr)
	}
	if r := runCLI(t, env, "migrate", "status", "-table", "events", "-schema", s); r.code != 0 || strings.Count(r.stdout, "pending") != len(embeddedMigrations(t))-2 {
		t.Errorf("status of events after down-to 2: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// After "--" every argument is positional.
	if r := runCLI(t, env, "dlq", "-schema", s, "show", "7", "--", "-json"); r.code != 2 || !strings.Contains(r.stderr, `unexpected arguments ["-json"]`) {
		t.Errorf("dlq show 7 -- -json: exit %d %q", r.code, r.stderr)
	}
}

func TestEnvironmentNamesTheOutbox(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := map[string]string{"DATABASE_URL": pgtest.URL(t), "OUTBOX_SCHEMA": d.Schema, "OUTBOX_TABLE": "jobs"}

	dir := t.TempDir()
	if r := runCLI(t, env, "migrations", "-dir", dir); r.code != 0 {
		t.Fatalf("migrations: exit %d: %s", r.code, r.stderr)
	}
	b, err := os.ReadFile(filepath.Join(dir, "00001_"+d.Schema+"_jobs_create.sql"))
	if err != nil || !strings.HasPrefix(string(b), "-- outboxgen: "+d.Schema+".jobs ") {
		t.Fatalf("migrations did not follow OUTBOX_SCHEMA and OUTBOX_TABLE: %v %v", err, keys(dirFiles(t, dir)))
	}
	// A flag wins over its variable.
	if r := runCLI(t, env, "migrations", "-dir", dir, "-table", "audit", "-schema", "billing"); r.code != 0 || !strings.Contains(r.stdout, "_billing_audit_create.sql") {
		t.Errorf("migrations -table audit: exit %d %q %q", r.code, r.stdout, r.stderr)
	}

	if r := runCLI(t, env, "migrate", "up"); r.code != 0 {
		t.Fatalf("migrate up: exit %d: %s", r.code, r.stderr)
	}
	var tables []string
	rows, err := d.Pool.Query(t.Context(), "SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY 1", d.Schema)
	if err == nil {
		tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if diff := cmp.Diff([]string{"jobs", "jobs_dlq", "jobs_goose_version", "jobs_handoff", "jobs_locks", "jobs_pauses", "jobs_ring", "jobs_ring_acks",
		"jobs_ring_claims", "jobs_ring_lanes", "jobs_ring_p0", "jobs_ring_p1", "jobs_ring_p2", "jobs_ring_p3", "jobs_ring_progress",
		"jobs_ring_turns", "jobs_sleepers", "jobs_sleepers_turn", "jobs_subscribers"}, tables); err != nil || diff != "" {
		t.Errorf("tables after migrate up (-want +got): %v\n%s", err, diff)
	}
	if r := runCLI(t, env, "inspect", "-json"); r.code != 0 || r.stdout != "[]\n" {
		t.Errorf("inspect: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, env, "dlq", "list"); r.code != 0 || !strings.HasPrefix(stripHeader(r.stdout), "ID") {
		t.Errorf("dlq list: exit %d %q %q", r.code, r.stdout, r.stderr)
	}

	bad := map[string]string{"DATABASE_URL": env["DATABASE_URL"], "OUTBOX_SCHEMA": d.Schema, "OUTBOX_TABLE": "Bad"}
	if r := runCLI(t, bad, "migrate", "status"); r.code != 2 || !strings.Contains(r.stderr, `Config.Table "Bad"`) {
		t.Errorf("OUTBOX_TABLE=Bad: exit %d %q", r.code, r.stderr)
	}
	if r := runCLI(t, bad, "migrate", "status", "-table", "jobs"); r.code != 0 || strings.Contains(r.stdout, "pending") {
		t.Errorf("-table jobs over OUTBOX_TABLE=Bad: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
}

func TestMigrateUpSaysWhatItApplied(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := map[string]string{"DATABASE_URL": pgtest.URL(t)}
	names := embeddedMigrations(t)
	last := int64(len(names))
	applied := func(names []string) string {
		var b strings.Builder
		for _, n := range names {
			b.WriteString("applied " + n + "\n")
		}
		return b.String()
	}
	rolledBack := func(names []string) string {
		var b strings.Builder
		for _, n := range slices.Backward(names) {
			b.WriteString("rolled back " + n + "\n")
		}
		return b.String()
	}
	// Drops the line that names the other outboxes of the database, which
	// other tests create and drop.
	withoutOthers := func(s string) string {
		var b strings.Builder
		for l := range strings.Lines(s) {
			if !strings.HasPrefix(l, "creating outbox ") {
				b.WriteString(l)
			}
		}
		return b.String()
	}
	// A schema that does not exist yet: up creates it.
	fresh := d.Schema + "_fresh"
	t.Cleanup(func() {
		if _, err := d.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{fresh}.Sanitize()+" CASCADE"); err != nil {
			t.Error(err)
		}
	})
	for _, step := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "up", "-schema", fresh},
			applied(names) + fmt.Sprintf("outbox %s.outbox: applied %d migrations, now at version %d\n", fresh, last, last)},
		{[]string{"migrate", "up", "-schema", fresh},
			fmt.Sprintf("outbox %s.outbox is already up to date (version %d)\n", fresh, last)},
		{[]string{"migrate", "down-to", "1", "-schema", fresh},
			rolledBack(names[1:]) + fmt.Sprintf("outbox %s.outbox: rolled back %d migrations, now at version 1\n", fresh, last-1)},
		{[]string{"migrate", "up", "-schema", fresh},
			applied(names[1:]) + fmt.Sprintf("outbox %s.outbox: applied %d migrations, now at version %d\n", fresh, last-1, last)},
		{[]string{"migrate", "down-to", fmt.Sprint(last - 1), "-schema", fresh},
			rolledBack(names[last-1:]) + fmt.Sprintf("outbox %s.outbox: rolled back 1 migration, now at version %d\n", fresh, last-1)},
		{[]string{"migrate", "up", "-schema", fresh},
			applied(names[last-1:]) + fmt.Sprintf("outbox %s.outbox: applied 1 migration, now at version %d\n", fresh, last)},
		// An existing schema without the outbox.
		{[]string{"migrate", "up", "-schema", d.Schema, "-table", "events"},
			applied(names) + fmt.Sprintf("outbox %s.events: applied %d migrations, now at version %d\n", d.Schema, last, last)},
	} {
		r := runCLI(t, env, step.args...)
		if r.code != 0 {
			t.Fatalf("%v: exit %d: %s", step.args, r.code, r.stderr)
		}
		if diff := cmp.Diff(step.want, withoutOthers(stripHeader(r.stdout))); diff != "" {
			t.Errorf("%v (-want +got):\n%s", step.args, diff)
		}
	}
}

// The README's two migration paths agree: a repository applies the files
// of `outboxgen migrations` with its own goose, and `migrate status` and
// `migrate up` then see an up-to-date outbox.
func TestMigrateSeesMigrationsAppliedByTheRepositorysGoose(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := map[string]string{"DATABASE_URL": pgtest.URL(t)}
	dir := t.TempDir()
	if r := runCLI(t, env, "migrations", "-dir", dir, "-schema", d.Schema); r.code != 0 {
		t.Fatalf("migrations: exit %d %s", r.code, r.stderr)
	}
	sqlDB := stdlib.OpenDBFromPool(d.Pool)
	defer func() { _ = sqlDB.Close() }()
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, os.DirFS(dir),
		goose.WithTableName(d.Schema+".goose_db_version"), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(t.Context()); err != nil {
		t.Fatalf("the repository's goose: %v", err)
	}

	ob, err := outbox.New(d.Pool, &outbox.Config{Schema: d.Schema})
	if err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, env, "migrate", "status", "-schema", d.Schema)
	if r.code != 0 || strings.Contains(r.stdout, "pending") || strings.Count(r.stdout, "applied by another tool") != len(embeddedMigrations(t)) {
		t.Errorf("status: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "migrate", "up", "-schema", d.Schema)
	if want := fmt.Sprintf("outbox %s.outbox is already up to date (version %d)\n", d.Schema, ob.LatestSchemaVersion()); r.code != 0 || stripHeader(r.stdout) != want {
		t.Errorf("up: exit %d %q %s; want %q", r.code, r.stdout, r.stderr, want)
	}
	if r := runCLI(t, env, "inspect", "-schema", d.Schema); r.code != 0 {
		t.Errorf("inspect: exit %d %s", r.code, r.stderr)
	}
}

// A rollback that would drop rows or dead letters refuses without -yes,
// says how many, and changes nothing; down moves one version only.
func TestMigrateDownGuardsRows(t *testing.T) {
	t.Parallel()
	d, ob, env, flags := migrated(t)
	migrate := func(args ...string) result {
		t.Helper()
		return runCLI(t, env, append(append([]string{"migrate"}, args...), flags...)...)
	}
	version := func() int64 {
		t.Helper()
		v, err := ob.SchemaVersion(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	counts := func() [2]int {
		t.Helper()
		var c [2]int
		if err := d.Pool.QueryRow(t.Context(), "SELECT (SELECT count(*) FROM outbox), (SELECT count(*) FROM outbox_dlq)").Scan(&c[0], &c[1]); err != nil {
			t.Fatal(err)
		}
		return c
	}
	pub, err := outbox.NewPublisher[string](ob, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.PublishBatch(t.Context(), d.Pool, []string{"a", "b"}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Pool.Exec(t.Context(), `INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason)
		VALUES (77, 'orders', 'x', 1, 1, now(), 'rejected')`); err != nil {
		t.Fatal(err)
	}
	latest := ob.LatestSchemaVersion()
	names := embeddedMigrations(t)

	// One step: only the last migration.
	r := migrate("down")
	want := fmt.Sprintf("rolled back %s\noutbox %s.outbox: rolled back 1 migration, now at version %d\n", names[latest-1], d.Schema, latest-1)
	if diff := cmp.Diff(want, stripHeader(r.stdout)); r.code != 0 || diff != "" || version() != latest-1 {
		t.Fatalf("down: exit %d, version %d, %s(-want +got):\n%s", r.code, version(), r.stderr, diff)
	}
	if r := migrate("down-to", "2"); r.code != 0 || version() != 2 {
		t.Fatalf("down-to 2: exit %d, version %d: %s", r.code, version(), r.stderr)
	}
	// Version 2 down to 1 drops the dead-letter table and its dead letter.
	for _, args := range [][]string{{"down"}, {"down-to", "1"}, {"down-to", "0"}, {"reset"}} {
		r := migrate(args...)
		if r.code != 2 || !strings.Contains(r.stderr, "the dead-letter table with its 1 dead letter") || !strings.Contains(r.stderr, "pass -yes") {
			t.Errorf("%v: exit %d, %q; want a refusal naming 1 dead letter", args, r.code, r.stderr)
		}
		if len(args) == 2 && args[1] == "0" || args[0] == "reset" {
			if !strings.Contains(r.stderr, "drops the outbox table with its 2 rows") {
				t.Errorf("%v: %q names no rows", args, r.stderr)
			}
		}
		if v, c := version(), counts(); v != 2 || c != [2]int{2, 1} {
			t.Errorf("after a refused %v: version %d, rows and dead letters %v; want 2 and [2 1]", args, v, c)
		}
	}
	// The dead letter gone, one step down drops only an empty table.
	if _, err := d.Pool.Exec(t.Context(), "DELETE FROM outbox_dlq"); err != nil {
		t.Fatal(err)
	}
	if r := migrate("down"); r.code != 0 || version() != 1 {
		t.Fatalf("down over an empty dead-letter table: exit %d, version %d: %s", r.code, version(), r.stderr)
	}
	// To 0 drops the rows: refused, then done with -yes.
	if r := migrate("down"); r.code != 2 || !strings.Contains(r.stderr, "drops the outbox table with its 2 rows") || version() != 1 {
		t.Errorf("down to 0: exit %d, version %d, %q", r.code, version(), r.stderr)
	}
	if r := migrate("down", "-yes"); r.code != 0 || version() != 0 {
		t.Errorf("down -yes to 0: exit %d, version %d, %q", r.code, version(), r.stderr)
	}
}

// Without -dsn and DATABASE_URL the CLI connects as psql would, from
// PostgreSQL's client defaults, and says so in its first line.
func TestPGEnvironment(t *testing.T) {
	t.Parallel()
	d, _, _, _ := migrated(t)
	cfg, err := pgx.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"PGHOST": cfg.Host, "PGPORT": fmt.Sprint(cfg.Port), "PGUSER": cfg.User,
		"PGDATABASE": cfg.Database, "PGPASSWORD": cfg.Password, "OUTBOX_SCHEMA": d.Schema}
	if cfg.TLSConfig == nil {
		env["PGSSLMODE"] = "disable"
	}
	r := runCLI(t, env, "migrate", "status")
	header := fmt.Sprintf("outbox %s.outbox in %s@%s:%d/%s (from PostgreSQL's client defaults)\n", d.Schema, cfg.User, cfg.Host, cfg.Port, cfg.Database)
	if first, _, _ := strings.Cut(r.stdout, "\n"); r.code != 0 || first+"\n" != header || strings.Contains(r.stdout, "pending") {
		t.Errorf("migrate status from PG*: exit %d %q%s; want the first line %q", r.code, r.stdout, r.stderr, header)
	}
	// A value with a quote and a backslash is quoted for the connection string.
	env["PGAPPNAME"] = `it's a\b`
	r = runCLI(t, env, "inspect", "-json")
	if r.code != 0 || r.stdout != "[]\n" || !strings.HasPrefix(r.stderr, "outboxgen: "+strings.TrimSuffix(header, "\n")) {
		t.Errorf("inspect -json from PG*: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
}

func TestDescribeLoss(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		current, version int64
		loss             outbox.RollbackLoss
		want             string
	}{
		{9, 0, outbox.RollbackLoss{Rows: 2, DeadLetters: 1}, "drops the outbox table with its 2 rows and the dead-letter table with its 1 dead letter"},
		{9, 1, outbox.RollbackLoss{DeadLetters: 3}, "drops the dead-letter table with its 3 dead letters"},
		{1, 0, outbox.RollbackLoss{Rows: 1}, "drops the outbox table with its 1 row"},
	} {
		if got := describeLoss(c.current, c.version, c.loss); got != c.want {
			t.Errorf("describeLoss(%d, %d, %+v) = %q; want %q", c.current, c.version, c.loss, got, c.want)
		}
	}
}
