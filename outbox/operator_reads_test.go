package outbox

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/db"
)

func strp(s string) *string { return &s }

// keyedFixture publishes, in queue "q", key "leased" (head claimed), key
// "retrying" (head failed once, retry in an hour), key "scheduled" (head
// due in an hour), key "due" (head due now), two rows each, and an
// unkeyed row; it returns the heads' ids by key, and the second rows' by
// key + "/2".
func (e *env) keyedFixture() map[string]int64 {
	e.t.Helper()
	heads := map[string]int64{}
	for _, k := range []string{"leased", "retrying", "scheduled", "due"} {
		p := db.PublishParams{Queue: "q", Payload: []byte(`{}`), OrderingKey: strp(k)}
		if k == "scheduled" {
			p.DelaySeconds = 3600
		}
		heads[k] = e.publishWith(p)
		p.DelaySeconds = 0
		heads[k+"/2"] = e.publishWith(p)
	}
	e.publish("q")
	// Claim the heads of "leased" and "retrying"; fail "retrying".
	var tok = map[int64]claimed{}
	for _, c := range e.claim(10, "q") {
		tok[c.ID] = c
	}
	for _, k := range []string{"due"} {
		c, ok := tok[heads[k]]
		if !ok {
			e.t.Fatalf("head of %q not claimed", k)
		}
		// Give "due" back at once: its head is due now.
		if _, err := e.q.MarkPendingWithLease(e.ctx, db.MarkPendingWithLeaseParams{ID: c.ID, Token: c.AcquiredToken}); err != nil {
			e.t.Fatal(err)
		}
	}
	c := tok[heads["retrying"]]
	if _, err := e.q.MarkPendingWithLease(e.ctx, db.MarkPendingWithLeaseParams{
		ID: c.ID, Token: c.AcquiredToken, DelaySeconds: 3600, LastError: strp("boom")}); err != nil {
		e.t.Fatal(err)
	}
	return heads
}

