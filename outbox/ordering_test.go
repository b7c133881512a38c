package outbox

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
)

// publishKeyed inserts a due row of queue with ordering key k.
func (e *env) publishKeyed(queue, k string) int64 {
	e.t.Helper()
	return e.publishWith(db.PublishParams{Queue: queue, Payload: []byte(`{}`), OrderingKey: &k})
}

// ack deletes claimed rows with their leases, as a subscriber's
// acknowledgement does, and fails unless every one was deleted.
func (e *env) ack(rows ...claimed) {
	e.t.Helper()
	got, err := e.q.DeleteBatchWithLease(e.ctx, db.DeleteBatchWithLeaseParams{Ids: ids(rows), Tokens: tokens(rows...)})
	if err != nil || len(got) != len(rows) {
		e.t.Fatalf("ack %v: deleted %d, %v", ids(rows), len(got), err)
	}
}

// headBeforeAnUncommittedRow leases the head of key k of queue q and
// inserts the key's next row, payload "next", in a transaction it leaves
// open (rolled back when the test ends unless committed).
func (e *env) headBeforeAnUncommittedRow() (head claimed, publisher pgx.Tx, next int64) {
	e.t.Helper()
	e.publishKeyed("q", "k")
	head = e.claim(1, "q")[0]
	publisher, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = publisher.Rollback(context.Background()) })
	if err := publisher.QueryRow(e.ctx, `INSERT INTO outbox (queue, payload, ordering_key) VALUES ('q', 'next', 'k') RETURNING id`).Scan(&next); err != nil {
		e.t.Fatal(err)
	}
	return head, publisher, next
}

// handOffs counts the hand-overs recorded for later completion.
func (e *env) handOffs() int { return e.count(e.ob.Table() + "_handoff") }

func TestOnlyTheHeadOfAKeyIsClaimable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a1, a2, a3 := e.publishKeyed("q", "a"), e.publishKeyed("q", "a"), e.publishKeyed("q", "a")
	b1, b2 := e.publishKeyed("q", "b"), e.publishKeyed("q", "b")
	u1, u2 := e.publish("q"), e.publish("q")

	first := e.claim(100, "q")
	if diff := cmp.Diff([]int64{a1, b1, u1, u2}, ids(first)); diff != "" {
		t.Fatalf("first claim (-want +got):\n%s", diff)
	}
	if again := e.claim(100, "q"); len(again) != 0 {
		t.Fatalf("claimed %v while every key's head is leased", ids(again))
	}
	e.ack(first[0])
	if got := ids(e.claim(100, "q")); !cmp.Equal(got, []int64{a2}) {
		t.Fatalf("after acking a's head: claimed %v, want [%d]", got, a2)
	}
	e.ack(first[1])
	if got := ids(e.claim(100, "q")); !cmp.Equal(got, []int64{b2}) {
		t.Fatalf("after acking b's head: claimed %v, want [%d]", got, b2)
	}
	if r, _ := e.row(a3); !r.Blocked {
		t.Errorf("row %d (third of key a) is not blocked", a3)
	}
	if n := e.handOffs(); n != 0 {
		t.Errorf("%d hand-overs recorded; every delete could hand over itself", n)
	}
}

// A batched claim takes at most one row of a key, however many are due,
// through both claim statements.
func TestBatchedClaimNeverTakesTwoRowsOfAKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for i := range 50 {
		e.publishKeyed("q1", fmt.Sprint("k", i%5))
		e.publishKeyed("q2", fmt.Sprint("k", i%5))
	}
	for _, queues := range [][]string{{"q1"}, {"q1", "q2"}} {
		rows := e.claim(100, queues...)
		seen := map[string]bool{}
		for _, r := range rows {
			k := r.Queue + "/" + *r.OrderingKey
			if seen[k] {
				t.Errorf("claim of %v took two rows of %s", queues, k)
			}
			seen[k] = true
		}
	}
}

func TestDeadLetteredHeadUnblocksItsKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.publishKeyed("q", "k")
	next := e.publishKeyed("q", "k")
	head := e.claim(10, "q")[0]
	n, err := e.q.DeadLetterWithLease(e.ctx, db.DeadLetterWithLeaseParams{Attempted: true, Reason: "rejected", ID: head.ID, Token: head.AcquiredToken})
	if err != nil || n != 1 {
		t.Fatalf("dead-letter: %d, %v", n, err)
	}
	if got := ids(e.claim(10, "q")); !cmp.Equal(got, []int64{next}) {
		t.Fatalf("after dead-lettering the head: claimed %v, want [%d]", got, next)
	}
}

func TestRetryingHeadBlocksItsKeyUntilItsRetrySucceeds(t *testing.T) {
	t.Parallel()
	e := setup(t)
	first := e.publishKeyed("q", "k")
	next := e.publishKeyed("q", "k")
	other := e.publishKeyed("q", "other")

	head := e.claim(1, "q")[0]
	retry := func(delay float64) {
		t.Helper()
		msg := "boom"
		n, err := e.q.MarkPendingWithLease(e.ctx, db.MarkPendingWithLeaseParams{DelaySeconds: delay, LastError: &msg, ID: head.ID, Token: head.AcquiredToken})
		if err != nil || n != 1 {
			t.Fatalf("retry: %d, %v", n, err)
		}
	}
	retry(3600)
	if got := ids(e.claim(10, "q")); !cmp.Equal(got, []int64{other}) {
		t.Fatalf("while k's head waits for its retry: claimed %v, want only [%d] of another key", got, other)
	}
	e.exec("UPDATE outbox SET next_attempt_at = now() WHERE id = $1", first)
	if head = e.claim(10, "q")[0]; head.ID != first {
		t.Fatalf("due retry: claimed %d, want the head %d", head.ID, first)
	}
	retry(0)
	if head = e.claim(10, "q")[0]; head.ID != first {
		t.Fatalf("second retry: claimed %d, want the head %d again", head.ID, first)
	}
	e.ack(head)
	if got := ids(e.claim(10, "q")); !cmp.Equal(got, []int64{next}) {
		t.Fatalf("after the retry succeeded: claimed %v, want [%d]", got, next)
	}
}

func TestScheduledHeadBlocksItsKeyUntilDue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	k := "k"
	head := e.publishWith(db.PublishParams{Queue: "q", Payload: []byte(`{}`), OrderingKey: &k, DelaySeconds: 3600})
	next := e.publishKeyed("q", k)
	if got := e.claim(10, "q"); len(got) != 0 {
		t.Fatalf("claimed %v while the key's head is scheduled an hour ahead", ids(got))
	}
	if _, err := e.q.NextDueIn(e.ctx, db.NextDueInParams{Queues: []string{"q"}}); err != nil {
		t.Fatalf("NextDueIn: %v (the scheduled head is the next due row)", err)
	}
	e.exec("UPDATE outbox SET next_attempt_at = now() WHERE id = $1", head)
	rows := e.claim(10, "q")
	if !cmp.Equal(ids(rows), []int64{head}) {
		t.Fatalf("head due: claimed %v, want [%d]", ids(rows), head)
	}
	e.ack(rows...)
	if got := ids(e.claim(10, "q")); !cmp.Equal(got, []int64{next}) {
		t.Fatalf("after the head: claimed %v, want [%d]", got, next)
	}
}

// An operator's DELETE of a head (or CancelTimer of a scheduled one) hands
// the key on like an acknowledgement; deleting a waiting row leaves the
// head alone.
func TestAnyDeleteOfAHeadHandsItsKeyOn(t *testing.T) {
	t.Parallel()
	e := setup(t)
	k, timer := "k", "t1"
	head := e.publishWith(db.PublishParams{Queue: "q", Payload: []byte(`{}`), OrderingKey: &k, TimerID: &timer, DelaySeconds: 3600})
	second, third, fourth := e.publishKeyed("q", k), e.publishKeyed("q", k), e.publishKeyed("q", k)
	if n, err := e.q.CancelTimer(e.ctx, db.CancelTimerParams{Queue: "q", TimerID: timer}); err != nil || n != 1 {
		t.Fatalf("CancelTimer: %d, %v", n, err)
	}
	if r, _ := e.row(second); r.Blocked {
		t.Fatal("cancelling the scheduled head did not unblock the next row")
	}
	e.exec("DELETE FROM outbox WHERE id = $1", third)
	e.exec("DELETE FROM outbox WHERE id = $1", second)
	if got := ids(e.claim(10, "q")); !cmp.Equal(got, []int64{fourth}) {
		t.Fatalf("after deleting rows by hand: claimed %v, want [%d]", got, fourth)
	}
	_ = head
}

