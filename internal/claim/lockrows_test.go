package claim

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/db"
)

// TestLockRowsComeBackEmpty checks the slices claims scan into: one
// taken from the pool is empty with room for the rows asked for, and one
// given back holds on to no row it held.
func TestLockRowsComeBackEmpty(t *testing.T) {
	t.Parallel()
	rows := getLockRows(3)
	if len(rows) != 0 || cap(rows) < 3 {
		t.Fatalf("getLockRows(3): len %d cap %d, want 0 and at least 3", len(rows), cap(rows))
	}
	rows = append(rows, db.LockRow{ID: 1, Payload: []byte("x")}, db.LockRow{ID: 2, Headers: []byte("{}")})
	putLockRows(rows)
	if diff := cmp.Diff(make([]db.LockRow, 2), rows[:2]); diff != "" {
		t.Errorf("rows given back still hold values (-want +got):\n%s", diff)
	}
	if more := getLockRows(cap(rows) + 1); len(more) != 0 || cap(more) <= cap(rows) {
		t.Errorf("getLockRows(%d): len %d cap %d", cap(rows)+1, len(more), cap(more))
	}
	putLockRows(nil)
}
