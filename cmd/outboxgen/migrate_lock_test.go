package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/internal/pgtest"
)

// A step whose lock is held is retried, each retry printing on stderr the
// session that holds it; when -lock-retry-for is spent, migrate fails
// naming the step and the holder, and once the holder is gone migrate up
// applies the step.
func TestMigrateUpRetriesAndPrintsWhatHoldsTheLock(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := map[string]string{"DATABASE_URL": pgtest.URL(t)}
	names := embeddedMigrations(t)
	step := names[len(names)-1]
	for _, action := range []string{"up", "down"} {
		if r := runCLI(t, env, "migrate", action, "-schema", d.Schema); r.code != 0 {
			t.Fatalf("migrate %s: exit %d: %s", action, r.code, r.stderr)
		}
	}

	// A session whose open transaction has read the outbox and holds a
	// SHARE lock on its migration history, which every step writes.
	cfg, err := pgx.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "cli-lock-holder"
	tx := pgtest.Tx(t, cfg)
	schema := pgx.Identifier{d.Schema}.Sanitize()
	var pid int32
	if _, err := tx.Exec(t.Context(), "SELECT count(*) FROM "+schema+".outbox; LOCK TABLE "+schema+
		".outbox_goose_version IN SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}

	// A budget of fifty lock timeouts: the test needs a second try, and
	// each try runs the step's statements before it waits (schema 13's
	// make a dozen tables and indexes), which on a loaded machine took
	// 2.9 s.
	r := runCLI(t, env, "migrate", "up", "-schema", d.Schema, "-lock-timeout", "200ms", "-lock-retry-for", "10s")
	holder := fmt.Sprintf(`pid %d (application_name \"cli-lock-holder\"`, pid)
	if r.code != 1 || !strings.Contains(r.stderr, "level=WARN") || !strings.Contains(r.stderr, holder) {
		t.Errorf("migrate up behind a held lock: exit %d, stderr:\n%s\nwant exit 1 and a retry naming %s", r.code, r.stderr, holder)
	}
	last := r.stderr[strings.LastIndex(strings.TrimSuffix(r.stderr, "\n"), "\n")+1:]
	for _, want := range []string{"outboxgen: outbox: migrate " + d.Schema + ".outbox: step " + step, fmt.Sprintf("pid %d", pid), "-lock-retry-for"} {
		if !strings.Contains(last, want) {
			t.Errorf("migrate up's error %q does not say %q", last, want)
		}
	}

	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, env, "migrate", "up", "-schema", d.Schema, "-lock-timeout", "200ms")
	if want := "applied " + step + "\n"; r.code != 0 || !strings.Contains(r.stdout, want) {
		t.Errorf("migrate up once the holder ended: exit %d %q %q; want %q", r.code, r.stdout, r.stderr, want)
	}
}

func TestMigrateRefusesANegativeLockTimeout(t *testing.T) {
	t.Parallel()
	for _, flag := range []string{"-lock-timeout", "-lock-retry-for"} {
		r := runCLI(t, map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"},
			"migrate", "up", flag, "-1s")
		if want := "migrate: " + flag + " -1s: must be positive, or 0 for the default"; r.code != 2 || !strings.Contains(r.stderr, want) {
			t.Errorf("migrate up %s -1s: exit %d %q; want exit 2 and %q", flag, r.code, r.stderr, want)
		}
	}
}
