package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/outbox"
	"github.com/outboxgen/outboxgen/outbox/outboxtest"
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
	lines := strings.Split(strings.TrimRight(stripHeader(r.stdout), "\n"), "\n")
	if r.code != 0 || len(lines) != 2 || !strings.Contains(lines[0], "DEAD-LETTERED") || !strings.HasPrefix(strings.TrimSpace(lines[1]), "orders") {
		t.Errorf("table: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// Right-aligned columns make every line as long as the header.
	if len(lines) == 2 && len(lines[0]) != len(lines[1]) {
		t.Errorf("columns not aligned:\n%s", r.stdout)
	}
	// No key is held.
	if f := strings.Fields(lines[len(lines)-1]); len(f) < 2 || f[len(f)-2] != "0/0" || f[len(f)-1] != "-" {
		t.Errorf("held keys of orders: want 0/0 and -:\n%s", r.stdout)
	}
	// A queue with no row in the outbox has no oldest row: "-", not 0s.
	r = runCLI(t, env, append([]string{"inspect", "-queue", "invoices"}, flags...)...)
	lines = strings.Split(strings.TrimRight(stripHeader(r.stdout), "\n"), "\n")
	if f := strings.Fields(lines[len(lines)-1]); r.code != 0 || len(f) != 10 || f[0] != "invoices" || f[6] != "-" || f[7] != "1" {
		t.Errorf("invoices: want OLDEST - and 1 dead-lettered:\n%s%s", r.stdout, r.stderr)
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
		{dead, []string{"inspect", "-table", "x y"}, 2, `Config.Table "x y"`},
		{dead, []string{"inspect"}, 1, "inspect: cannot reach nobody@127.0.0.1:1/none (from DATABASE_URL)"},
		{dead, []string{"inspect", "-dsn", "postgres://someone@127.0.0.1:1/other?connect_timeout=1"}, 1, "inspect: cannot reach someone@127.0.0.1:1/other: "},
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
	// The operator forgot -table: inspect names the database and the
	// outbox that exists, the likeliest first, and does not advise
	// creating an empty one.
	if r := runCLI(t, env, "migrate", "-schema", d.Schema, "-table", "events", "up"); r.code != 0 {
		t.Fatalf("migrate up: exit %d %s", r.code, r.stderr)
	}
	r := runCLI(t, env, "inspect", "-schema", d.Schema)
	db, err := pgx.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("outboxgen: inspect: no outbox %s.outbox in %s@%s:%d/%s (from DATABASE_URL); the database holds ",
		d.Schema, db.User, db.Host, db.Port, db.Database)
	if r.code != 1 || !strings.HasPrefix(r.stderr, want) || !strings.Contains(r.stderr, "(choose with -schema and -table, or OUTBOX_SCHEMA and OUTBOX_TABLE):\n  "+
		d.Schema+".events  (-schema "+d.Schema+" -table events)\n") || strings.Contains(r.stderr, "migrate up") {
		t.Errorf("inspect of a missing outbox: exit %d %q; want %q and the outbox that exists", r.code, r.stderr, want)
	}
	if header := fmt.Sprintf("outbox %s.outbox in %s@%s:%d/%s (from DATABASE_URL)\n", d.Schema, db.User, db.Host, db.Port, db.Database); r.stdout != header {
		t.Errorf("inspect's first line %q; want %q", r.stdout, header)
	}
	// migrate status names the outbox and says it does not exist.
	r = runCLI(t, env, "migrate", "-schema", d.Schema, "status")
	if r.code != 0 || !strings.Contains(r.stdout, "outbox "+d.Schema+".outbox does not exist; the database holds") ||
		!strings.Contains(r.stdout, d.Schema+".events  (-schema") {
		t.Errorf("migrate status of a missing outbox: exit %d\n%s%s", r.code, r.stdout, r.stderr)
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

// inspect names the ordering keys whose head holds later rows back: one
// waiting for its retry, one scheduled for later, and not one whose head
// is ready.
func TestInspectNamesHeldKeys(t *testing.T) {
	t.Parallel()
	d, ob, env, flags := migrated(t)
	pub, err := outbox.NewPublisher[string](ob, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	publish := func(opts *outbox.PublishOpts, msgs ...string) {
		t.Helper()
		for _, m := range msgs {
			if _, err := pub.Publish(t.Context(), d.Pool, m, opts); err != nil {
				t.Fatal(err)
			}
		}
	}
	// customer-2's head is scheduled for later, with a row behind it.
	publish(&outbox.PublishOpts{OrderingKey: "customer-2", Delay: time.Hour}, "s1")
	publish(&outbox.PublishOpts{OrderingKey: "customer-2"}, "s2")
	// customer-1's head fails and waits an hour for its retry, with two
	// rows behind it.
	publish(&outbox.PublishOpts{OrderingKey: "customer-1"}, "r1", "r2", "r3")
	n := outboxtest.Drain(t, ob, []string{"orders"}, func(context.Context, *outbox.Message[string]) error {
		return outbox.RetryAfter(errors.New("later"), time.Hour)
	}, nil, 10*time.Second)
	if n != 1 {
		t.Fatalf("Drain saw %d deliveries, want 1 (customer-1's head)", n)
	}
	// customer-3's head is ready: its key is busy, not held.
	publish(&outbox.PublishOpts{OrderingKey: "customer-3"}, "f1", "f2")
	// customer-2's waiting row is the oldest.
	if _, err := d.Pool.Exec(t.Context(), `UPDATE outbox SET created_at = now() - interval '2 hours' WHERE ordering_key = 'customer-2'`); err != nil {
		t.Fatal(err)
	}

	r := runCLI(t, env, append([]string{"inspect", "-json"}, flags...)...)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	for _, field := range []string{`"blocked": 4`, `"held_keys_retrying": 1`, `"held_keys_scheduled": 1`, `"oldest_held_key": "customer-2"`, `"oldest_held_age_ns"`} {
		if !strings.Contains(r.stdout, field) {
			t.Errorf("JSON lacks %s:\n%s", field, r.stdout)
		}
	}
	var got []outbox.QueueStats
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("%v in %s", err, r.stdout)
	}
	want := []outbox.QueueStats{{Queue: "orders", Ready: 1, Scheduled: 2, Blocked: 4,
		HeldKeysRetrying: 1, HeldKeysScheduled: 1, OldestHeldKey: "customer-2"}}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(outbox.QueueStats{}, "OldestAge", "OldestHeldAge")); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
	if len(got) == 1 && (got[0].OldestHeldAge < 2*time.Hour || got[0].OldestHeldAge > 2*time.Hour+time.Minute) {
		t.Errorf("OldestHeldAge %v; want customer-2's 2h", got[0].OldestHeldAge)
	}

	r = runCLI(t, env, append([]string{"inspect"}, flags...)...)
	lines := strings.Split(strings.TrimRight(stripHeader(r.stdout), "\n"), "\n")
	if r.code != 0 || len(lines) != 2 {
		t.Fatalf("table: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, col := range []string{"BLOCKED", "HELD KEYS (retry/sched)", "OLDEST HELD KEY"} {
		if !strings.Contains(lines[0], col) {
			t.Errorf("header lacks %s:\n%s", col, r.stdout)
		}
	}
	// QUEUE READY SCHEDULED BLOCKED LEASED EXPIRED OLDEST DEAD-LETTERED
	// HELD KEYS OLDEST HELD KEY (its key, then its age).
	fields := strings.Fields(lines[1])
	if len(fields) != 11 || fields[0] != "orders" || fields[3] != "4" || fields[8] != "1/1" ||
		fields[9] != "customer-2" || !strings.HasPrefix(fields[10], "(2h0m") {
		t.Errorf("orders line %q; want 4 blocked, 1/1 held keys, customer-2 held for 2h:\n%s", fields, r.stdout)
	}
	if len(lines[0]) != len(lines[1]) {
		t.Errorf("columns not aligned:\n%s", r.stdout)
	}
}

// A held key the table cannot show as it is (written by another client) is
// quoted, and a long one is clipped.
func TestHeldKeyCell(t *testing.T) {
	t.Parallel()
	held := outbox.QueueStats{HeldKeysRetrying: 1, OldestHeldAge: 90 * time.Second}
	for _, c := range []struct{ key, want string }{
		{"customer 42", "customer 42 (1m30s)"},
		{"", `"" (1m30s)`},
		{"a\tb\nc", `"a\tb\nc" (1m30s)`},
		{strings.Repeat("k", 50), strings.Repeat("k", 39) + "… (1m30s)"},
	} {
		held.OldestHeldKey = c.key
		if got := heldKey(held); got != c.want {
			t.Errorf("heldKey(%q) = %q; want %q", c.key, got, c.want)
		}
	}
	if got := heldKey(outbox.QueueStats{}); got != "-" {
		t.Errorf("no held key: %q; want -", got)
	}
}
