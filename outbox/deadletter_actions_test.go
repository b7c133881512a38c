package outbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
)

// keyedDeadLetters puts n dead letters of queue "orders" with ids from
// first under ordering key k into the DLQ, each with a timer id of its own.
func (e *env) keyedDeadLetters(first, n int, k string) {
	e.t.Helper()
	e.exec(`INSERT INTO outbox_dlq (id, queue, payload, ordering_key, timer_id, deliveries_count, attempts_count, created_at, failed_at, failure_reason)
		SELECT i, 'orders', convert_to('payload-' || i, 'UTF8'), $3, 't-' || i, 3, 3, now(), now(), 'rejected'
		FROM generate_series($1::bigint, $1::bigint + $2 - 1) AS i`, first, n, k)
}

// writes is what a dry run must leave as it found: the outbox's rows and
// id sequence, and the dead letters a row lock marked (xmax).
type writes struct {
	OutboxRows, LastID, LockedDeadLetters int64
}

func (e *env) writes() writes {
	e.t.Helper()
	var w writes
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT (SELECT count(*) FROM outbox),
			(SELECT coalesce(last_value, 0) FROM pg_sequences WHERE schemaname = current_schema() AND sequencename = 'outbox_id_seq'),
			(SELECT count(*) FROM outbox_dlq WHERE xmax <> '0')`).Scan(&w.OutboxRows, &w.LastID, &w.LockedDeadLetters); err != nil {
		e.t.Fatal(err)
	}
	return w
}

// A dry run reads: it inserts no row (so it takes no id and leaves no
// dead row version) and locks no dead letter, yet it says what the replay
// would do.
func TestReplayDryRunWritesAndLocksNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.keyedDeadLetters(1, 1200, "customer-1")
	e.exec(`INSERT INTO outbox (queue, payload, timer_id) VALUES ('orders', 'live', 't-7')`)
	before := e.writes()
	res, err := e.ob.ReplayDeadLetters(e.ctx, DeadLetterFilter{Queue: "orders"}, &ReplayOpts{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	want := ReplayResult{Matched: 1200, UpToID: 1200, Replayed: 1199, Skipped: []TimerConflict{{7, "orders", "t-7"}}}
	if diff := cmp.Diff(want, res); diff != "" {
		t.Errorf("dry run (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(before, e.writes()); diff != "" {
		t.Errorf("the dry run wrote or locked (-before +after):\n%s", diff)
	}
	if n := e.count("outbox_dlq"); n != 1200 {
		t.Errorf("%d dead letters after the dry run, want 1200", n)
	}
}

// While a dry run's reads are open, a publisher of a key the dead letters
// hold does not wait for it: the dry run holds no advisory lock, no row
// lock and no lock on a table but the reader's.
func TestReplayDryRunHoldsNoLockAPublisherWaitsFor(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.keyedDeadLetters(1, 600, "customer-1")
	tx, err := e.db.Pool.BeginTx(e.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	res, err := e.ob.replayDryRun(e.ctx, tx, DeadLetterFilter{}, false)
	if err != nil || res.Replayed != 600 {
		t.Fatalf("dry run: %+v, %v", res, err)
	}
	var pid int32
	if err := tx.QueryRow(e.ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	var held []string
	rows, err := e.db.Pool.Query(e.ctx, `SELECT locktype || ' ' || mode FROM pg_locks
		WHERE pid = $1 AND NOT (locktype = 'relation' AND mode = 'AccessShareLock') AND locktype NOT IN ('virtualxid')
		ORDER BY 1`, pid)
	if err != nil {
		t.Fatal(err)
	}
	if held, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(held) != 0 {
		t.Errorf("the open dry run holds %v", held)
	}

	// A lock wait would end in lock_timeout's error rather than hang.
	pub := newPublisher[order](t, e, "orders", nil)
	ptx := e.begin()
	if _, err := ptx.Exec(e.ctx, "SET LOCAL lock_timeout = '10s'"); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(e.ctx, ptx, order{ID: "o-1"}, &PublishOpts{OrderingKey: "customer-1"}); err != nil {
		t.Fatalf("a keyed publish during the dry run: %v", err)
	}
	if err := ptx.Commit(e.ctx); err != nil {
		t.Fatalf("commit during the dry run: %v", err)
	}
}

// The bound a dry run returns keeps its confirmation to the rows it
// counted, and the confirmation's Matched says when that set changed.
func TestActionWithinDryRunBoundLeavesLaterDeadLetters(t *testing.T) {
	t.Parallel()
	for _, action := range []string{"replay", "purge"} {
		t.Run(action, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			e.deadLettered("orders", 1, 5, ReasonRejected)
			f := DeadLetterFilter{Queue: "orders"}
			var matched, upTo int64
			if action == "replay" {
				dry, err := e.ob.ReplayDeadLetters(e.ctx, f, &ReplayOpts{DryRun: true})
				if err != nil {
					t.Fatal(err)
				}
				matched, upTo = dry.Matched, dry.UpToID
			} else {
				dry, err := e.ob.PurgeDeadLetters(e.ctx, f, &PurgeOpts{DryRun: true})
				if err != nil || dry.Deleted != 0 {
					t.Fatal(dry, err)
				}
				matched, upTo = dry.Matched, dry.UpToID
			}
			if matched != 5 || upTo != 5 || e.count("outbox_dlq") != 5 {
				t.Fatalf("dry run: matched %d up to %d, %d dead letters left; want 5, 5, 5", matched, upTo, e.count("outbox_dlq"))
			}
			// Dead-lettered after the dry run, and one taken by someone else.
			e.deadLettered("orders", 6, 3, ReasonRejected)
			e.exec(`DELETE FROM outbox_dlq WHERE id = 2`)

			f.UpToID = &upTo
			var got [2]int64 // matched, acted on
			if action == "replay" {
				res, err := e.ob.ReplayDeadLetters(e.ctx, f, nil)
				if err != nil {
					t.Fatal(err)
				}
				got = [2]int64{res.Matched, res.Replayed}
			} else {
				res, err := e.ob.PurgeDeadLetters(e.ctx, f, nil)
				if err != nil {
					t.Fatal(err)
				}
				got = [2]int64{res.Matched, res.Deleted}
			}
			if diff := cmp.Diff([2]int64{4, 4}, got); diff != "" {
				t.Errorf("matched and acted on (-want +got):\n%s", diff)
			}
			var left []int64
			rows, err := e.db.Pool.Query(e.ctx, "SELECT id FROM outbox_dlq ORDER BY id")
			if err != nil {
				t.Fatal(err)
			}
			if left, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]int64{6, 7, 8}, left); diff != "" {
				t.Errorf("dead letters left (-want +got):\n%s", diff)
			}
		})
	}
}

// A purge deletes in batches that commit: cancelled after its first, it
// has deleted that batch's rows, the lowest ids, for good, and run again
// with the same filter and bound it deletes the rest.
func TestInterruptedPurgeKeepsItsBatchesAndResumes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 2*purgeBatch + 300
	e.deadLettered("orders", 1, n, ReasonRejected)
	e.deadLettered("other", n+1, 3, ReasonRejected)
	dry, err := e.ob.PurgeDeadLetters(e.ctx, DeadLetterFilter{Queue: "orders"}, &PurgeOpts{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	f := DeadLetterFilter{Queue: "orders", UpToID: &dry.UpToID}
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	var calls [][2]int64
	res, err := e.ob.PurgeDeadLetters(ctx, f, &PurgeOpts{Progress: func(done, total int64) {
		calls = append(calls, [2]int64{done, total})
		cancel()
	}})
	if !errors.Is(err, context.Canceled) || res.Deleted != purgeBatch {
		t.Fatalf("interrupted purge: %+v, %v; want %d deleted, then context.Canceled", res, err, purgeBatch)
	}
	var lowest int64
	if err := e.db.Pool.QueryRow(e.ctx, "SELECT min(id) FROM outbox_dlq").Scan(&lowest); err != nil {
		t.Fatal(err)
	}
	if left := e.count("outbox_dlq"); left != n+3-purgeBatch || lowest != purgeBatch+1 {
		t.Errorf("after the first batch: %d dead letters from id %d; want %d from %d", left, lowest, n+3-purgeBatch, purgeBatch+1)
	}
	res, err = e.ob.PurgeDeadLetters(e.ctx, f, &PurgeOpts{Progress: func(done, total int64) {
		calls = append(calls, [2]int64{done, total})
	}})
	if err != nil || res.Deleted != n-purgeBatch {
		t.Fatalf("purge again: %+v, %v; want %d deleted", res, err, n-purgeBatch)
	}
	want := [][2]int64{{purgeBatch, n}, {purgeBatch, n - purgeBatch}, {n - purgeBatch, n - purgeBatch}}
	if diff := cmp.Diff(want, calls); diff != "" {
		t.Errorf("progress (-want +got):\n%s", diff)
	}
	if left := e.count("outbox_dlq"); left != 3 {
		t.Errorf("%d dead letters left, want the other queue's 3", left)
	}
}

// A replay moves batches that commit: interrupted, the rows moved stay
// moved, and run again with the dry run's bound it moves each of the
// others once.
func TestInterruptedReplayResumesWithinItsBound(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 2*replayBatch + 100
	e.keyedDeadLetters(1, n, "customer-1")
	dry, err := e.ob.ReplayDeadLetters(e.ctx, DeadLetterFilter{}, &ReplayOpts{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	f := DeadLetterFilter{UpToID: &dry.UpToID}
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	res, err := e.ob.ReplayDeadLetters(ctx, f, &ReplayOpts{Progress: func(done, total int64) { cancel() }})
	if !errors.Is(err, context.Canceled) || res.Replayed != replayBatch || e.count("outbox") != replayBatch {
		t.Fatalf("interrupted replay: %+v, %v, %d in the outbox; want %d moved, then context.Canceled", res, err, e.count("outbox"), replayBatch)
	}
	e.deadLettered("orders", n+1, 2, ReasonRejected) // after the dry run: left
	res, err = e.ob.ReplayDeadLetters(e.ctx, f, nil)
	if err != nil || res.Replayed != n-replayBatch || res.Matched != n-replayBatch {
		t.Fatalf("replay again: %+v, %v; want %d matched and moved", res, err, n-replayBatch)
	}
	// Every dead letter once, in the key's order.
	var rows, distinct int
	var ordered bool
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT count(*), count(DISTINCT timer_id),
		coalesce(bool_and(prev IS NULL OR prev < num), true)
		FROM (SELECT timer_id, substr(timer_id, 3)::int AS num, lag(substr(timer_id, 3)::int) OVER (ORDER BY id) AS prev FROM outbox) o`).
		Scan(&rows, &distinct, &ordered); err != nil {
		t.Fatal(err)
	}
	if rows != n || distinct != n || !ordered {
		t.Errorf("outbox: %d rows, %d distinct, in dead-letter order %v; want %d, %d, true", rows, distinct, ordered, n, n)
	}
	if left := e.count("outbox_dlq"); left != 2 {
		t.Errorf("%d dead letters left, want the 2 of after the dry run", left)
	}
}