// Rows of one key are delivered in the commit order of the transactions
// that published them, whatever ids those transactions would have drawn:
// the key's lock makes a later transaction wait, and the id is drawn
// under it.
func TestConcurrentPublishersOfOneKeyDeliverInCommitOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher[int](t, e, "q", nil)
	const txs = 12
	var (
		mu        sync.Mutex
		committed []int
		wg        sync.WaitGroup
	)
	errs := make(chan error, txs)
	for i := range txs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- pgx.BeginFunc(e.ctx, e.db.Pool, func(tx pgx.Tx) error {
				if _, err := pub.Publish(e.ctx, tx, i, &PublishOpts{OrderingKey: "k"}); err != nil {
					return err
				}
				// The key's lock is held from here to commit, so the
				// order of this append is the commit order.
				mu.Lock()
				committed = append(committed, i)
				mu.Unlock()
				time.Sleep(time.Duration(i%3) * 5 * time.Millisecond)
				return nil
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var delivered []int
	for range txs {
		rows := e.claim(10, "q")
		if len(rows) != 1 {
			t.Fatalf("claimed %d rows of one key, want 1", len(rows))
		}
		v, err := JSONCodec[int]{}.Decode(rows[0].Payload)
		if err != nil {
			t.Fatal(err)
		}
		delivered = append(delivered, v)
		e.ack(rows...)
	}
	if diff := cmp.Diff(committed, delivered); diff != "" {
		t.Errorf("delivery order differs from commit order (-commit +delivery):\n%s", diff)
	}
}

// A transaction that waits for a key's lock draws its id after the holder
// commits, even when the row's id was drawn (or given) before the wait.
func TestIDsOfAKeyFollowCommitOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	holder, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(e.ctx)
	if _, err := holder.Exec(e.ctx, `INSERT INTO outbox (queue, payload, ordering_key) VALUES ('q', 'first', 'k')`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		// An explicit, lower id: the trigger replaces it.
		_, err := e.db.Pool.Exec(e.ctx, `INSERT INTO outbox (id, queue, payload, ordering_key)
			OVERRIDING SYSTEM VALUE VALUES (1, 'q', 'second', 'k')`)
		done <- err
	}()
	eventually(t, "the second publisher to wait for the key", func() bool {
		var waiting bool
		_ = e.db.Pool.QueryRow(e.ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)`).Scan(&waiting)
		return waiting
	})
	if err := holder.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var got []string
	for range 2 {
		rows := e.claim(10, "q")
		if len(rows) != 1 {
			t.Fatalf("claimed %d rows, want 1", len(rows))
		}
		got = append(got, string(rows[0].Payload))
		e.ack(rows...)
	}
	if diff := cmp.Diff([]string{"first", "second"}, got); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
}

// Rows written with plain SQL, in one multi-row INSERT or through COPY,
// follow the same rules as the library's own.
func TestPlainSQLAndCopyRespectKeyOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.exec(`INSERT INTO outbox (queue, payload, ordering_key)
		SELECT 'q', convert_to('sql-' || i, 'UTF8'), 'k' || (i % 3) FROM generate_series(0, 29) AS i`)
	src := make([][]any, 30)
	for i := range src {
		src[i] = []any{"q", []byte(fmt.Sprint("copy-", i)), fmt.Sprint("k", i%3)}
	}
	if _, err := e.db.Pool.CopyFrom(e.ctx, pgx.Identifier{e.ob.Table()}, []string{"queue", "payload", "ordering_key"}, pgx.CopyFromRows(src)); err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for {
		rows := e.claim(100, "q")
		if len(rows) == 0 {
			break
		}
		if len(rows) > 3 {
			t.Fatalf("claimed %d rows of 3 keys", len(rows))
		}
		for _, r := range rows {
			got[*r.OrderingKey] = append(got[*r.OrderingKey], string(r.Payload))
		}
		e.ack(rows...)
	}
	want := map[string][]string{}
	for i := range 30 {
		k := fmt.Sprint("k", i%3)
		want[k] = append(want[k], fmt.Sprint("sql-", i))
	}
	for i := range 30 {
		k := fmt.Sprint("k", i%3)
		want[k] = append(want[k], fmt.Sprint("copy-", i))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("per-key delivery (-want +got):\n%s", diff)
	}
}

// When an acknowledgement deletes a head while a publisher of the key has
// not committed, the delete cannot see the publisher's row and must not
// wait for it; it records the hand-over, which completes once the
// publisher commits.
func TestHandOverWaitsForAnUncommittedPublisher(t *testing.T) {
	t.Parallel()
	e := setup(t)
	head, publisher, next := e.headBeforeAnUncommittedRow()
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	if _, err := e.ob.queries(e.db.Pool).DeleteBatchWithLease(ctx, db.DeleteBatchWithLeaseParams{Ids: ids([]claimed{head}), Tokens: tokens(head)}); err != nil {
		t.Fatalf("the acknowledgement waited for the publisher or failed: %v", err)
	}
	if n := e.handOffs(); n != 1 {
		t.Fatalf("%d hand-overs recorded, want 1", n)
	}
	if waiting, err := e.handOff("q"); err != nil || waiting != 1 {
		t.Fatalf("HandOff while the publisher holds the key = %d, %v; want 1 waiting", waiting, err)
	}
	if err := publisher.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.claim(10, "q"); len(got) != 0 {
		t.Fatalf("claimed %v before the hand-over completed", ids(got))
	}
	if waiting, err := e.handOff("q"); err != nil || waiting != 0 {
		t.Fatalf("HandOff after the commit = %d, %v; want 0 waiting", waiting, err)
	}
	if got := ids(e.claim(10, "q")); !cmp.Equal(got, []int64{next}) {
		t.Fatalf("after the hand-over: claimed %v, want [%d]", got, next)
	}
	if n := e.handOffs(); n != 0 {
		t.Errorf("%d hand-overs left", n)
	}
}

// A publisher in REPEATABLE READ or SERIALIZABLE cannot see rows committed
// after its snapshot; its rows wait for the subscribers to decide, and
// the order still holds.
func TestSnapshotIsolationPublishersKeepKeyOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		var id int64
		err := pgx.BeginTxFunc(e.ctx, e.db.Pool, pgx.TxOptions{IsoLevel: iso}, func(tx pgx.Tx) error {
			return tx.QueryRow(e.ctx, `INSERT INTO outbox (queue, payload, ordering_key) VALUES ('q', $1, 'k') RETURNING id`, []byte(iso)).Scan(&id)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := e.claim(10, "q"); len(got) != 0 {
		t.Fatalf("claimed %v before the hand-over", ids(got))
	}
	var got []string
	for range 2 {
		if waiting, err := e.handOff("q"); err != nil || waiting != 0 {
			t.Fatalf("HandOff = %d, %v", waiting, err)
		}
		rows := e.claim(10, "q")
		if len(rows) != 1 {
			t.Fatalf("claimed %d rows, want 1", len(rows))
		}
		got = append(got, string(rows[0].Payload))
		e.ack(rows...)
	}
	if diff := cmp.Diff([]string{string(pgx.RepeatableRead), string(pgx.Serializable)}, got); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
}

func TestOrderingKeyAndQueueOfARowCannotChange(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id := e.publishKeyed("q", "k")
	for _, stmt := range []string{
		"UPDATE outbox SET ordering_key = 'other' WHERE id = $1",
		"UPDATE outbox SET ordering_key = NULL WHERE id = $1",
		"UPDATE outbox SET queue = 'q2' WHERE id = $1",
	} {
		if _, err := e.db.Pool.Exec(e.ctx, stmt, id); err == nil {
			t.Errorf("%s: no error", stmt)
		}
	}
	plain := e.publish("q")
	if _, err := e.db.Pool.Exec(e.ctx, "UPDATE outbox SET ordering_key = 'k' WHERE id = $1", plain); err == nil {
		t.Error("giving an unkeyed row a key: no error")
	}
	e.exec("UPDATE outbox SET next_attempt_at = now() WHERE id = $1", id)
}

// The subscriber completes recorded hand-overs on its own: announced ones
// at once, and ones whose key was still held by retrying.
func TestSubscriberCompletesRecordedHandOvers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	head, publisher, _ := e.headBeforeAnUncommittedRow()
	e.ack(head)

	handled := make(chan string, 1)
	cfg := fastConfig[string](nil)
	cfg.MinFetchInterval, cfg.MaxFetchInterval = time.Minute, time.Minute
	startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
		handled <- m.Payload
		return nil
	}, cfg)
	e.waitAsleep() // it found the key held, and backs off
	if n := e.handOffs(); n != 1 {
		t.Fatalf("%d hand-overs recorded while the publisher holds the key, want 1", n)
	}
	if err := publisher.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-handled:
		if p != "next" {
			t.Errorf("handled %q", p)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the row behind the recorded hand-over was not delivered within 5 s (the poll interval is a minute)")
	}
}

// A hand-over whose announcement never came (writers skip NOTIFY while the
// server's notification queue is half full, here made to look so) is
// completed by the subscriber's periodic sweep, even with no claim for it
// to find in the meantime.
func TestUnannouncedHandOverIsCompletedBySweep(t *testing.T) {
	t.Parallel()
	e := setup(t)
	head, publisher, _ := e.headBeforeAnUncommittedRow()
	handled := make(chan string, 1)
	cfg := fastConfig[string](nil)
	cfg.MinFetchInterval, cfg.MaxFetchInterval = time.Second, time.Second
	startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
		handled <- m.Payload
		return nil
	}, cfg)
	e.waitAsleep()

	e.exec("CREATE OR REPLACE FUNCTION outbox_notify_queue_usage() RETURNS float8 LANGUAGE sql AS 'SELECT 0.9::float8'")
	e.ack(head)
	// Counted before the row behind it commits: from then on the sweep may
	// complete it at any moment.
	if n := e.handOffs(); n != 1 {
		t.Fatalf("%d hand-overs recorded, want 1", n)
	}
	if err := publisher.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if p := waitFor(t, handled, "the row behind the unannounced hand-over"); p != "next" {
		t.Errorf("handled %q", p)
	}
}

// Through the subscriber: handlers of one key never overlap and run in
// order, while the rows of other keys run in parallel.
func TestSubscriberHandlesAKeyOneAtATimeInOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher[int](t, e, "q", nil)
	const keys, per = 8, 25
	for i := range keys * per {
		if _, err := pub.Publish(e.ctx, e.pubPool, i, &PublishOpts{OrderingKey: fmt.Sprint("k", i%keys)}); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu      sync.Mutex
		running = map[string]bool{}
		order   = map[string][]int{}
		overlap []string
		peak    int
		now     int
	)
	cfg := fastConfig[int](nil)
	cfg.Workers = 16
	cfg.Retry = ConstantRetry{Delay: time.Millisecond}
	failed := map[int]bool{}
	done := make(chan struct{})
	startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[int]) error {
		k := m.OrderingKey
		mu.Lock()
		if running[k] {
			overlap = append(overlap, k)
		}
		running[k] = true
		now++
		peak = max(peak, now)
		fail := m.Payload%7 == 0 && !failed[m.Payload]
		failed[m.Payload] = true
		mu.Unlock()
		time.Sleep(time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		running[k] = false
		now--
		if fail {
			return fmt.Errorf("first attempt of %d fails", m.Payload)
		}
		order[k] = append(order[k], m.Payload)
		if n := 0; true {
			for _, o := range order {
				n += len(o)
			}
			if n == keys*per {
				close(done)
			}
		}
		return nil
	}, cfg)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("not every message was handled within 30 s")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(overlap) > 0 {
		t.Errorf("handlers of one key overlapped: %v", overlap)
	}
	for k, got := range order {
		if !slices.IsSorted(got) {
			t.Errorf("key %s handled out of order: %v", k, got)
		}
	}
	if peak < 2 {
		t.Errorf("at most %d handlers ran at once; keys should run in parallel", peak)
	}
}

// QueueStats tells blocked rows from ready ones, and names the keys whose
// head holds rows back while it waits for a retry or its scheduled time.
func TestQueueStatsReportsHeldKeys(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// Key r: its head waits for a retry, two rows behind it.
	e.publishKeyed("q", "r")
	e.publishKeyed("q", "r")
	e.publishKeyed("q", "r")
	head := e.claim(1, "q")[0]
	if n, err := e.q.MarkPendingWithLease(e.ctx, db.MarkPendingWithLeaseParams{DelaySeconds: 3600, ID: head.ID, Token: head.AcquiredToken}); err != nil || n != 1 {
		t.Fatalf("retry: %d, %v", n, err)
	}
	// Key s: its head is scheduled, one row behind it, which has waited
	// longest.
	k := "s"
	e.publishWith(db.PublishParams{Queue: "q", Payload: []byte(`{}`), OrderingKey: &k, DelaySeconds: 3600})
	behind := e.publishKeyed("q", k)
	e.exec("UPDATE outbox SET created_at = now() - interval '1 hour' WHERE id = $1", behind)
	// Key l: its head is leased (not held: it is being handled).
	e.publishKeyed("q", "l")
	e.publishKeyed("q", "l")
	e.claim(1, "q")
	// Key alone: a scheduled head with nothing behind it holds nothing.
	k2 := "alone"
	e.publishWith(db.PublishParams{Queue: "q", Payload: []byte(`{}`), OrderingKey: &k2, DelaySeconds: 3600})
	// Key h: its hand-over is recorded, to be completed.
	e.exec(`INSERT INTO outbox_handoff (queue, ordering_key) VALUES ('q', 'h'), ('q', 'h')`)

	got, err := e.ob.QueueStats(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].OldestHeldAge < 59*time.Minute || got[0].OldestHeldAge > 61*time.Minute {
		t.Fatalf("stats %+v: want one queue whose oldest held key waited about an hour", got)
	}
	got[0].OldestAge, got[0].OldestHeldAge = 0, 0
	want := QueueStats{Queue: "q", Scheduled: 3, Blocked: 4, Leased: 1,
		HeldKeysRetrying: 1, HeldKeysScheduled: 1, OldestHeldKey: "s", HandOffs: 1}
	if diff := cmp.Diff(want, got[0]); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
}

// One key stuck behind a failing head never holds back other keys or
// unkeyed rows.
func TestFailingHeadHoldsBackOnlyItsKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher[int](t, e, "q", nil)
	for i := range 20 {
		if _, err := pub.Publish(e.ctx, e.pubPool, -1-i, &PublishOpts{OrderingKey: "stuck"}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 500 {
		opts := &PublishOpts{}
		if i%5 == 0 {
			opts.OrderingKey = fmt.Sprint("k", i%50)
		}
		if _, err := pub.Publish(e.ctx, e.pubPool, i, opts); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu      sync.Mutex
		handled = map[int]int{}
	)
	cfg := fastConfig[int](nil)
	cfg.Retry = ConstantRetry{Delay: 20 * time.Millisecond}
	startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[int]) error {
		mu.Lock()
		defer mu.Unlock()
		handled[m.Payload]++
		if m.OrderingKey == "stuck" {
			return fmt.Errorf("always fails")
		}
		return nil
	}, cfg)
	eventually(t, "every row of the other keys and every unkeyed row", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for i := range 500 {
			if handled[i] == 0 {
				return false
			}
		}
		return handled[-1] >= 3
	})
	mu.Lock()
	defer mu.Unlock()
	for i := 2; i <= 20; i++ {
		if handled[-i] > 0 {
			t.Errorf("row %d of the stuck key was handled while its head fails", i)
		}
	}
}

// A key's next row waits for its head's acknowledgement, so keyed outcomes
// are written at once instead of lingering for a fuller batch.
func TestKeyedOutcomesDoNotLinger(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher[int](t, e, "q", nil)
	for i := range 5 {
		if _, err := pub.Publish(e.ctx, e.pubPool, i, &PublishOpts{OrderingKey: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	handled := make(chan int, 5)
	cfg := fastConfig[int](nil)
	cfg.AckLinger = time.Minute
	startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[int]) error {
		handled <- m.Payload
		return nil
	}, cfg)
	var got []int
	for range 5 {
		select {
		case v := <-handled:
			got = append(got, v)
		case <-time.After(10 * time.Second):
			t.Fatalf("handled %v; the rest waited for the one-minute ack linger", got)
		}
	}
	if diff := cmp.Diff([]int{0, 1, 2, 3, 4}, got); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
}

// Only a row with a key can wait behind a head; a row without one that
// was blocked by hand would wait for ever, so the table refuses it.
func TestOnlyKeyedRowsCanBeBlocked(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id := e.publish("q")
	for _, stmt := range []string{
		"UPDATE outbox SET blocked = true WHERE id = $1",
		"INSERT INTO outbox (queue, payload, blocked) SELECT 'q', 'x', true WHERE $1::bigint IS NOT NULL",
	} {
		_, err := e.db.Pool.Exec(e.ctx, stmt, id)
		if dbx.SQLState(err) != "23514" {
			t.Errorf("%s: %v, want a check violation", stmt, err)
		}
	}
}

// A claim's end deletes the heads of many keys at once, more than the
// delete side may lock (half of max_locks_per_transaction). Each head
// whose next row the deleting transaction sees hands its key on at once,
// without the key's lock: no hand-over is left for the subscribers, and
// every next row is claimable.
func TestHeadsWithAVisibleNextRowAreHandedOnWithoutTheKeysLock(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var budget int
	if err := e.db.Pool.QueryRow(e.ctx, "SELECT current_setting('max_locks_per_transaction')::integer / 2").Scan(&budget); err != nil {
		t.Fatal(err)
	}
	keys := 4 * budget
	e.exec(`INSERT INTO outbox (queue, payload, ordering_key)
		SELECT 'q', convert_to(format('%s %s', k, n), 'UTF8'), 'k' || k
		FROM generate_series(1, 2) AS n, generate_series(1, $1::integer) AS k
		ORDER BY n, k`, keys)
	heads := e.claim(int32(2*keys), "q")
	if len(heads) != keys {
		t.Fatalf("claimed %d heads, want %d", len(heads), keys)
	}
	e.ack(heads...) // one statement
	if n := e.handOffs(); n != 0 {
		t.Errorf("%d hand-overs recorded, want none", n)
	}
	next := e.claim(int32(2*keys), "q")
	got := make([]string, len(next))
	for i, r := range next {
		got[i] = string(r.Payload)
	}
	slices.Sort(got)
	want := make([]string, keys)
	for k := range keys {
		want[k] = fmt.Sprintf("%d 2", k+1)
	}
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("claimable after the heads' delete (-want +got):\n%s", diff)
	}
}

// While a publisher of a key has not committed, a delete of the key's
// head that sees the key's next row hands the key on to it without
// waiting; the publisher's row waits behind that row, and the key's rows
// are delivered in order.
func TestANextRowIsHandedOnWhileAPublisherOfItsKeyIsInFlight(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.publishKeyed("q", "k")
	second := e.publishKeyed("q", "k")
	head := e.claim(10, "q")
	publisher, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = publisher.Rollback(context.Background()) }()
	var third int64
	if err := publisher.QueryRow(e.ctx, `INSERT INTO outbox (queue, payload, ordering_key) VALUES ('q', 'third', 'k') RETURNING id`).Scan(&third); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	if _, err := e.ob.queries(e.db.Pool).DeleteBatchWithLease(ctx, db.DeleteBatchWithLeaseParams{Ids: ids(head), Tokens: tokens(head...)}); err != nil {
		t.Fatalf("the acknowledgement waited for the publisher or failed: %v", err)
	}
	if n := e.handOffs(); n != 0 {
		t.Errorf("%d hand-overs recorded, want none", n)
	}
	next := e.claim(10, "q")
	if got := ids(next); !cmp.Equal(got, []int64{second}) {
		t.Fatalf("claimed %v with the publisher in flight, want [%d]", got, second)
	}
	if err := publisher.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.claim(10, "q"); len(got) != 0 {
		t.Fatalf("claimed %v while the key's head is leased", ids(got))
	}
	e.ack(next...)
	if got := ids(e.claim(10, "q")); !cmp.Equal(got, []int64{third}) {
		t.Fatalf("after the second row: claimed %v, want [%d]", got, third)
	}
}

// A statement's rows of one key skip the key's insert trigger when they
// arrive blocked behind the statement's earlier row of the key, which
// arrived blocked too. What the statement remembers of its keys ends with
// it, and with a savepoint rolled back; and a row that ON CONFLICT skipped
// after its trigger ran holds no later row of its key back that arrives
// unblocked.
func TestAStatementsMemoryOfItsKeysEndsWithIt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.exec(`INSERT INTO outbox (queue, payload, timer_id, next_attempt_at) VALUES ('q', 'timer', 't1', now() + interval '1 hour')`)
	tx, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	exec := func(sql string) {
		t.Helper()
		if _, err := tx.Exec(e.ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`INSERT INTO outbox (queue, payload, ordering_key, blocked) VALUES ('q', 'a1', 'a', false), ('q', 'a2', 'a', true), ('q', 'b1', 'b', false), ('q', 'a3', 'a', true)`)
	exec(`DELETE FROM outbox WHERE ordering_key = 'a'`)
	exec(`INSERT INTO outbox (queue, payload, ordering_key, blocked) VALUES ('q', 'a4', 'a', true)`)
	exec(`SAVEPOINT s`)
	if _, err := tx.Exec(e.ctx, `INSERT INTO outbox (queue, payload, ordering_key, blocked) VALUES ('q', 'c1', 'c', true), ('q', NULL, 'c', true)`); err == nil {
		t.Fatal("a row without a payload was inserted")
	}
	exec(`ROLLBACK TO SAVEPOINT s`)
	exec(`INSERT INTO outbox (queue, payload, ordering_key, blocked) VALUES ('q', 'c2', 'c', true)`)
	exec(`INSERT INTO outbox (queue, payload, ordering_key, timer_id, blocked) VALUES ('q', 'd1', 'd', 't1', true), ('q', 'd2', 'd', NULL, false)
		ON CONFLICT DO NOTHING`)
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range e.claim(10, "q") {
		got = append(got, string(r.Payload))
	}
	slices.Sort(got)
	if diff := cmp.Diff([]string{"a4", "b1", "c2", "d2"}, got); diff != "" {
		t.Errorf("claimable heads (-want +got):\n%s", diff)
	}
}

// A row inserted already blocked skips the key's insert trigger only when
// the statement's previous row is of its key; every other row is decided
// by the trigger, whatever blocked it arrives with.
func TestRowsArrivingBlockedSkipTheTriggerOnlyBehindTheirKeysPreviousRow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rows, err := e.db.Pool.Query(e.ctx, `INSERT INTO outbox (queue, payload, ordering_key, blocked) VALUES
		('q', 'a1', 'a', true), ('q', 'a2', 'a', false), ('q', 'b1', 'b', true), ('q', 'b2', 'b', true), ('r', 'b3', 'b', true)
		RETURNING id, blocked`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		ID      int64
		Blocked bool
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	blocked := make([]bool, len(got))
	for i, r := range got {
		blocked[i] = r.Blocked
		if i > 0 && r.ID <= got[i-1].ID {
			t.Errorf("ids %v do not rise in the statement's order", got)
		}
	}
	if diff := cmp.Diff([]bool{false, true, false, true, false}, blocked); diff != "" {
		t.Errorf("blocked (-want +got):\n%s", diff)
	}
}

// A keyed PublishBatch in REPEATABLE READ inserts every row blocked and
// records one hand-over; once completed, the rows are delivered in order.
func TestKeyedPublishBatchAtRepeatableRead(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher[int](t, e, "q", nil)
	if err := pgx.BeginTxFunc(e.ctx, e.pubPool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		_, err := pub.PublishBatch(e.ctx, tx, []int{1, 2, 3}, &PublishOpts{OrderingKey: "k"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if n := e.handOffs(); n != 1 {
		t.Errorf("%d hand-overs recorded, want 1", n)
	}
	if got := e.claim(10, "q"); len(got) != 0 {
		t.Fatalf("claimed %v before the hand-over", ids(got))
	}
	var got []string
	for range 3 {
		if waiting, err := e.handOff("q"); err != nil || waiting != 0 {
			t.Fatalf("HandOff = %d, %v", waiting, err)
		}
		rows := e.claim(10, "q")
		if len(rows) != 1 {
			t.Fatalf("claimed %d rows, want 1", len(rows))
		}
		got = append(got, string(rows[0].Payload))
		e.ack(rows...)
	}
	if diff := cmp.Diff([]string{"1", "2", "3"}, got); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
}
