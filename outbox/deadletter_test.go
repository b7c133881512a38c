package outbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// deadLettered puts n rows of queue straight into the DLQ, ids from first.
func (e *env) deadLettered(queue string, first, n int, reason string) {
	e.t.Helper()
	e.exec(`INSERT INTO outbox_dlq (id, queue, payload, headers, deliveries_count, attempts_count, created_at, failed_at, failure_reason, last_error)
		SELECT i, $1, convert_to('payload-' || i, 'UTF8'), '{"content-type": "text/plain; charset=utf-8", "x": "y"}',
		       3, 3, now() - interval '2 hours', now() - interval '1 hour', $4, 'boom'
		FROM generate_series($2::bigint, $2::bigint + $3 - 1) AS i`, queue, first, n, reason)
}

func TestReplayDeadLettersMovesEveryRowOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 10000
	e.deadLettered("orders", 1, n, ReasonRetryExhausted)
	e.deadLettered("other", n+1, 5, ReasonRetryExhausted)
	var calls int
	moved, err := e.ob.ReplayDeadLetters(e.ctx, DeadLetterFilter{Queue: "orders"}, func(done, total int64) {
		calls++
		if total != n || done > total {
			t.Errorf("progress %d/%d", done, total)
		}
	})
	if err != nil || moved != n {
		t.Fatalf("replayed %d, %v; want %d", moved, err, n)
	}
	if calls != n/replayBatch {
		t.Errorf("progress called %d times, want %d", calls, n/replayBatch)
	}
	var rows, distinct, fresh int
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT count(*), count(DISTINCT payload),
		count(*) FILTER (WHERE attempts_count = 0 AND deliveries_count = 0 AND headers->>'x' = 'y') FROM outbox`).Scan(&rows, &distinct, &fresh); err != nil {
		t.Fatal(err)
	}
	if rows != n || distinct != n || fresh != n {
		t.Errorf("outbox holds %d rows, %d distinct, %d reset with headers; want %d each", rows, distinct, fresh, n)
	}
	if left := e.count("outbox_dlq"); left != 5 {
		t.Errorf("%d rows left in the DLQ, want the 5 of the other queue", left)
	}
}

func TestInterruptedReplayLeavesEveryRowInOneTable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 3000
	e.deadLettered("orders", 1, n, ReasonRejected)
	ctx, cancel := context.WithCancel(e.ctx)
	moved, err := e.ob.ReplayDeadLetters(ctx, DeadLetterFilter{}, func(done, total int64) {
		if done >= total/2 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) || moved == 0 || moved >= n {
		t.Fatalf("replay: moved %d, %v; want a part, then context.Canceled", moved, err)
	}
	var both, union int
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT
		(SELECT count(*) FROM outbox o JOIN outbox_dlq d ON d.payload = o.payload),
		(SELECT count(*) FROM (SELECT payload FROM outbox UNION SELECT payload FROM outbox_dlq) u)`).Scan(&both, &union); err != nil {
		t.Fatal(err)
	}
	if both != 0 || union != n || e.count("outbox") != int(moved) {
		t.Errorf("%d rows in both tables, %d distinct in all, %d in the outbox; want 0, %d, %d", both, union, e.count("outbox"), n, moved)
	}
}

func TestDeadLetterListAndPurge(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.deadLettered("a", 1, 3, ReasonRejected)
	e.deadLettered("b", 4, 2, ReasonDecodeError)
	e.exec("UPDATE outbox_dlq SET failed_at = now() WHERE id = 5")

	got, err := e.ob.DeadLetters(e.ctx, DeadLetterFilter{Reason: ReasonDecodeError}, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != 4 || got[0].Queue != "b" || string(got[0].Payload) != "payload-4" ||
		got[0].Headers["x"] != "y" || got[0].LastError != "boom" || got[0].Attempts != 3 {
		t.Errorf("list: %+v", got)
	}
	page, _ := e.ob.DeadLetters(e.ctx, DeadLetterFilter{}, 2, 2)
	if diff := cmp.Diff([]int64{3, 4}, []int64{page[0].ID, page[1].ID}); diff != "" {
		t.Errorf("page after id 2 (-want +got):\n%s", diff)
	}
	n, err := e.ob.PurgeDeadLetters(e.ctx, DeadLetterFilter{OlderThan: 30 * time.Minute})
	if err != nil || n != 4 {
		t.Fatalf("purge older than 30m: %d, %v; want 4", n, err)
	}
	if left := e.count("outbox_dlq"); left != 1 {
		t.Errorf("%d rows left, want the fresh one", left)
	}
	for _, f := range []DeadLetterFilter{{Reason: "nope"}, {OlderThan: -time.Second}} {
		var in *InputError
		if _, err := e.ob.PurgeDeadLetters(e.ctx, f); !errors.As(err, &in) {
			t.Errorf("purge %+v: %v, want an *InputError", f, err)
		}
	}
}
