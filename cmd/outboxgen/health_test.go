package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/outboxgen/outboxgen/outbox"
)

// A healthy outbox exits 0 and says so; -json carries the report.
func TestHealth(t *testing.T) {
	t.Parallel()
	_, ob, env, flags := migrated(t)
	r := runCLI(t, env, append([]string{"health"}, flags...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "problems              none") || !strings.Contains(r.stdout, "NOTIFY                heard in") {
		t.Errorf("exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, append([]string{"health", "-json"}, flags...)...)
	var h outbox.Health
	if err := json.Unmarshal([]byte(r.stdout), &h); err != nil || r.code != 0 {
		t.Fatalf("exit %d, %v in %s", r.code, err, r.stdout)
	}
	if h.SchemaVersion != ob.LatestSchemaVersion() || !h.NotifyHeard || len(h.Problems) != 0 {
		t.Errorf("report %+v", h)
	}
}

// A missing outbox fails with exit status 1, naming the database and the
// outboxes it holds, and reports no table figures.
func TestHealthOfAMissingOutbox(t *testing.T) {
	t.Parallel()
	d, _, env, _ := migrated(t)
	r := runCLI(t, env, "health", "-schema", d.Schema, "-table", "nosuch")
	for _, want := range []string{
		"health: no outbox " + d.Schema + ".nosuch in ",
		"\n  " + d.Schema + ".outbox  (-schema " + d.Schema + " -table outbox)\n",
	} {
		if r.code != 1 || !strings.Contains(r.stderr+"\n", want) {
			t.Errorf("exit %d, stderr lacks %q:\n%s%s", r.code, want, r.stdout, r.stderr)
		}
	}
	if strings.Contains(r.stdout, "vacuumed") || strings.Contains(r.stderr, "migrate up") {
		t.Errorf("a missing outbox reports table figures or advises creating it:\n%s%s", r.stdout, r.stderr)
	}
	r = runCLI(t, map[string]string{"PGHOST": "127.0.0.1", "PGPORT": "1", "PGCONNECT_TIMEOUT": "1"}, "health")
	if r.code != 1 || !strings.Contains(r.stderr, "set DATABASE_URL, pass -dsn") {
		t.Errorf("no database: exit %d: %s", r.code, r.stderr)
	}
}

// Through PgBouncer (make leg-pgbouncer sets TEST_PGBOUNCER_URL and
// points DATABASE_URL's tests at it): in transaction mode health says
// that LISTEN through the pooler never hears, names the fix, and exits
// 1; with the direct connection as -listen-dsn it hears. In session mode
// it hears through the pooler.
func TestHealthThroughPgBouncer(t *testing.T) {
	t.Parallel()
	if os.Getenv("TEST_PGBOUNCER_URL") == "" {
		t.Skip("TEST_PGBOUNCER_URL names no PgBouncer (make leg-pgbouncer sets it)")
	}
	mode, server := os.Getenv("TEST_PGBOUNCER_MODE"), os.Getenv("TEST_PGBOUNCER_SERVER_URL")
	_, _, env, flags := migrated(t)
	r := runCLI(t, env, append([]string{"health"}, flags...)...)
	if mode == "session" {
		if !strings.Contains(r.stdout, "NOTIFY                heard in") || strings.Contains(r.stdout, "NOTIFY did not reach") {
			t.Errorf("through PgBouncer in session mode: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
		}
		return
	}
	for _, want := range []string{
		"NOTIFY                not heard: the LISTEN connection heard nothing",
		"LISTEN through PgBouncer in transaction mode never hears",
		"SubscriberConfig.ListenDSN, and check it with -listen-dsn",
		"- NOTIFY did not reach a LISTEN connection",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("through PgBouncer in transaction mode, the report lacks %q:\n%s", want, r.stdout)
		}
	}
	if r.code != 1 || !strings.Contains(r.stderr, "problem(s) found") {
		t.Errorf("exit %d: %s", r.code, r.stderr)
	}
	r = runCLI(t, env, append([]string{"health", "-listen-dsn", server}, flags...)...)
	if !strings.Contains(r.stdout, "NOTIFY                heard in") || strings.Contains(r.stdout, "NOTIFY did not reach") {
		t.Errorf("with a direct -listen-dsn: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// With the log tier's ring beside the outbox table, health says where its
// writers write, and inspect counts the ring's rows no lane has read yet.
func TestHealthAndInspectShowTheRing(t *testing.T) {
	t.Parallel()
	d, _, env, flags := migrated(t)
	if _, err := d.Pool.Exec(t.Context(), `INSERT INTO outbox_ring (queue, payload) SELECT 'orders', 'x' FROM generate_series(1, 3)`); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, env, append([]string{"health"}, flags...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "ring                  writers in partition 0 for ") ||
		!strings.Contains(r.stdout, "; the next empty\n") {
		t.Errorf("health: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, append([]string{"inspect", "-json"}, flags...)...)
	var got []outbox.QueueStats
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.code != 0 {
		t.Fatalf("inspect: exit %d, %v in %s", r.code, err, r.stdout)
	}
	if diff := cmp.Diff([]outbox.QueueStats{{Queue: "orders", Ready: 3}}, got, cmpopts.IgnoreFields(outbox.QueueStats{}, "OldestAge")); diff != "" {
		t.Errorf("inspect (-want +got):\n%s", diff)
	}
}
