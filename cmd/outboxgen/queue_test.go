package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/outbox"
)

// queue pause keeps the pause and its reason in the database, paused
// lists it, a second pause keeps the first, resume ends it and says so,
// and a resume of a running queue says that it was not paused.
func TestQueuePauseResumeAndPaused(t *testing.T) {
	t.Parallel()
	d, _, env, flags := migrated(t)
	cli := func(args ...string) result {
		t.Helper()
		return runCLI(t, env, append(args, flags...)...)
	}
	if r := cli("queue", "paused"); r.code != 0 || !strings.HasSuffix(r.stdout, "no queue is paused\n") {
		t.Fatalf("queue paused: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	r := cli("queue", "pause", "orders", "-reason", "payments API down")
	if r.code != 0 || !strings.Contains(r.stdout, `queue orders is paused (since `) || !strings.Contains(r.stdout, ": payments API down); ") {
		t.Fatalf("queue pause: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := cli("queue", "pause", "orders", "-reason", "another"); r.code != 0 || !strings.Contains(r.stdout, ": payments API down); ") {
		t.Fatalf("queue pause of a paused queue: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	var reasons []string
	if err := d.Pool.QueryRow(t.Context(), "SELECT array_agg(queue || ': ' || reason) FROM outbox_pauses").Scan(&reasons); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"orders: payments API down"}, reasons); diff != "" {
		t.Errorf("the pauses in the database (-want +got):\n%s", diff)
	}
	r = cli("queue", "paused")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[1], "QUEUE") || !strings.HasPrefix(lines[2], "orders ") ||
		!strings.HasSuffix(lines[2], "payments API down") {
		t.Fatalf("queue paused: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	// inspect shows the paused queue, though it has no rows.
	r = cli("inspect")
	if r.code != 0 || !strings.Contains(r.stdout, "orders (paused)") ||
		!strings.Contains(r.stdout, ": payments API down; no subscriber claims its rows until `outboxgen queue resume`") {
		t.Fatalf("inspect of a paused queue: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = cli("inspect", "-json")
	var stats []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &stats); r.code != 0 || err != nil || len(stats) != 1 || stats[0]["paused"] == nil {
		t.Fatalf("inspect -json of a paused queue: exit %d %q %q (%v)", r.code, r.stdout, r.stderr, err)
	}
	// health lists it, and it is no problem.
	r = cli("health")
	if r.code != 0 || !strings.Contains(r.stdout, "paused                queue orders since ") ||
		!strings.Contains(r.stdout, ": payments API down\n") || !strings.Contains(r.stdout, "problems              none") {
		t.Fatalf("health with a paused queue: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = cli("queue", "paused", "-json")
	var listed []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &listed); r.code != 0 || err != nil || len(listed) != 1 || listed[0]["queue"] != "orders" ||
		listed[0]["reason"] != "payments API down" {
		t.Fatalf("queue paused -json: exit %d %q %q (%v)", r.code, r.stdout, r.stderr, err)
	}
	if r := cli("queue", "resume", "orders"); r.code != 0 || !strings.HasSuffix(r.stdout, "queue orders resumed; its subscribers were woken\n") {
		t.Fatalf("queue resume: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := cli("queue", "resume", "orders"); r.code != 0 || !strings.HasSuffix(r.stdout, "queue orders was not paused\n") {
		t.Fatalf("queue resume of a running queue: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
}

// Usage errors exit 2 with the reason, before anything is changed.
func TestQueueUsageErrors(t *testing.T) {
	t.Parallel()
	d, _, env, flags := migrated(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"queue"}, "want pause QUEUE, resume QUEUE or paused"},
		{[]string{"queue", "pasue", "q"}, `unknown command "pasue"`},
		{[]string{"queue", "pause"}, "queue pause: want a queue name"},
		{[]string{"queue", "resume", "q", "extra"}, "unexpected arguments"},
		{[]string{"queue", "resume", "q", "-reason", "x"}, "-reason is pause's"},
		{[]string{"queue", "pause", "q", "-reason", strings.Repeat("r", 1025)}, "reason"},
		{[]string{"queue", "pause", strings.Repeat("q", 256)}, "queue"},
	} {
		r := runCLI(t, env, append(tc.args, flags...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	var n int
	if err := d.Pool.QueryRow(t.Context(), "SELECT count(*) FROM outbox_pauses").Scan(&n); err != nil || n != 0 {
		t.Errorf("pauses after the refused commands: %d, %v; want 0", n, err)
	}
}

// subscribers lists a running subscriber with its queues and state, and
// says so when none runs.
func TestSubscribersCommand(t *testing.T) {
	t.Parallel()
	_, ob, env, flags := migrated(t)
	if r := runCLI(t, env, append([]string{"subscribers"}, flags...)...); r.code != 0 || !strings.Contains(r.stdout, "no subscriber is running") {
		t.Fatalf("subscribers with none: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	sub, err := outbox.NewSubscriber(ob, []string{"orders", "refunds"}, func(context.Context, *outbox.Message[[]byte]) error { return nil },
		&outbox.SubscriberConfig[[]byte]{Name: "billing", Workers: 3, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.RunUntilEnd(t, sub.Run)
	var r result
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		r = runCLI(t, env, append([]string{"subscribers"}, flags...)...)
		if strings.Contains(r.stdout, "billing") || time.Now().After(deadline) {
			break
		}
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[1], "NAME") || !strings.HasPrefix(lines[2], "billing ") ||
		!strings.Contains(lines[2], " orders,refunds ") || !strings.Contains(lines[2], "/3 ") {
		t.Fatalf("subscribers: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, append([]string{"subscribers", "-json"}, flags...)...)
	var subs []outbox.SubscriberInfo
	if err := json.Unmarshal([]byte(r.stdout), &subs); r.code != 0 || err != nil || len(subs) != 1 || subs[0].Name != "billing" ||
		subs[0].Workers != 3 || subs[0].PID != os.Getpid() {
		t.Fatalf("subscribers -json: exit %d %q %q (%v)", r.code, r.stdout, r.stderr, err)
	}
}

// health's -unclaimed and -ready-wait set when a queue's wait is a
// problem: a fresh row of a queue nobody subscribes to is none at the
// defaults, and is one past -unclaimed 1ms (exit status 1).
func TestHealthJudgesWaitingQueues(t *testing.T) {
	t.Parallel()
	d, ob, env, flags := migrated(t)
	pub, err := outbox.NewPublisher[string](ob, "jobs", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(t.Context(), d.Pool, "job", nil); err != nil {
		t.Fatal(err)
	}
	if r := runCLI(t, env, append([]string{"health"}, flags...)...); r.code != 0 || strings.Contains(r.stdout, `queue "jobs"`) {
		t.Fatalf("health at the defaults: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	r := runCLI(t, env, append([]string{"health", "-unclaimed", "1ms", "-ready-wait", "1h"}, flags...)...)
	if r.code != 1 || !strings.Contains(r.stdout, `queue "jobs" has ready rows (1)`) {
		t.Fatalf("health -unclaimed 1ms: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
}

// rows lists a queue's rows by state, page by page; row shows one row,
// retries it now, and dead-letters or cancels it only with -yes.
func TestRowsAndRowCommands(t *testing.T) {
	t.Parallel()
	d, ob, env, flags := migrated(t)
	cli := func(args ...string) result {
		t.Helper()
		return runCLI(t, env, append(args, flags...)...)
	}
	pub, err := outbox.NewPublisher[string](ob, "jobs", nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 3 {
		id, err := pub.Publish(t.Context(), d.Pool, fmt.Sprint("job ", i), &outbox.PublishOpts{Delay: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, fmt.Sprint(id))
	}
	r := cli("rows", "-queue", "jobs", "-state", "scheduled", "-limit", "2")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 5 || !strings.HasPrefix(lines[2], ids[0]+" ") || !strings.HasPrefix(lines[4], "more rows: rerun with -after ") {
		t.Fatalf("rows: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = cli("rows", "-queue", "jobs", "-state", "scheduled", "-limit", "2", "-after", strings.TrimPrefix(lines[4], "more rows: rerun with -after "))
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); r.code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[2], ids[2]+" ") {
		t.Fatalf("rows, second page: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := cli("row", "show", ids[0]); r.code != 0 || !strings.Contains(r.stdout, "state") || !strings.Contains(r.stdout, "job 0") {
		t.Fatalf("row show: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := cli("row", "retry", ids[0]); r.code != 0 || !strings.Contains(r.stdout, "retry done") {
		t.Fatalf("row retry: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := cli("row", "retry", ids[0]); r.code != 1 || !strings.Contains(r.stderr, "nothing done") {
		t.Fatalf("row retry of a due row: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := cli("row", "cancel", ids[1]); r.code != 2 {
		t.Fatalf("row cancel without -yes: exit %d\n%s", r.code, r.stderr)
	}
	if r := cli("row", "cancel", ids[1], "-yes"); r.code != 0 {
		t.Fatalf("row cancel -yes: exit %d\n%s", r.code, r.stderr)
	}
	if r := cli("row", "dead-letter", ids[2], "-yes"); r.code != 2 || !strings.Contains(r.stderr, "-note") {
		t.Fatalf("row dead-letter without -note: exit %d\n%s", r.code, r.stderr)
	}
	if r := cli("row", "dead-letter", ids[2], "-yes", "-note", "ops: gone"); r.code != 0 {
		t.Fatalf("row dead-letter: exit %d\n%s", r.code, r.stderr)
	}
	r = cli("rows", "-queue", "jobs")
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); r.code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[2], ids[0]+" ") {
		t.Fatalf("rows after the actions: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// Filtered by message type and age.
	var listed []outbox.RowSummary
	if r := cli("rows", "-queue", "jobs", "-json"); r.code != 0 || json.Unmarshal([]byte(r.stdout), &listed) != nil || len(listed) != 1 ||
		listed[0].MessageType == "" {
		t.Fatalf("rows -json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-type", listed[0].MessageType, "-newer-than", "1h"}, ids[0] + " "},
		{[]string{"-type", "other.Type"}, "(no rows)"},
		{[]string{"-older-than", "1h"}, "(no rows)"},
	} {
		r := cli(append([]string{"rows", "-queue", "jobs"}, c.args...)...)
		if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); r.code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[2], c.want) {
			t.Errorf("rows %q: exit %d\n%s%s", c.args, r.code, r.stdout, r.stderr)
		}
	}
	if r := cli("rows", "-queue", "jobs", "-older-than", "-1s"); r.code != 2 {
		t.Errorf("rows -older-than -1s: exit %d, want 2\n%s", r.code, r.stderr)
	}
}
