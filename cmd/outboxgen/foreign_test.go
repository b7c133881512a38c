package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/outbox"
)

// Rows written by other clients (psql, COPY, another language) may hold
// names, keys, headers and timestamps no publisher of the library writes.
// inspect and dlq must show them, quoted where a terminal would not show
// them as they are, and never fail on them.
func TestCommandsShowRowsOtherClientsWrote(t *testing.T) {
	t.Parallel()
	d, _, env, flags := migrated(t)
	// run runs a command with the flags that reach the test's outbox,
	// before any "--".
	run := func(args ...string) result {
		t.Helper()
		i := slices.Index(args, "--")
		if i < 0 {
			i = len(args)
		}
		r := runCLI(t, env, slices.Concat(args[:i], flags, args[i:])...)
		if r.code != 0 {
			t.Fatalf("%v: exit %d: %s", args, r.code, r.stderr)
		}
		// Nothing a terminal would obey or a table cannot hold reaches it.
		for _, c := range []string{"\x1b", "\a", "\r", "\x7f"} {
			if strings.Contains(r.stdout, c) {
				t.Errorf("%v printed %q:\n%s", args, c, r.stdout)
			}
		}
		return r
	}
	exec := func(sql string) {
		t.Helper()
		if _, err := d.Pool.Exec(t.Context(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`INSERT INTO outbox (queue, payload, created_at, next_attempt_at) VALUES
		(E'tab\there', '', '-infinity', 'infinity'),
		(E'new\nline', '', 'infinity', '-infinity'),
		(E'\x1b[2Jclear', '', now() + interval '1 year', now()),
		('orders', '{}', now(), now())`)
	exec(`INSERT INTO outbox (queue, payload, ordering_key, next_attempt_at) VALUES
		('keyed', '', E'key\x1b[31m\n', 'infinity'), ('keyed', '', E'key\x1b[31m\n', now())`)
	exec(`INSERT INTO outbox_dlq (id, queue, payload, headers, ordering_key, timer_id, deliveries_count, attempts_count,
		created_at, failed_at, failure_reason, last_error) VALUES
		(-5, E'tab\there', E'\\x1b5b324a', '{"a": 1}', E'k\ney', E'timer\t1', 1, 1, '-infinity', 'infinity', 'decode_error',
		 E'headers are not an object of strings: header "a" is a number, not a string'),
		(0, 'orders', 'plain text', '{"tab\t": "x\ny", "\u001b[2J": "v", "ok": "fine"}', NULL, NULL, 1, 1,
		 'infinity', now(), 'rejected', E'\x1b[31mred\ttext\nsecond line')`)

	// inspect: every queue, its name quoted when a table cannot show it,
	// the columns aligned; -json carries the names as they are.
	r := run("inspect")
	lines := strings.Split(strings.TrimRight(stripHeader(r.stdout), "\n"), "\n")
	if len(lines) != 6 {
		t.Fatalf("inspect: %d lines, want a header and 5 queues:\n%s", len(lines), r.stdout)
	}
	for _, l := range lines[1:] {
		if len(l) != len(lines[0]) {
			t.Errorf("inspect: columns not aligned:\n%s", r.stdout)
			break
		}
	}
	for _, q := range []string{`"\x1b[2Jclear"`, `"new\nline"`, `"tab\there"`, "orders", "keyed", `"key\x1b[31m\n"`} {
		if !strings.Contains(r.stdout, q) {
			t.Errorf("inspect lacks %s:\n%s", q, r.stdout)
		}
	}
	r = run("inspect", "-json")
	var stats []outbox.QueueStats
	if err := json.Unmarshal([]byte(r.stdout), &stats); err != nil {
		t.Fatalf("inspect -json: %v\n%s", err, r.stdout)
	}
	var names []string
	for _, s := range stats {
		names = append(names, s.Queue)
	}
	if diff := cmp.Diff([]string{"\x1b[2Jclear", "keyed", "new\nline", "orders", "tab\there"}, names); diff != "" {
		t.Errorf("inspect -json queues (-want +got):\n%s", diff)
	}
	r = run("inspect", "-queue", "tab\there", "-json")
	if err := json.Unmarshal([]byte(r.stdout), &stats); err != nil || len(stats) != 1 || stats[0].DeadLettered != 1 || stats[0].Scheduled != 1 {
		t.Errorf("inspect -queue: %v %+v", err, stats)
	}

	// dlq list: every row, the lowest ids too; -queue selects by the
	// exact name.
	r = run("dlq", "list")
	if lines := strings.Split(strings.TrimRight(stripHeader(r.stdout), "\n"), "\n"); len(lines) != 3 ||
		!strings.HasPrefix(lines[1], `-5 `) || !strings.Contains(lines[1], `"tab\there"`) ||
		!strings.HasPrefix(lines[2], `0 `) || !strings.Contains(lines[2], `"\x1b[31mred\ttext"`) {
		t.Errorf("dlq list:\n%s", r.stdout)
	}
	r = run("dlq", "list", "-queue", "tab\there", "-json")
	var dead []jsonRow
	if err := json.Unmarshal([]byte(r.stdout), &dead); err != nil || len(dead) != 1 || dead[0].ID != -5 {
		t.Fatalf("dlq list -queue -json: %v %+v", err, dead)
	}
	// UTF-8 is text in JSON, escapes and all.
	if p := dead[0].Payload; p == nil || *p != "\x1b[2J" || !strings.Contains(r.stdout, `"payload": "\u001b[2J"`) {
		t.Errorf("dlq list -json: payload %v:\n%s", p, r.stdout)
	}
	var raw any
	if err := json.Unmarshal(dead[0].RawHeaders, &raw); err != nil || !cmp.Equal(raw, map[string]any{"a": 1.0}) {
		t.Errorf("dlq list -json: raw headers %s (%v)", dead[0].RawHeaders, err)
	}

	// dlq show: quoted names, keys and headers, headers that are not
	// strings as stored, unprintable payloads in hex.
	r = run("dlq", "show", "--", "-5")
	for _, want := range []string{`"tab\there"`, `"k\ney"`, `"timer\t1"`, `headers (not an object of strings)  {"a": 1}`,
		"payload (4 bytes, not printable UTF-8, in hex):\n1b5b324a\n", "9999-12-31T23:59:59.999999Z", "0001-01-01T00:00:00Z"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("dlq show -5 lacks %q:\n%s", want, r.stdout)
		}
	}
	r = run("dlq", "show", "0")
	var squeezed []string // the lines with their runs of blanks made one
	for _, l := range strings.Split(r.stdout, "\n") {
		squeezed = append(squeezed, strings.Join(strings.Fields(l), " "))
	}
	for _, want := range []string{`header "\x1b[2J" v|header ok fine|header "tab\t" "x\ny"|payload (10 bytes):|plain text`,
		`last error:|"\x1b[31mred\ttext\nsecond line"`} {
		if !strings.Contains(strings.Join(squeezed, "|"), want) {
			t.Errorf("dlq show 0 lacks %q:\n%s", want, r.stdout)
		}
	}

	// replay and purge select by the exact name too.
	if r := run("dlq", "replay", "-queue", "tab\there"); !strings.Contains(r.stdout, "replayed 1 row into the outbox") {
		t.Errorf("dlq replay: %s", r.stdout)
	}
	if r := run("dlq", "purge", "-yes", "-queue", "orders"); !strings.Contains(r.stdout, "purged 1 dead-lettered rows") {
		t.Errorf("dlq purge: %s", r.stdout)
	}
}
