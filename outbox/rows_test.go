package outbox

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// Rows lists a queue's rows by state, oldest or newest first, a page at
// a time, and a key's rows in the key's order; bad queries are refused.
func TestRowsListsAQueuesRowsByState(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher[string](t, e, "q", nil)
	var ready, scheduled, keyed []int64
	for i := range 5 {
		id, err := pub.Publish(e.ctx, e.pubPool, "ready", nil)
		if err != nil {
			t.Fatal(err)
		}
		ready = append(ready, id)
		if id, err = pub.Publish(e.ctx, e.pubPool, "later", &PublishOpts{Delay: time.Duration(i+1) * time.Hour}); err != nil {
			t.Fatal(err)
		}
		scheduled = append(scheduled, id)
	}
	for range 3 {
		id, err := pub.Publish(e.ctx, e.pubPool, "keyed", &PublishOpts{OrderingKey: "k", Delay: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		keyed = append(keyed, id)
	}
	ids := func(rs []RowSummary) []int64 {
		var out []int64
		for _, r := range rs {
			out = append(out, r.ID)
		}
		return out
	}
	// All ready rows, two a page, oldest first.
	var got []int64
	var after *RowCursor
	for pages := 0; ; pages++ {
		rs, next, err := e.ob.Rows(e.ctx, RowQuery{Queue: "q", Limit: 2, After: after})
		if err != nil || pages > 5 {
			t.Fatalf("Rows: %v (page %d)", err, pages)
		}
		for _, r := range rs {
			if r.State != RowReady || r.MessageType == "" {
				t.Errorf("a ready row listed as %+v", r)
			}
		}
		got = append(got, ids(rs)...)
		if after = next; next == nil {
			break
		}
	}
	if diff := cmp.Diff(ready, got); diff != "" {
		t.Errorf("ready rows, oldest first (-want +got):\n%s", diff)
	}
	// Scheduled rows, the latest due first: the keyed head (due in an
	// hour, like the first scheduled row) is among them, its followers
	// are not (they wait behind it).
	rs, next, err := e.ob.Rows(e.ctx, RowQuery{Queue: "q", State: RowScheduled, Newest: true, Limit: 3})
	if err != nil || next == nil {
		t.Fatalf("Rows scheduled: %v, next %v", err, next)
	}
	if diff := cmp.Diff([]int64{scheduled[4], scheduled[3], scheduled[2]}, ids(rs)); diff != "" {
		t.Errorf("scheduled rows, latest due first (-want +got):\n%s", diff)
	}
	rs, _, err = e.ob.Rows(e.ctx, RowQuery{Queue: "q", Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	var states []string
	for _, r := range rs {
		states = append(states, r.State)
	}
	if diff := cmp.Diff(keyed, ids(rs)); diff != "" || !slices.Equal(states, []string{RowScheduled, RowBlocked, RowBlocked}) {
		t.Errorf("the key's rows (-want +got):\n%s%q", diff, states)
	}
	// A row in hand of a subscriber that claims by lease is leased (one a
	// claim by lock holds reads as ready, as QueueStats counts it); none
	// is expired.
	inHand, release := make(chan struct{}, 10), make(chan struct{})
	cfg := fastConfig[string](nil)
	cfg.LockWindow = -1
	s := startSub(t, e.ob, []string{"q"}, func(ctx context.Context, m *Message[string]) error {
		inHand <- struct{}{}
		<-release
		return nil
	}, cfg)
	<-inHand
	rs, _, err = e.ob.Rows(e.ctx, RowQuery{Queue: "q", State: RowLeased})
	if err != nil || len(rs) == 0 || rs[0].State != RowLeased || rs[0].LeaseExpiresAt.IsZero() {
		t.Errorf("leased rows = %+v, %v", rs, err)
	}
	if rs, _, err := e.ob.Rows(e.ctx, RowQuery{Queue: "q", State: RowExpired}); err != nil || len(rs) != 0 {
		t.Errorf("expired rows = %+v, %v; want none", rs, err)
	}
	close(release)
	if err := s.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	for _, q := range []RowQuery{{}, {Queue: "q", State: RowBlocked}, {Queue: "q", Limit: RowsLimitMax + 1}, {Queue: "q", State: "nope"}} {
		var ie *InputError
		var ce *ConfigError
		if _, _, err := e.ob.Rows(e.ctx, q); !errors.As(err, &ie) && !errors.As(err, &ce) {
			t.Errorf("Rows(%+v) = %v; want an *InputError or *ConfigError", q, err)
		}
	}
}

// A cursor written as text reads back as itself; other text is refused.
func TestRowCursorTextReadsBack(t *testing.T) {
	t.Parallel()
	c := RowCursor{At: time.Date(2026, 12, 7, 16, 6, 55, 31896000, time.UTC), ID: -42}
	got, err := ParseRowCursor("after", c.String())
	if err != nil || !got.At.Equal(c.At) || got.ID != c.ID {
		t.Errorf("ParseRowCursor(%q) = %+v, %v; want %+v", c.String(), got, err, c)
	}
	for _, s := range []string{"", "nonsense", "2026-12-07T16:06:55Z", "2026-12-07T16:06:55Z/x", "x/1"} {
		var ie *InputError
		if _, err := ParseRowCursor("after", s); !errors.As(err, &ie) || ie.Field != "after" {
			t.Errorf("ParseRowCursor(%q) = %v; want an *InputError for after", s, err)
		}
	}
}

// Rows filters by message type and age within a bounded read: a page
// reads at most RowsScan rows of its index range, so a page of a rare
// type can be short, or empty, and still lead on to the rest; paging on
// lists every match once, in order.
func TestRowsFiltersByMessageTypeAndAgeWithinABoundedRead(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// 6,000 ready rows in due order by i; five of type b, two of them
	// created in the last hour; the odd ones created two hours ago.
	e.exec(`INSERT INTO outbox (queue, payload, headers, created_at, next_attempt_at)
		SELECT 'q', 'p', jsonb_build_object('message-type', CASE WHEN i IN (11, 20, 4991, 5500, 5991) THEN 'b' ELSE 'a' END),
		       CASE WHEN i % 2 = 1 THEN now() - interval '2 hours' ELSE now() END,
		       now() - make_interval(secs => 7000 - i)
		FROM generate_series(1, 6000) AS i`)
	var first int64
	if err := e.db.Pool.QueryRow(e.ctx, "SELECT min(id) - 1 FROM outbox").Scan(&first); err != nil {
		t.Fatal(err)
	}
	all := func(q RowQuery) (ids []int64, pages []int) {
		t.Helper()
		for {
			rs, next, err := e.ob.Rows(e.ctx, q)
			if err != nil || len(pages) > 10 {
				t.Fatalf("Rows(%+v): %v after %d pages", q, err, len(pages))
			}
			pages = append(pages, len(rs))
			for _, r := range rs {
				ids = append(ids, r.ID-first) // its i
			}
			if q.After = next; next == nil {
				return ids, pages
			}
		}
	}
	for _, c := range []struct {
		q         RowQuery
		ids       []int64
		pageSizes []int
	}{
		// Two a page: the first is full; the second read its 5,000 rows
		// and found one; the third reads to the end.
		{RowQuery{Queue: "q", MessageType: "b", Limit: 2}, []int64{11, 20, 4991, 5500, 5991}, []int{2, 1, 2}},
		{RowQuery{Queue: "q", MessageType: "b", OlderThan: time.Hour, Newest: true, Limit: 10}, []int64{5991, 4991, 11}, []int{2, 1}},
		{RowQuery{Queue: "q", MessageType: "b", NewerThan: time.Hour}, []int64{20, 5500}, []int{1, 1}},
		{RowQuery{Queue: "q", MessageType: "none"}, nil, []int{0, 0}},
	} {
		ids, pages := all(c.q)
		if diff := cmp.Diff(c.ids, ids); diff != "" || !slices.Equal(c.pageSizes, pages) {
			t.Errorf("Rows(%+v) (-want +got):\n%spages of %v; want %v", c.q, diff, pages, c.pageSizes)
		}
	}
	// Retrying: the scheduled rows an attempt of which failed.
	e.exec(`INSERT INTO outbox (queue, payload, next_attempt_at, attempts_count, last_error)
		VALUES ('r', 'delayed', now() + interval '1 hour', 0, NULL), ('r', 'failed', now() + interval '2 hours', 2, 'boom')`)
	rs, _, err := e.ob.Rows(e.ctx, RowQuery{Queue: "r", State: RowRetrying})
	if err != nil || len(rs) != 1 || rs[0].Attempts != 2 || rs[0].State != RowScheduled || rs[0].LastError != "boom" {
		t.Errorf("retrying rows = %+v, %v; want the failed one, reported scheduled", rs, err)
	}
	rs, next, err := e.ob.Rows(e.ctx, RowQuery{Queue: "q", OlderThan: time.Hour, Limit: 3})
	var ids []int64
	for _, r := range rs {
		ids = append(ids, r.ID-first)
	}
	if diff := cmp.Diff([]int64{1, 3, 5}, ids); diff != "" || next == nil || err != nil {
		t.Errorf("the oldest rows created over an hour ago (-want +got):\n%snext %v, %v", diff, next, err)
	}
	for _, q := range []RowQuery{{Queue: "q", OlderThan: -time.Second}, {Queue: "q", NewerThan: -1}, {Queue: "q", MessageType: "a\x00"}} {
		var ie *InputError
		if _, _, err := e.ob.Rows(e.ctx, q); !errors.As(err, &ie) {
			t.Errorf("Rows(%+v) = %v; want an *InputError", q, err)
		}
	}
}

// Filtered says which queries read a bounded range: those with a type or
// age filter, and the retrying rows.
func TestRowQueryFiltered(t *testing.T) {
	t.Parallel()
	for q, want := range map[*RowQuery]bool{
		{Queue: "q"}: false, {Queue: "q", State: RowScheduled, Key: "k", Newest: true}: false,
		{Queue: "q", MessageType: "t"}: true, {Queue: "q", OlderThan: time.Hour}: true, {Queue: "q", NewerThan: time.Hour}: true,
		{Queue: "q", State: RowRetrying}: true,
	} {
		if got := q.Filtered(); got != want {
			t.Errorf("%+v.Filtered() = %v, want %v", *q, got, want)
		}
	}
}