func TestHeldKeysNamesEachHeldKeyAndItsHeadState(t *testing.T) {
	t.Parallel()
	e := setup(t)
	heads := e.keyedFixture()
	got, err := e.ob.HeldKeys(e.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	type key struct {
		Key, State string
		HeadID     int64
		Attempts   int
		Waiting    int64
		Future     bool
	}
	var keys []key
	for _, k := range got {
		if k.Held < 0 || k.Held > time.Minute {
			t.Errorf("key %q held for %v", k.Key, k.Held)
		}
		keys = append(keys, key{k.Key, k.State, k.HeadID, k.Attempts, k.Waiting, k.Until > 30*time.Second})
	}
	want := []key{
		{"leased", HeadLeased, heads["leased"], 0, 1, true},
		{"retrying", HeadRetrying, heads["retrying"], 1, 1, true},
		{"scheduled", HeadScheduled, heads["scheduled"], 0, 1, true},
	}
	if diff := cmp.Diff(want, keys); diff != "" {
		t.Errorf("held keys (-want +got):\n%s", diff)
	}
	one, err := e.ob.HeldKeys(e.ctx, &HeldKeyOptions{Queues: []string{"q"}, Limit: 1})
	if err != nil || len(one) != 1 || one[0].Key != "leased" {
		t.Errorf("HeldKeys limit 1 = %+v, %v; want the longest held key, leased", one, err)
	}
	if none, err := e.ob.HeldKeys(e.ctx, &HeldKeyOptions{Queues: []string{"other"}}); err != nil || len(none) != 0 {
		t.Errorf("HeldKeys of an empty queue = %+v, %v", none, err)
	}
	if _, err := e.ob.HeldKeys(e.ctx, &HeldKeyOptions{Scan: -1}); err == nil {
		t.Error("HeldKeys accepted a negative Scan")
	}
}

func TestQueueDepthsCountsBlockedRowsWhenAsked(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.keyedFixture()
	for range 3 {
		e.publishWith(db.PublishParams{Queue: "other", Payload: []byte(`{}`), OrderingKey: strp("k")})
	}
	get := func(opts *DepthOptions) map[string][2]int64 {
		t.Helper()
		depths, err := e.ob.QueueDepths(e.ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][2]int64{}
		for _, d := range depths {
			c := int64(0)
			if d.Capped {
				c = 1
			}
			out[d.Queue] = [2]int64{d.Blocked, c}
		}
		return out
	}
	if diff := cmp.Diff(map[string][2]int64{"q": {4, 0}, "other": {2, 0}}, get(&DepthOptions{Blocked: true})); diff != "" {
		t.Errorf("blocked counts (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string][2]int64{"q": {0, 0}, "other": {0, 0}}, get(nil)); diff != "" {
		t.Errorf("blocked counts without Blocked (-want +got):\n%s", diff)
	}
	// With a cap of 2, "other" has 3 keyed rows: the count is a lower bound.
	if got := get(&DepthOptions{Blocked: true, Cap: 2})["other"]; got[1] != 1 {
		t.Errorf("other at cap 2 = %v, want capped", got)
	}
}

func TestRowReadsEachState(t *testing.T) {
	t.Parallel()
	e := setup(t)
	heads := e.keyedFixture()
	timer := e.publishWith(db.PublishParams{Queue: "t", Payload: []byte(`{"a":1}`), TimerID: strp("tm"), DelaySeconds: 60,
		Headers: []byte(`{"h":"v"}`)})
	e.exec(`UPDATE outbox SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, heads["leased"])
	states := map[int64]string{
		heads["leased/2"]: RowBlocked, heads["leased"]: RowExpired, heads["retrying"]: RowScheduled,
		heads["due"]: RowReady, timer: RowScheduled,
	}
	for id, want := range states {
		r, ok, err := e.ob.Row(e.ctx, id)
		if err != nil || !ok || r.State != want {
			t.Errorf("Row(%d) = %q, %v, %v; want %q", id, r.State, ok, err, want)
		}
	}
	r, ok, err := e.ob.RowByTimer(e.ctx, "t", "tm")
	if err != nil || !ok {
		t.Fatalf("RowByTimer = %v, %v", ok, err)
	}
	if diff := cmp.Diff(Row{ID: timer, Queue: "t", State: RowScheduled, Payload: []byte(`{"a":1}`),
		Headers: map[string]string{"h": "v"}, TimerID: "tm"}, r,
		cmpIgnoreTimes); diff != "" {
		t.Errorf("RowByTimer (-want +got):\n%s", diff)
	}
	if !r.NextAttemptAt.After(r.CreatedAt) || !r.LeasedAt.IsZero() || !r.FirstAttemptAt.IsZero() {
		t.Errorf("times: created %v due %v leased %v first %v", r.CreatedAt, r.NextAttemptAt, r.LeasedAt, r.FirstAttemptAt)
	}
	retry, _, _ := e.ob.Row(e.ctx, heads["retrying"])
	if retry.LastError != "boom" || retry.Attempts != 1 || retry.FirstAttemptAt.IsZero() {
		t.Errorf("retrying row = %+v", retry)
	}
	if _, ok, err := e.ob.Row(e.ctx, math.MaxInt64); ok || err != nil {
		t.Errorf("Row of a missing id = %v, %v", ok, err)
	}
	if _, ok, err := e.ob.RowByTimer(e.ctx, "t", "nope"); ok || err != nil {
		t.Errorf("RowByTimer of a missing timer = %v, %v", ok, err)
	}
	if _, _, err := e.ob.RowByTimer(e.ctx, "t", ""); err == nil {
		t.Error("RowByTimer accepted an empty timer id")
	}
}

var cmpIgnoreTimes = cmp.FilterPath(func(p cmp.Path) bool {
	_, ok := p.Last().Type().MethodByName("UnixNano")
	return ok
}, cmp.Ignore())

func TestDeadLetterSelectionsDryRunsAndNewestPages(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.deadLettered("orders", 1, 20, ReasonRejected)
	e.deadLettered("other", 21, 5, ReasonRetryExhausted)

	d, ok, err := e.ob.DeadLetter(e.ctx, 3)
	if err != nil || !ok || d.Queue != "orders" || string(d.Payload) != "payload-3" || d.LastError != "boom" {
		t.Errorf("DeadLetter(3) = %+v, %v, %v", d, ok, err)
	}
	if _, ok, err := e.ob.DeadLetter(e.ctx, 999); ok || err != nil {
		t.Errorf("DeadLetter(999) = %v, %v", ok, err)
	}

	// Newest first, in pages.
	var seen []int64
	before := int64(math.MaxInt64)
	for {
		page, err := e.ob.NewestDeadLetters(e.ctx, DeadLetterFilter{Queue: "orders"}, before, 7)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, r := range page {
			seen = append(seen, r.ID)
		}
		before = page[len(page)-1].ID
	}
	var want []int64
	for id := int64(20); id >= 1; id-- {
		want = append(want, id)
	}
	if diff := cmp.Diff(want, seen); diff != "" {
		t.Errorf("newest pages (-want +got):\n%s", diff)
	}

	sel := DeadLetterFilter{IDs: []int64{2, 4, 22}}
	if n, err := e.ob.CountDeadLetters(e.ctx, sel); n != 3 || err != nil {
		t.Errorf("CountDeadLetters(ids) = %d, %v", n, err)
	}
	if n, err := e.ob.CountDeadLetters(e.ctx, DeadLetterFilter{Queue: "orders", IDs: []int64{2, 22}}); n != 1 || err != nil {
		t.Errorf("CountDeadLetters(queue and ids) = %d, %v", n, err)
	}
	// A dry run reports what the replay does, and moves nothing.
	e.publishWith(db.PublishParams{Queue: "orders", Payload: []byte(`{}`), TimerID: strp("t4")})
	e.exec(`UPDATE outbox_dlq SET timer_id = 't4' WHERE id = 4`)
	dry, err := e.ob.ReplayDeadLetters(e.ctx, sel, &ReplayOpts{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if left := e.count("outbox_dlq"); left != 25 {
		t.Errorf("after a dry run the DLQ holds %d rows, want 25", left)
	}
	real, err := e.ob.ReplayDeadLetters(e.ctx, sel, nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(real, dry); diff != "" || real.Replayed != 2 || len(real.Skipped) != 1 {
		t.Errorf("dry run differs from the replay (-replay +dry):\n%s\nreplay: %+v", diff, real)
	}
	if res, err := e.ob.PurgeDeadLetters(e.ctx, DeadLetterFilter{IDs: []int64{1, 4, 23}}, nil); res.Deleted != 3 || err != nil {
		t.Errorf("PurgeDeadLetters(ids) = %+v, %v", res, err)
	}
	if left := e.count("outbox_dlq"); left != 20 {
		t.Errorf("the DLQ holds %d rows, want 20", left)
	}
}