// A list of previews reads a bounded prefix of each payload, however
// large, with the payload's size; one dead letter read alone is whole.
func TestNewestDeadLetterPreviewsReadABoundedPrefix(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const big = 3 << 20
	e.exec(`INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason) VALUES
		(1, 'orders', convert_to(repeat('é', $1 / 2), 'UTF8'), 1, 1, now(), 'rejected'),
		(2, 'orders', 'small', 1, 1, now(), 'rejected')`, big)
	got, err := e.ob.NewestDeadLetterPreviews(e.ctx, DeadLetterFilter{}, 1<<62, 10, 320)
	if err != nil {
		t.Fatal(err)
	}
	type preview struct {
		ID, Read, Size int
		Cut            bool
		Payload        string
	}
	var have []preview
	for _, d := range got {
		have = append(have, preview{int(d.ID), len(d.Payload), d.PayloadSize, d.PayloadCut, string(d.Payload)})
	}
	want := []preview{{2, 5, 5, false, "small"}, {1, 320, big, true, strings.Repeat("é", 160)}}
	if diff := cmp.Diff(want, have); diff != "" {
		t.Errorf("previews (-want +got):\n%s", diff)
	}
	whole, ok, err := e.ob.DeadLetter(e.ctx, 1)
	if err != nil || !ok || len(whole.Payload) != big || whole.PayloadSize != big || whole.PayloadCut {
		t.Errorf("DeadLetter(1): %d bytes of %d, cut %v, %v, %v", len(whole.Payload), whole.PayloadSize, whole.PayloadCut, ok, err)
	}
	if _, err := e.ob.NewestDeadLetterPreviews(e.ctx, DeadLetterFilter{}, 1<<62, 10, -1); err == nil {
		t.Error("a negative prefix was taken")
	}
}
