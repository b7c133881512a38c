package outbox

import (
	"fmt"
	"slices"
	"testing"
)

// hotPathRows is how many rows TestHotPathStatementsStepOverNoRowAHeldSnapshotKeeps
// passes through the outbox under a held snapshot.
const hotPathRows = 4000

// hotPathGrowing are the hot-path statements whose blocks may still grow
// with the row versions a held snapshot keeps, and why each is left so.
var hotPathGrowing = map[string]string{
	"claim-queue-sweep": "the claim that reads the queue from its start, at most every MaxFetchInterval, " +
		"for rows that landed behind the floor",
	"publish-key-drained": "a key without rows: its probe reads the key's own dead entries, " +
		"as nothing tells a writer where the key's live rows would start",
	"publish-batch-keyed":    "a batch of a key without rows: its probe, as publish-key-drained",
	"trg-key-insert-drained": "the probe of publish-key-drained, on its own",
	"sweep-locks":            "the sweep of the records of claims by lock, every MaxFetchInterval, reads them all",
	"record-lock": "while <table>_locks is a few dozen pages, the planner reads it whole rather than " +
		"through the index on the records' ids",
	"recorded-among": "as record-lock",
}

// hotPathSlack is how many more blocks after hotPathRows rows than after
// half as many a statement may touch: a page split, a hint bit.
func hotPathSlack(base int) int { return 4 + base/10 }

// Every statement the hot path sends touches as many blocks of the
// outbox's relations after hotPathRows rows went through the outbox under
// a held REPEATABLE READ snapshot (keyed and unkeyed, claimed by lease and
// by lock, retried, dead-lettered, handed over, with sleeps and
// wake-ups) as after half as many: its scans start past the row versions
// the snapshot keeps, so what it touches does not grow with them. (After
// no rows at all the indexes are a level shallower, which every
// statement that writes pays for each row it writes.) The statements are
// BenchmarkHotPathBuffersUnderAHeldSnapshot's, sent as the library sends
// them, before the tables were analyzed and after;
// TestEveryHotPathQueryIsMeasuredUnderAHeldSnapshot fails when the hot
// path sends one it does not measure. Those that still grow are listed,
// with why, in hotPathGrowing.
func TestHotPathStatementsStepOverNoRowAHeldSnapshotKeeps(t *testing.T) {
	t.Parallel()
	// Each outbox holds its snapshot until its subtest ends: the tests
	// that hold one take turns.
	measure := func(n int) map[string][2]hotPathCost {
		out := map[string][2]hotPathCost{}
		t.Run(fmt.Sprintf("rows=%d", n), func(t *testing.T) {
			h := newHotPathBench(t)
			h.churn(n)
			h.settle()
			for pass := range 2 {
				if pass == 1 {
					h.analyze()
				}
				for _, c := range h.measureOnNewSession() {
					got := out[c.name]
					got[pass] = c
					out[c.name] = got
				}
			}
		})
		return out
	}
	base, held := measure(hotPathRows/2), measure(hotPathRows)
	var grew []string
	for name, costs := range held {
		for pass, c := range costs {
			b := base[name][pass]
			t.Logf("%-22s %-8s rows=%d %5d  rows=%d %5d  %s  (rows=%d: %s)", name, []string{"none", "analyzed"}[pass],
				hotPathRows/2, b.all, hotPathRows, c.all, c.top(), hotPathRows/2, b.top())
			if c.all > b.all+hotPathSlack(b.all) && !slices.Contains(grew, name) {
				grew = append(grew, name)
			}
		}
	}
	for _, name := range grew {
		if _, ok := hotPathGrowing[name]; !ok {
			t.Errorf("%s touches more blocks after %d rows under a held snapshot than after %d (see the log)", name, hotPathRows, hotPathRows/2)
		}
	}
	for name, why := range hotPathGrowing {
		if _, ok := held[name]; !ok {
			t.Errorf("hotPathGrowing names %s, which is not measured", name)
		} else if !slices.Contains(grew, name) {
			t.Logf("%s did not grow this time (%s)", name, why)
		}
	}
	if len(held) != len(base) {
		t.Errorf("%d statements measured after %d rows, %d after %d", len(held), hotPathRows, len(base), hotPathRows/2)
	}
}
