package outbox

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jackc/pgx/v5"
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
	res, err := e.ob.ReplayDeadLetters(e.ctx, DeadLetterFilter{Queue: "orders"}, &ReplayOpts{Progress: func(done, total int64) {
		calls++
		if total != n || done > total {
			t.Errorf("progress %d/%d", done, total)
		}
	}})
	if moved := res.Replayed; err != nil || moved != n {
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
	res, err := e.ob.ReplayDeadLetters(ctx, DeadLetterFilter{}, &ReplayOpts{Progress: func(done, total int64) {
		if done >= total/2 {
			cancel()
		}
	}})
	moved := res.Replayed
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

// timerRow is an outbox row's queue, payload and timer id.
type timerRow struct {
	Queue, Payload string
	TimerID        *string
}

// timerRows reads every row of table, in payload order.
func (e *env) timerRows(table string) []timerRow {
	e.t.Helper()
	rows, err := e.db.Pool.Query(e.ctx, `SELECT queue, convert_from(payload, 'UTF8'), timer_id FROM `+
		pgx.Identifier{table}.Sanitize()+` ORDER BY 2`)
	if err != nil {
		e.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[timerRow])
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

func TestReplayDeadLettersConflictingTimerIDs(t *testing.T) {
	t.Parallel()
	for _, drop := range []bool{false, true} {
		t.Run(fmt.Sprintf("drop=%v", drop), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			// Rows 1-6 and 700 in one queue: 3 collides with a live row,
			// 5 and 700 share a timer id with 4, 6 has none.
			e.deadLettered("orders", 1, 6, ReasonRejected)
			e.deadLettered("orders", 700, 1, ReasonRejected)
			e.exec(`UPDATE outbox_dlq SET timer_id = CASE WHEN id IN (5, 700) THEN 't-4' ELSE 't-' || id END WHERE id <> 6`)
			e.exec(`INSERT INTO outbox (queue, payload, timer_id) VALUES ('orders', 'live', 't-3'), ('other', 'other', 't-1')`)

			// The dry run reads what the replay then does.
			dry, err := e.ob.ReplayDeadLetters(e.ctx, DeadLetterFilter{}, &ReplayOpts{DropConflictingTimerIDs: drop, DryRun: true})
			if err != nil {
				t.Fatal(err)
			}
			res, err := e.ob.ReplayDeadLetters(e.ctx, DeadLetterFilter{}, &ReplayOpts{DropConflictingTimerIDs: drop})
			if err != nil {
				t.Fatal(err)
			}
			conflicts := []TimerConflict{{3, "orders", "t-3"}, {5, "orders", "t-4"}, {700, "orders", "t-4"}}
			want := ReplayResult{Matched: 7, UpToID: 700, Replayed: 4, Skipped: conflicts}
			wantOutbox := []timerRow{
				{"orders", "live", ptr("t-3")}, {"other", "other", ptr("t-1")},
				{"orders", "payload-1", ptr("t-1")}, {"orders", "payload-2", ptr("t-2")},
				{"orders", "payload-4", ptr("t-4")}, {"orders", "payload-6", nil},
			}
			wantDLQ := []timerRow{{"orders", "payload-3", ptr("t-3")}, {"orders", "payload-5", ptr("t-4")}, {"orders", "payload-700", ptr("t-4")}}
			if drop {
				want = ReplayResult{Matched: 7, UpToID: 700, Replayed: 7, TimerIDsDropped: conflicts}
				wantOutbox = append(wantOutbox, timerRow{"orders", "payload-3", nil}, timerRow{"orders", "payload-5", nil}, timerRow{"orders", "payload-700", nil})
				wantDLQ = []timerRow{}
			}
			if diff := cmp.Diff(want, res); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(want, dry); diff != "" {
				t.Errorf("dry run (-want +got):\n%s", diff)
			}
			byPayload := func(a, b timerRow) bool { return a.Payload < b.Payload }
			if diff := cmp.Diff(wantOutbox, e.timerRows("outbox"), cmpopts.SortSlices(byPayload)); diff != "" {
				t.Errorf("outbox (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantDLQ, e.timerRows("outbox_dlq"), cmpopts.SortSlices(byPayload)); diff != "" {
				t.Errorf("DLQ (-want +got):\n%s", diff)
			}
		})
	}
}

// A publisher that commits a timer id while a replay batch is inserting it
// costs that row only: the batch runs again and skips it.
func TestReplayDeadLettersRacingPublisher(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.deadLettered("orders", 1, 5, ReasonRejected)
	e.exec(`UPDATE outbox_dlq SET timer_id = 't-' || id`)

	tx, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var txPID int
	if err := tx.QueryRow(e.ctx, `INSERT INTO outbox (queue, payload, timer_id) VALUES ('orders', 'racer', 't-3')
		RETURNING pg_backend_pid()`).Scan(&txPID); err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		res ReplayResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := e.ob.ReplayDeadLetters(e.ctx, DeadLetterFilter{}, nil)
		done <- outcome{res, err}
	}()
	// Commit once the replay waits on the publisher's uncommitted row.
	for waiting := false; !waiting; {
		select {
		case got := <-done:
			t.Fatalf("replay ended before it met the publisher's row: %+v", got)
		default:
		}
		if err := e.db.Pool.QueryRow(e.ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)))`,
			txPID).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	got := <-done
	if got.err != nil {
		t.Fatal(got.err)
	}
	if diff := cmp.Diff(ReplayResult{Matched: 5, UpToID: 5, Replayed: 4, Skipped: []TimerConflict{{3, "orders", "t-3"}}}, got.res); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]timerRow{{"orders", "payload-3", ptr("t-3")}}, e.timerRows("outbox_dlq")); diff != "" {
		t.Errorf("DLQ (-want +got):\n%s", diff)
	}
	if n := e.count("outbox"); n != 5 {
		t.Errorf("%d rows in the outbox, want the racer and 4 replayed", n)
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
	res, err := e.ob.PurgeDeadLetters(e.ctx, DeadLetterFilter{OlderThan: 30 * time.Minute}, nil)
	if err != nil || res.Deleted != 4 {
		t.Fatalf("purge older than 30m: %+v, %v; want 4", res, err)
	}
	if left := e.count("outbox_dlq"); left != 1 {
		t.Errorf("%d rows left, want the fresh one", left)
	}
	for _, f := range []DeadLetterFilter{{Reason: "nope"}, {OlderThan: -time.Second}} {
		var in *InputError
		if _, err := e.ob.PurgeDeadLetters(e.ctx, f, nil); !errors.As(err, &in) {
			t.Errorf("purge %+v: %v, want an *InputError", f, err)
		}
	}
}

// A replayed row carries the id of its dead letter and when it first
// failed, keeps its own headers, and is delivered as any row is; replayed
// again after failing again, it keeps its first failure time.
func TestReplayLinksRowsToTheirDeadLetters(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.deadLettered("orders", 41, 1, ReasonRetryExhausted)
	var failedAt time.Time
	if err := e.db.Pool.QueryRow(e.ctx, "SELECT failed_at FROM outbox_dlq WHERE id = 41").Scan(&failedAt); err != nil {
		t.Fatal(err)
	}
	first := failedAt.UTC().Format("2006-01-02T15:04:05.000000Z")
	if n, err := e.ob.CountDeadLetters(e.ctx, DeadLetterFilter{Queue: "orders"}); err != nil || n != 1 {
		t.Fatalf("CountDeadLetters: %d, %v; want 1", n, err)
	}
	if res, err := e.ob.ReplayDeadLetters(e.ctx, DeadLetterFilter{}, nil); err != nil || res.Replayed != 1 {
		t.Fatalf("replay: %+v, %v", res, err)
	}
	got := make(chan map[string]string, 1)
	s := startSub(t, e.ob, []string{"orders"}, func(_ context.Context, m *Message[string]) error {
		got <- m.Headers
		return nil
	}, nil)
	var h map[string]string
	select {
	case h = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("the replayed row was not delivered")
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{HeaderContentType: "text/plain; charset=utf-8", "x": "y",
		HeaderReplayedFrom: "41", HeaderFirstFailedAt: first}
	if diff := cmp.Diff(want, h); diff != "" {
		t.Errorf("headers of the replayed row (-want +got):\n%s", diff)
	}
	if n := e.count("outbox"); n != 0 {
		t.Errorf("%d rows left after the delivery", n)
	}

	// Dead-lettered again later under another id, replayed again: the
	// latest dead letter's id, the first failure's time.
	e.exec(`INSERT INTO outbox_dlq (id, queue, payload, headers, deliveries_count, attempts_count, created_at, failed_at, failure_reason)
		VALUES (97, 'orders', 'p', $1, 1, 1, now(), now(), 'rejected')`, h)
	if _, err := e.ob.ReplayDeadLetters(e.ctx, DeadLetterFilter{}, nil); err != nil {
		t.Fatal(err)
	}
	var again map[string]string
	if err := e.db.Pool.QueryRow(e.ctx, "SELECT headers FROM outbox").Scan(&again); err != nil {
		t.Fatal(err)
	}
	if again[HeaderReplayedFrom] != "97" || again[HeaderFirstFailedAt] != first {
		t.Errorf("replayed twice: %s %q, %s %q; want 97 and %q", HeaderReplayedFrom, again[HeaderReplayedFrom],
			HeaderFirstFailedAt, again[HeaderFirstFailedAt], first)
	}
}
