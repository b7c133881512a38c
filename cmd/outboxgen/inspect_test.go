package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/outbox"
)

// migrated returns an outbox in a fresh schema and the CLI environment and
// flags that reach it.
func migrated(t *testing.T) (*pgtest.DB, *outbox.Outbox, map[string]string, []string) {
	t.Helper()
	d := pgtest.New(t)
	ob, err := outbox.New(d.Pool, &outbox.Config{Schema: d.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return d, ob, map[string]string{"DATABASE_URL": pgtest.URL(t)}, []string{"-schema", d.Schema}
}

func TestInspect(t *testing.T) {
	t.Parallel()
	d, ob, env, flags := migrated(t)
	pub, err := outbox.NewPublisher[string](ob, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.PublishBatch(t.Context(), d.Pool, []string{"a", "b", "c"}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(t.Context(), d.Pool, "later", &outbox.PublishOpts{Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Pool.Exec(t.Context(), `UPDATE outbox SET acquired_token = gen_random_uuid(), acquired_at = now() - interval '1 hour',
		lease_expires_at = now() - interval '1 minute' WHERE id = (SELECT min(id) FROM outbox)`); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Pool.Exec(t.Context(), `INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason)
		VALUES (999, 'invoices', '\x00', 1, 1, now(), 'rejected')`); err != nil {
		t.Fatal(err)
	}

	r := runCLI(t, env, append([]string{"inspect", "-json"}, flags...)...)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var got []outbox.QueueStats
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("%v in %s", err, r.stdout)
	}
	want := []outbox.QueueStats{
		{Queue: "invoices", DeadLettered: 1},
		{Queue: "orders", Ready: 2, Scheduled: 1, Expired: 1},
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(outbox.QueueStats{}, "OldestAge")); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}

	r = runCLI(t, env, append([]string{"inspect", "-queue", "orders"}, flags...)...)
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if r.code != 0 || len(lines) != 2 || !strings.Contains(lines[0], "DEAD-LETTERED") || !strings.HasPrefix(strings.TrimSpace(lines[1]), "orders") {
		t.Errorf("table: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// Right-aligned columns make every line as long as the header.
	if len(lines) == 2 && len(lines[0]) != len(lines[1]) {
		t.Errorf("columns not aligned:\n%s", r.stdout)
	}
}

func TestInspectErrors(t *testing.T) {
	t.Parallel()
	dead := map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"}
	for _, c := range []struct {
		env  map[string]string
		args []string
		code int
		msg  string
	}{
		{nil, []string{"inspect"}, 2, "set DATABASE_URL or pass -dsn"},
		{dead, []string{"inspect", "-table", "x y"}, 2, `Config.Table "x y"`},
		{dead, []string{"inspect"}, 1, "read the schema version"},
	} {
		r := runCLI(t, c.env, c.args...)
		if r.code != c.code || !strings.Contains(r.stderr, c.msg) {
			t.Errorf("%v: exit %d %q; want %d and %q", c.args, r.code, r.stderr, c.code, c.msg)
		}
	}
}

// inspect on an outbox that was never migrated, or is behind, says so and
// names the fix instead of failing on a missing relation.
func TestInspectNamesTheFixForAMissingOrOldSchema(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := map[string]string{"DATABASE_URL": pgtest.URL(t)}
	r := runCLI(t, env, "inspect", "-schema", d.Schema)
	if r.code != 1 || !strings.Contains(r.stderr, "does not exist: run `outboxgen migrate up`") {
		t.Errorf("inspect of a missing outbox: exit %d %q", r.code, r.stderr)
	}
	if r := runCLI(t, env, "migrate", "-schema", d.Schema, "up"); r.code != 0 {
		t.Fatalf("migrate up: exit %d %s", r.code, r.stderr)
	}
	if r := runCLI(t, env, "migrate", "-schema", d.Schema, "down-to", "3"); r.code != 0 {
		t.Fatalf("migrate down-to 3: exit %d %s", r.code, r.stderr)
	}
	r = runCLI(t, env, "inspect", "-schema", d.Schema)
	if r.code != 1 || !strings.Contains(r.stderr, "is at schema version 3 and this library needs") {
		t.Errorf("inspect of an outbox at version 3: exit %d %q", r.code, r.stderr)
	}
}
