package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/outbox"
)

func TestDLQCommands(t *testing.T) {
	t.Parallel()
	d, _, env, flags := migrated(t)
	if _, err := d.Pool.Exec(t.Context(), `INSERT INTO outbox_dlq (id, queue, payload, headers, deliveries_count, attempts_count, created_at, failed_at, failure_reason, last_error)
		SELECT i, CASE WHEN i % 2 = 0 THEN 'even' ELSE 'odd' END, convert_to('{"n": ' || i || '}', 'UTF8'), '{"content-type": "application/json"}',
		       2, 2, now() - interval '3 hours', now() - interval '2 hours', 'retry_exhausted', E'timeout\nstack'
		FROM generate_series(1, 1200) AS i`); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) result {
		t.Helper()
		return runCLI(t, env, append(args, flags...)...)
	}

	r := run("dlq", "list", "-queue", "even", "-limit", "3", "-json")
	var rows []jsonRow
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil || r.code != 0 || len(rows) != 3 || rows[0].ID != 2 {
		t.Fatalf("list -json: exit %d, %v, %+v %s", r.code, err, rows, r.stderr)
	}
	// A text payload is shown as text.
	if rows[0].Payload == nil || *rows[0].Payload != `{"n": 2}` || rows[0].PayloadBase64 != nil {
		t.Errorf("list -json: payload %v, base64 %q; want the text {\"n\": 2}", rows[0].Payload, rows[0].PayloadBase64)
	}
	if r := run("dlq", "list", "-limit", "2"); r.code != 0 || !strings.Contains(r.stdout, "LAST ERROR") || !strings.Contains(r.stdout, "timeout") || strings.Contains(r.stdout, "stack") {
		t.Errorf("list table: exit %d\n%s", r.code, r.stdout)
	}
	if r := run("dlq", "show", "7"); r.code != 0 || !strings.Contains(r.stdout, `{"n": 7}`) || !strings.Contains(r.stdout, "header content-type") {
		t.Errorf("show: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// A payload that is not UTF-8 is shown in base64.
	if _, err := d.Pool.Exec(t.Context(), `INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason)
		VALUES (5000, 'bin', '\xff00', 1, 1, now(), 'rejected')`); err != nil {
		t.Fatal(err)
	}
	var bin jsonRow
	if r := run("dlq", "show", "5000", "-json"); r.code != 0 || json.Unmarshal([]byte(r.stdout), &bin) != nil ||
		bin.Payload != nil || string(bin.PayloadBase64) != "\xff\x00" {
		t.Errorf("show -json of a binary payload: exit %d %s%s", r.code, r.stdout, r.stderr)
	}
	if r := run("dlq", "purge", "-yes", "-queue", "bin"); r.code != 0 {
		t.Fatalf("purge bin: exit %d %s", r.code, r.stderr)
	}
	if r := run("dlq", "show", "99999"); r.code != 1 || !strings.Contains(r.stderr, "no dead-lettered row 99999") {
		t.Errorf("show missing: exit %d %q", r.code, r.stderr)
	}

	// A dry run counts and moves nothing; an unfiltered replay needs -yes.
	r = run("dlq", "replay", "-queue", "odd", "-dry-run")
	if r.code != 0 || !strings.Contains(r.stdout, "dry run: would replay 600 dead-lettered rows into the outbox; nothing was changed") {
		t.Errorf("replay -dry-run: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := run("dlq", "replay"); r.code != 2 || !strings.Contains(r.stderr, "or -yes to replay every dead-lettered row") {
		t.Errorf("unfiltered replay: exit %d %q", r.code, r.stderr)
	}
	if r := run("dlq", "replay", "-dry-run", "-json"); r.code != 0 || r.stdout != "{\n  \"dry_run\": true,\n  \"would_replay\": 1200,\n  \"matched\": 1200,\n  \"up_to_id\": 1200\n}\n" {
		t.Errorf("unfiltered replay -dry-run -json: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	var moved int
	if err := d.Pool.QueryRow(t.Context(), "SELECT count(*) FROM outbox").Scan(&moved); err != nil || moved != 0 {
		t.Fatalf("dry runs and refusals moved %d rows (%v)", moved, err)
	}

	r = run("dlq", "replay", "-queue", "odd")
	if r.code != 0 || !strings.Contains(r.stdout, "replayed 600 rows") {
		t.Fatalf("replay: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	// Not a terminal: plain progress lines.
	if !strings.Contains(r.stderr, "replay 600/600 (100%)") || strings.Contains(r.stderr, "\r") {
		t.Errorf("progress: %q", r.stderr)
	}
	var inOutbox, inDLQ int
	if err := d.Pool.QueryRow(t.Context(), "SELECT (SELECT count(*) FROM outbox), (SELECT count(*) FROM outbox_dlq)").Scan(&inOutbox, &inDLQ); err != nil {
		t.Fatal(err)
	}
	if inOutbox != 600 || inDLQ != 600 {
		t.Errorf("after replay: %d in the outbox, %d in the DLQ; want 600 and 600", inOutbox, inDLQ)
	}

	if r := run("dlq", "purge"); r.code != 2 || !strings.Contains(r.stderr, "pass -older-than D, or -yes") {
		t.Errorf("purge without a bound: exit %d %q", r.code, r.stderr)
	}
	if r := run("dlq", "purge", "-older-than", "3h"); r.code != 0 || !strings.Contains(r.stdout, "purged 0") {
		t.Errorf("purge -older-than 3h: exit %d %q", r.code, r.stdout)
	}
	if r := run("dlq", "purge", "-yes"); r.code != 0 || !strings.Contains(r.stdout, "purged 600") {
		t.Errorf("purge -yes: exit %d %q", r.code, r.stdout)
	}
}

// jsonRow is a row of dlq list -json and show -json.
type jsonRow struct {
	ID            int64             `json:"id"`
	Queue         string            `json:"queue"`
	Payload       *string           `json:"payload"`
	PayloadBase64 []byte            `json:"payload_base64"`
	Headers       map[string]string `json:"headers"`
	RawHeaders    json.RawMessage   `json:"raw_headers"`
}

func TestDLQUsageErrors(t *testing.T) {
	t.Parallel()
	dead := map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"}
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"dlq"}, 2, "want list, show ID, replay or purge"},
		{[]string{"dlq", "frob"}, 2, `unknown command "frob"`},
		{[]string{"dlq", "show"}, 2, "want a row id"},
		{[]string{"dlq", "show", "x"}, 2, `id "x" is not a number`},
		{[]string{"dlq", "list", "-bogus"}, 2, "flag provided but not defined: -bogus"},
		{[]string{"dlq", "list", "-reason", "nope"}, 2, `"nope" is not one of`},
		{[]string{"dlq", "list", "-reason", "rejectd"}, 2, `did you mean "rejected"?`},
		{[]string{"dlq", "lsit"}, 2, `unknown command "lsit"; did you mean "list"?`},
		{[]string{"dlq", "list", "-dry-run"}, 2, "-dry-run is replay's and purge's"},
		{[]string{"dlq", "purge", "-yes", "-expect", "3"}, 2, "-expect needs -up-to"},
		{[]string{"dlq", "replay"}, 2, "pass -queue, -reason, -cause or -older-than"},
		{[]string{"dlq", "list", "-limit", "0"}, 2, "-limit must be between 1 and 100000"},
		{[]string{"dlq", "list", "-limit", "100001"}, 2, "-limit must be between 1 and 100000"},
		{[]string{"dlq", "list"}, 1, "dlq list: cannot reach nobody@127.0.0.1:1/none"},
	} {
		r := runCLI(t, dead, c.args...)
		if r.code != c.code || !strings.Contains(r.stderr, c.msg) {
			t.Errorf("%v: exit %d %q; want %d and %q", c.args, r.code, r.stderr, c.code, c.msg)
		}
	}
}

func TestDLQListPages(t *testing.T) {
	t.Parallel()
	d, _, env, flags := migrated(t)
	if _, err := d.Pool.Exec(t.Context(), `INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason)
		SELECT i, 'orders', 'x', 1, 1, now(), 'rejected' FROM generate_series(1, 5) AS i`); err != nil {
		t.Fatal(err)
	}
	// ids reads the ID column of a table listing, and its last line.
	ids := func(out string) (got []string, last string) {
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		for _, l := range lines[1:] {
			if f := strings.Fields(l); len(f) > 0 && f[0] != "more" {
				got = append(got, f[0])
			}
		}
		return got, lines[len(lines)-1]
	}
	for _, c := range []struct {
		args     []string
		wantIDs  []string
		wantLast string
	}{
		{[]string{"-limit", "2"}, []string{"1", "2"}, "more rows: rerun with -after 2"},
		{[]string{"-limit", "2", "-after", "2"}, []string{"3", "4"}, "more rows: rerun with -after 4"},
		{[]string{"-after", "4", "-limit", "2"}, []string{"5"}, ""},
		{[]string{"-limit", "5"}, []string{"1", "2", "3", "4", "5"}, ""},
		{nil, []string{"1", "2", "3", "4", "5"}, ""},
	} {
		r := runCLI(t, env, append(append([]string{"dlq", "list"}, c.args...), flags...)...)
		if r.code != 0 {
			t.Fatalf("list %v: exit %d: %s", c.args, r.code, r.stderr)
		}
		got, last := ids(stripHeader(r.stdout))
		if !strings.HasPrefix(last, "more") {
			last = ""
		}
		if diff := cmp.Diff(c.wantIDs, got); diff != "" {
			t.Errorf("list %v ids (-want +got):\n%s", c.args, diff)
		}
		if last != c.wantLast {
			t.Errorf("list %v: last line %q, want %q", c.args, last, c.wantLast)
		}
	}
	// With -json, stdout stays one JSON document and the hint goes to stderr.
	r := runCLI(t, env, append([]string{"dlq", "list", "-json", "-limit", "3"}, flags...)...)
	var rows []jsonRow
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil || r.code != 0 || len(rows) != 3 {
		t.Fatalf("list -json -limit 3: exit %d, %v, %d rows", r.code, err, len(rows))
	}
	if want := "outboxgen: outbox " + d.Schema + ".outbox in "; !strings.HasPrefix(r.stderr, want) {
		t.Errorf("list -json -limit 3: stderr %q does not start with %q", r.stderr, want)
	}
	if stripHeader(strings.TrimPrefix(r.stderr, "outboxgen: ")) != "more rows: rerun with -after 3\n" {
		t.Errorf("list -json -limit 3: stderr %q", r.stderr)
	}
}

func TestDLQReplayReportsLiveTimerIDs(t *testing.T) {
	t.Parallel()
	d, _, env, flags := migrated(t)
	if _, err := d.Pool.Exec(t.Context(), `INSERT INTO outbox_dlq (id, queue, payload, timer_id, deliveries_count, attempts_count, created_at, failure_reason)
		SELECT i, 'orders', 'x', 't-' || i, 1, 1, now(), 'rejected' FROM generate_series(1, 4) AS i;
		INSERT INTO outbox (queue, payload, timer_id) VALUES ('orders', 'live', 't-2')`); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, env, append([]string{"dlq", "replay", "-queue", "orders"}, flags...)...)
	r.stdout = stripHeader(r.stdout)
	want := `replayed 3 rows into the outbox
skipped 1 row whose timer id is live in the outbox, left in the dead-letter table (-drop-timer-ids replays without it):
ID  QUEUE   TIMER ID
2   orders  t-2
`
	if diff := cmp.Diff(want, r.stdout); r.code != 0 || diff != "" {
		t.Errorf("replay: exit %d %s(-want +got):\n%s", r.code, r.stderr, diff)
	}
	r = runCLI(t, env, append([]string{"dlq", "replay", "-yes", "-drop-timer-ids", "-json"}, flags...)...)
	var res outbox.ReplayResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || r.code != 0 {
		t.Fatalf("replay -drop-timer-ids -json: exit %d, %v: %s%s", r.code, err, r.stdout, r.stderr)
	}
	if diff := cmp.Diff(outbox.ReplayResult{Matched: 1, UpToID: 2, Replayed: 1, TimerIDsDropped: []outbox.TimerConflict{{ID: 2, Queue: "orders", TimerID: "t-2"}}}, res); diff != "" {
		t.Errorf("replay -drop-timer-ids -json (-want +got):\n%s", diff)
	}
	var inOutbox, inDLQ int
	if err := d.Pool.QueryRow(t.Context(), "SELECT (SELECT count(*) FROM outbox), (SELECT count(*) FROM outbox_dlq)").Scan(&inOutbox, &inDLQ); err != nil {
		t.Fatal(err)
	}
	if inOutbox != 5 || inDLQ != 0 {
		t.Errorf("%d rows in the outbox, %d in the DLQ; want 5 and 0", inOutbox, inDLQ)
	}
	// Replayed row 1 holds t-1 now.
	if _, err := d.Pool.Exec(t.Context(), `INSERT INTO outbox_dlq (id, queue, payload, timer_id, deliveries_count, attempts_count, created_at, failure_reason)
		VALUES (9, 'orders', 'x', 't-1', 1, 1, now(), 'rejected')`); err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, env, append([]string{"dlq", "replay", "-drop-timer-ids", "-queue", "orders"}, flags...)...)
	r.stdout = stripHeader(r.stdout)
	want = `replayed 1 row into the outbox
1 replayed without the timer id, which is live in the outbox:
ID  QUEUE   TIMER ID
9   orders  t-1
`
	if diff := cmp.Diff(want, r.stdout); r.code != 0 || diff != "" {
		t.Errorf("replay -drop-timer-ids: exit %d %s(-want +got):\n%s", r.code, r.stderr, diff)
	}
}

// A purge's dry run changes nothing and prints its bound; the purge given
// that bound deletes only the rows it counted, in batches with progress,
// and says when the set changed.
func TestDLQPurgeWithinTheDryRunsBound(t *testing.T) {
	t.Parallel()
	d, _, env, flags := migrated(t)
	exec := func(sql string) {
		t.Helper()
		if _, err := d.Pool.Exec(t.Context(), sql); err != nil {
			t.Fatal(err)
		}
	}
	exec(`INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason)
		SELECT i, 'orders', 'x', 1, 1, now(), 'rejected' FROM generate_series(1, 2500) AS i`)
	run := func(args ...string) result {
		t.Helper()
		r := runCLI(t, env, append(args, flags...)...)
		r.stdout = stripHeader(r.stdout)
		return r
	}
	r := run("dlq", "purge", "-yes", "-queue", "orders", "-dry-run")
	want := "dry run: would purge 2500 dead-lettered rows; nothing was changed\n" +
		"to act on these 2500 rows and none dead-lettered since with higher ids, add: -up-to 2500 -expect 2500\n"
	if diff := cmp.Diff(want, r.stdout); r.code != 0 || diff != "" {
		t.Errorf("purge -dry-run: exit %d %s(-want +got):\n%s", r.code, r.stderr, diff)
	}
	exec(`INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason)
		VALUES (2501, 'orders', 'late', 1, 1, now(), 'rejected');
		DELETE FROM outbox_dlq WHERE id = 7`)
	r = run("dlq", "purge", "-yes", "-queue", "orders", "-up-to", "2500", "-expect", "2500")
	if r.code != 0 || r.stdout != "purged 2499 dead-lettered rows\n" {
		t.Errorf("purge within the bound: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"the set changed since the dry run: 2499 rows matched up to id 2500, where the dry run matched 2500",
		"purge 1000/2499 (40%)", "purge 2499/2499 (100%)"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("purge's stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if diff := cmp.Diff([]int64{2501}, deadIDs(t, d.Pool)); diff != "" {
		t.Errorf("left (-want +got):\n%s", diff)
	}
}

// deadIDs is the ids of the dead-letter table's rows, in id order.
func deadIDs(t *testing.T, pool *pgxpool.Pool) []int64 {
	t.Helper()
	rows, err := pool.Query(t.Context(), "SELECT id FROM outbox_dlq ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// dlq causes groups the newest dead letters by why they failed, the
// largest group first, in a table or as JSON; -reason is not its.
func TestDLQCauses(t *testing.T) {
	t.Parallel()
	d, _, env, flags := migrated(t)
	if _, err := d.Pool.Exec(t.Context(), `INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason, last_error)
		SELECT r.id, 'orders', '\x00', 1, 1, now(), r.reason, r.err FROM (VALUES
			(1, 'retry_exhausted', 'order 4211 timed out'), (2, 'retry_exhausted', 'order 977 timed out'),
			(3, 'rejected', 'unknown customer 12')) AS r(id, reason, err)`); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, env, append([]string{"dlq", "causes"}, flags...)...)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 6 || !strings.HasSuffix(lines[1], "the newest 3 dead letters, by cause:") ||
		!regexp.MustCompile(`^2 +orders +retry_exhausted +order # timed out +2 \(`).MatchString(lines[3]) ||
		!regexp.MustCompile(`^1 +orders +rejected +unknown customer # +3 \(`).MatchString(lines[4]) ||
		!strings.HasPrefix(lines[5], `a group's dead letters, all of them: dlq list|replay|purge -queue 'orders' -reason retry_exhausted -cause 'order # timed out' `) {
		t.Fatalf("dlq causes: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, append([]string{"dlq", "causes", "-json", "-sample", "1"}, flags...)...)
	var got struct {
		Sampled int64                    `json:"sampled"`
		Causes  []outbox.DeadLetterCause `json:"causes"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); r.code != 0 || err != nil || got.Sampled != 1 || len(got.Causes) != 1 ||
		got.Causes[0].Cause != "unknown customer #" {
		t.Fatalf("dlq causes -json -sample 1: exit %d %q %q (%v)", r.code, r.stdout, r.stderr, err)
	}
	r = runCLI(t, env, append([]string{"dlq", "causes", "-contains", "TIMED out"}, flags...)...)
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); r.code != 0 || len(lines) != 5 ||
		!strings.Contains(lines[1], `those whose last error holds "TIMED out"`) || !strings.HasPrefix(lines[3], "2 ") {
		t.Fatalf("dlq causes -contains: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, env, append([]string{"dlq", "causes", "-contains", "nowhere"}, flags...)...); r.code != 0 ||
		!strings.HasSuffix(r.stdout, "no dead letter among the newest 10000 holds \"nowhere\" in its last error\n") {
		t.Errorf("dlq causes -contains nowhere: exit %d %q", r.code, r.stdout)
	}
	if r := runCLI(t, env, append([]string{"dlq", "list", "-contains", "x"}, flags...)...); r.code != 2 {
		t.Errorf("dlq list -contains: exit %d, want 2: %s", r.code, r.stderr)
	}
	if r := runCLI(t, env, append([]string{"dlq", "causes", "-reason", "rejected"}, flags...)...); r.code != 2 {
		t.Errorf("dlq causes -reason: exit %d, want 2: %s", r.code, r.stderr)
	}
	// The command it prints lists and replays that cause's dead letters,
	// and the other's stay.
	cause := []string{"-queue", "orders", "-reason", "retry_exhausted", "-cause", "order # timed out"}
	if r := runCLI(t, env, append(append([]string{"dlq", "list", "-json"}, cause...), flags...)...); r.code != 0 ||
		strings.Count(r.stdout, `"reason": "retry_exhausted"`) != 2 {
		t.Errorf("dlq list -cause: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, env, append(append([]string{"dlq", "replay"}, cause...), flags...)...); r.code != 0 {
		t.Fatalf("dlq replay -cause: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if diff := cmp.Diff([]int64{3}, deadIDs(t, d.Pool)); diff != "" {
		t.Errorf("dead letters left after replaying the timeouts (-want +got):\n%s", diff)
	}
	if r := runCLI(t, env, append([]string{"dlq", "causes", "-cause", "x"}, flags...)...); r.code != 2 {
		t.Errorf("dlq causes -cause: exit %d, want 2: %s", r.code, r.stderr)
	}
}
