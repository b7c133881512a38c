package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// rebase refuses to run without -yes; with it, it deletes the ring's rows
// their lanes had consumed, gives the rest one transaction id (its own),
// forgets the lanes' progress, and says what it did.
func TestRebaseMakesTheRingReadFromItsStart(t *testing.T) {
	t.Parallel()
	d, _, env, flags := migrated(t)
	exec := func(sql string) {
		t.Helper()
		if _, err := d.Pool.Exec(t.Context(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// Two rows every lane has read past, then three no lane has.
	exec(`INSERT INTO outbox_ring (queue, payload) SELECT 'orders', 'read' FROM generate_series(1, 2)`)
	exec(`INSERT INTO outbox_ring_lanes (queue, lane) SELECT 'orders', l FROM generate_series(0, 7) AS l`)
	exec(`INSERT INTO outbox_ring_progress (queue, lane, snap) SELECT 'orders', l, pg_current_snapshot() FROM generate_series(0, 7) AS l`)
	exec(`INSERT INTO outbox_ring (queue, payload) SELECT 'orders', 'unread' FROM generate_series(1, 3)`)

	if r := runCLI(t, env, append([]string{"rebase"}, flags...)...); r.code != 2 || !strings.Contains(r.stderr, "-yes is required") {
		t.Fatalf("rebase without -yes: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	r := runCLI(t, env, append([]string{"rebase", "-yes"}, flags...)...)
	if want := "rebased the ring: deleted 2 rows its lanes had consumed, kept 3 for every lane to read from the start\n"; r.code != 0 ||
		!strings.HasSuffix(r.stdout, want) {
		t.Fatalf("rebase -yes: exit %d %q %q; want %q", r.code, r.stdout, r.stderr, want)
	}
	var got []string
	if err := d.Pool.QueryRow(t.Context(), `SELECT array_agg(convert_from(payload, 'UTF8') ORDER BY id)
		|| (SELECT count(DISTINCT txid)::text FROM outbox_ring) || (SELECT count(*)::text FROM outbox_ring_progress)
		FROM outbox_ring`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"unread", "unread", "unread", "1", "0"}, got); diff != "" {
		t.Errorf("the ring's rows, their transaction ids and the progress left (-want +got):\n%s", diff)
	}
}
