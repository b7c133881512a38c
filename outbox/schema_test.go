package outbox

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgen/outboxgen/db"
)

func wantConstraint(t *testing.T, err error, code, constraint string) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != code || pgErr.ConstraintName != constraint {
		t.Fatalf("err = %v, want SQLSTATE %s on %s", err, code, constraint)
	}
}

func TestCheckConstraintRejectsHalfSetLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id := e.publish("q")
	for _, set := range []string{
		"acquired_token = gen_random_uuid()",
		"acquired_at = now()",
		"lease_expires_at = now()",
		"acquired_token = gen_random_uuid(), acquired_at = now()",
		"acquired_token = gen_random_uuid(), lease_expires_at = now()",
	} {
		_, err := e.db.Pool.Exec(e.ctx, "UPDATE outbox SET "+set+" WHERE id = $1", id)
		wantConstraint(t, err, "23514", "outbox_lease_state_chk")
	}
}

func TestQueueNameLengthIsChecked(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, q := range []string{"", strings.Repeat("q", 256)} {
		_, err := e.q.Publish(e.ctx, db.PublishParams{Queue: q, Payload: []byte("x")})
		wantConstraint(t, err, "23514", "outbox_queue_chk")
	}
}

func TestTimerIDIsUniquePerQueueWhileTheRowLives(t *testing.T) {
	t.Parallel()
	e := setup(t)
	timer := "reminder-42"
	first := e.publishWith(db.PublishParams{Queue: "q", Payload: []byte("x"), TimerID: &timer, DelaySeconds: 3600})

	_, err := e.q.Publish(e.ctx, db.PublishParams{Queue: "q", Payload: []byte("x"), TimerID: &timer})
	wantConstraint(t, err, "23505", "outbox_timer_uidx")
	e.publishWith(db.PublishParams{Queue: "other", Payload: []byte("x"), TimerID: &timer})

	n, err := e.q.CancelTimer(e.ctx, db.CancelTimerParams{Queue: "q", TimerID: timer})
	if err != nil || n != 1 {
		t.Fatalf("CancelTimer: %d, %v; want 1, nil", n, err)
	}
	if _, ok := e.row(first); ok {
		t.Fatalf("cancelled row %d still there", first)
	}
	// Once the row is gone the timer id is free again.
	e.publishWith(db.PublishParams{Queue: "q", Payload: []byte("x"), TimerID: &timer})
}

func TestCancelTimerIsFalseOnceLeased(t *testing.T) {
	t.Parallel()
	e := setup(t)
	timer := "t1"
	id := e.publishWith(db.PublishParams{Queue: "q", Payload: []byte("x"), TimerID: &timer})
	e.claim(1, "q")
	n, err := e.q.CancelTimer(e.ctx, db.CancelTimerParams{Queue: "q", TimerID: timer})
	if err != nil || n != 0 {
		t.Fatalf("CancelTimer of a leased row: %d, %v; want 0, nil", n, err)
	}
	if _, ok := e.row(id); !ok {
		t.Errorf("leased row %d deleted by CancelTimer", id)
	}
}

func TestPublishSchedulesOnServerClock(t *testing.T) {
	t.Parallel()
	e := setup(t)
	before := e.serverNow()
	delayed := e.publishWith(db.PublishParams{Queue: "q", Payload: []byte("x"), DelaySeconds: 60})
	past := before.Add(-time.Hour)
	pastRow := e.publishWith(db.PublishParams{Queue: "q", Payload: []byte("x"), NotBefore: &past})
	future := before.Add(2 * time.Hour)
	futureRow := e.publishWith(db.PublishParams{Queue: "q", Payload: []byte("x"), NotBefore: &future})
	after := e.serverNow()

	d, _ := e.row(delayed)
	if lo, hi := before.Add(time.Minute), after.Add(time.Minute); d.NextAttemptAt.Before(lo) || d.NextAttemptAt.After(hi) {
		t.Errorf("delayed row due %v, want within [%v, %v]", d.NextAttemptAt, lo, hi)
	}
	if p, _ := e.row(pastRow); p.NextAttemptAt.Before(before) {
		t.Errorf("row for a past time due %v, want now (>= %v)", p.NextAttemptAt, before)
	}
	if f, _ := e.row(futureRow); !f.NextAttemptAt.Equal(future) {
		t.Errorf("row for %v due %v", future, f.NextAttemptAt)
	}
	if diff := cmp.Diff([]int64{pastRow}, ids(e.claim(10, "q"))); diff != "" {
		t.Errorf("claimable (-want +got):\n%s", diff)
	}
}

func TestPublishBatchReturnsIDsInOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	key := "k"
	got, err := e.q.PublishBatch(e.ctx, db.PublishBatchParams{
		Queue:       "a",
		Payloads:    [][]byte{[]byte("1"), []byte("2"), []byte("3")},
		Headers:     json.RawMessage(`{"x": "1"}`),
		OrderingKey: &key,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || !(got[0] < got[1] && got[1] < got[2]) {
		t.Fatalf("ids %v, want three ascending", got)
	}
	for i, want := range []string{"1", "2", "3"} {
		r, ok := e.row(got[i])
		if !ok || string(r.Payload) != want || r.OrderingKey == nil || *r.OrderingKey != key {
			t.Errorf("id %d: payload %q key %v, want %q and %q", got[i], r.Payload, r.OrderingKey, want, key)
		}
	}
	if r, _ := e.row(got[1]); string(r.Headers) != `{"x": "1"}` {
		t.Errorf("row %d headers = %s, want the batch's", got[1], r.Headers)
	}
}

func TestPublishCopy(t *testing.T) {
	t.Parallel()
	e := setup(t)
	n, err := e.q.PublishCopy(e.ctx, []db.PublishCopyParams{
		{Queue: "q", Payload: []byte("1")},
		{Queue: "q", Payload: []byte("2"), Headers: []byte(`{"k":"v"}`)},
	})
	if err != nil || n != 2 {
		t.Fatalf("PublishCopy: %d, %v; want 2, nil", n, err)
	}
	if got := e.claim(10, "q"); len(got) != 2 {
		t.Errorf("claimed %d copied rows, want 2", len(got))
	}
}

func TestFetchUnprocessedTakesNoLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a := e.publish("q")
	leased := e.claim(1, "q")[0]
	b := e.publishWith(db.PublishParams{Queue: "q", Payload: []byte("x"), DelaySeconds: 60})
	e.publish("other")

	before := map[int64]db.Outbox{}
	for _, id := range []int64{a, b} {
		before[id], _ = e.row(id)
	}
	got, err := e.q.FetchUnprocessed(e.ctx, db.FetchUnprocessedParams{Queue: "q", MaxRows: 10})
	if err != nil {
		t.Fatal(err)
	}
	var peeked []int64
	for _, r := range got {
		peeked = append(peeked, r.ID)
	}
	if diff := cmp.Diff([]int64{a, b}, peeked); diff != "" {
		t.Errorf("peeked (-want +got):\n%s", diff)
	}
	if leased.ID != a {
		t.Fatalf("claimed %d, want %d", leased.ID, a)
	}
	for id, want := range before {
		if after, _ := e.row(id); !cmp.Equal(want, after) {
			t.Errorf("row %d changed by the peek:\n%s", id, cmp.Diff(want, after))
		}
	}
}

func TestQueueStats(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for range 3 {
		e.publish("a")
	}
	e.publishWith(db.PublishParams{Queue: "a", Payload: []byte("x"), DelaySeconds: 600})
	e.claim(2, "a")
	e.exec("UPDATE outbox SET lease_expires_at = now() - interval '1 second' WHERE id = (SELECT min(id) FROM outbox)")
	r := e.publish("b")
	rows := e.claim(1, "b")
	if _, err := e.q.DeadLetterWithLease(e.ctx, db.DeadLetterWithLeaseParams{ID: r, Token: token(t, rows[0]), Reason: "rejected"}); err != nil {
		t.Fatal(err)
	}
	e.exec("UPDATE outbox SET created_at = now() - interval '90 seconds' WHERE queue = 'a'")

	got, err := e.q.QueueStats(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 2 && (got[0].OldestAgeSeconds < 89 || got[0].OldestAgeSeconds > 120) {
		t.Errorf("oldest age of a = %v s, want about 90", got[0].OldestAgeSeconds)
	}
	for i := range got {
		got[i].OldestAgeSeconds = 0
	}
	want := []db.QueueStatsRow{
		{Queue: "a", Ready: 1, Scheduled: 1, Leased: 1, Expired: 1},
		{Queue: "b", DeadLettered: 1},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
}

func TestNextDueIn(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if _, err := e.q.NextDueIn(e.ctx, db.NextDueInParams{Queues: []string{"a"}}); !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("NextDueIn of an empty queue: %v, want pgx.ErrNoRows", err)
	}
	at := e.serverNow().Add(time.Hour)
	later := at.Add(time.Hour)
	e.publishWith(db.PublishParams{Queue: "a", Payload: []byte("x"), NotBefore: &later})
	e.publishWith(db.PublishParams{Queue: "b", Payload: []byte("x"), NotBefore: &at})
	e.publishWith(db.PublishParams{Queue: "c", Payload: []byte("x")})
	got, err := e.q.NextDueIn(e.ctx, db.NextDueInParams{Queues: []string{"a", "b"}})
	if err != nil || got > 3600 || got < 3590 {
		t.Fatalf("NextDueIn = %v, %v; want just under 3600", got, err)
	}
	// A row already due is left out: the claim that just ran could not
	// take it, so it is locked elsewhere and waking for it would spin.
	if got, err := e.q.NextDueIn(e.ctx, db.NextDueInParams{Queues: []string{"c"}}); !errors.Is(err, pgx.ErrNoRows) {
		t.Errorf("NextDueIn of a due row = %v, %v; want pgx.ErrNoRows", got, err)
	}
	// Unless it came due since the caller's last claim was sent: then it
	// is reported, overdue, so the caller claims at once.
	if got, err := e.q.NextDueIn(e.ctx, db.NextDueInParams{Queues: []string{"c"}, SinceClaimSeconds: 60}); err != nil || got > 0 || got < -60 {
		t.Errorf("NextDueIn of a row due since the last claim = %v, %v; want between -60 and 0", got, err)
	}
}
