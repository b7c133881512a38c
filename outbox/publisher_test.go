package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

type order struct {
	ID    string   `json:"id"`
	Total int      `json:"total"`
	Items []string `json:"items,omitempty"`
}

// events records metric events.
type events struct {
	mu  sync.Mutex
	got []MetricEvent
}

func (r *events) Record(ev MetricEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, ev)
}

func (r *events) all() []MetricEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]MetricEvent(nil), r.got...)
}

func newPublisher[T any](t *testing.T, e *env, queue string, cfg *PublisherConfig[T]) *Publisher[T] {
	t.Helper()
	p, err := NewPublisher(e.ob, queue, cfg)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	return p
}

// begin begins a transaction to publish in, as the publishing role.
func (e *env) begin() pgx.Tx {
	e.t.Helper()
	tx, err := e.pubPool.Begin(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

func TestPublishVisibilityFollowsTheCallersTransaction(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher[order](t, e, "orders", nil)

	tx := e.begin()
	id, err := pub.Publish(e.ctx, tx, order{ID: "o-1", Total: 5}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.claim(10, "orders"); len(got) != 0 {
		t.Fatalf("claim before commit took %v", ids(got))
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int64{id}, ids(e.claim(10, "orders"))); diff != "" {
		t.Errorf("claim after commit (-want +got):\n%s", diff)
	}

	tx = e.begin()
	if _, err := pub.Publish(e.ctx, tx, order{ID: "o-2"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}

	tx = e.begin()
	sp, err := tx.Begin(e.ctx) // a savepoint
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(e.ctx, sp, order{ID: "o-3"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := sp.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	kept, err := pub.Publish(e.ctx, tx, order{ID: "o-4"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int64{kept}, ids(e.claim(10, "orders"))); diff != "" {
		t.Errorf("after a rollback and a rolled-back savepoint (-want +got):\n%s", diff)
	}
	if n := e.count("outbox"); n != 2 {
		t.Errorf("outbox holds %d rows, want 2", n)
	}
}

func TestPublishNotifiesOnCommitOncePerBatch(t *testing.T) {
	t.Parallel()
	e := setup(t)
	l := listen(t, e.db.URL, e.ob.Channel())
	e.sleepOn("texts", "sentinel-1", "sentinel-2")
	pub := newPublisher[string](t, e, "texts", nil)

	tx := e.begin()
	if _, err := pub.PublishBatch(e.ctx, tx, []string{"a", "b", "c"}, nil); err != nil {
		t.Fatal(err)
	}
	e.publish("sentinel-1")
	if got := l.until("sentinel-1"); len(got) != 0 {
		t.Errorf("before commit: %v", got)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(e.ctx, e.pubPool, "d", nil); err != nil {
		t.Fatal(err)
	}
	e.publish("sentinel-2")
	ch := e.ob.Channel() + ":texts"
	if diff := cmp.Diff([]string{ch, ch}, l.until("sentinel-2")); diff != "" {
		t.Errorf("one per batch, one per Publish (-want +got):\n%s", diff)
	}
}

// claimOne claims the single row of queue.
func (e *env) claimOne(queue string) ([]byte, map[string]string) {
	e.t.Helper()
	rows := e.claim(2, queue)
	if len(rows) != 1 {
		e.t.Fatalf("claimed %d rows of %s, want 1", len(rows), queue)
	}
	var h map[string]string
	if err := json.Unmarshal(rows[0].Headers, &h); err != nil {
		e.t.Fatalf("headers %s: %v", rows[0].Headers, err)
	}
	return rows[0].Payload, h
}

func TestCodecsRoundTrip(t *testing.T) {
	t.Parallel()
	e := setup(t)
	in := order{ID: "o-1", Total: 42, Items: []string{"tea", "cake"}}
	if _, err := newPublisher[order](t, e, "json", nil).Publish(e.ctx, e.pubPool, in, nil); err != nil {
		t.Fatal(err)
	}
	payload, h := e.claimOne("json")
	out, err := JSONCodec[order]{}.Decode(payload)
	if err != nil || !cmp.Equal(in, out) {
		t.Errorf("JSON round trip: %+v, %v; want %+v", out, err, in)
	}
	if h[HeaderContentType] != ContentTypeJSON {
		t.Errorf("content-type %q, want %q", h[HeaderContentType], ContentTypeJSON)
	}
	// A JSON payload read as bytes is exactly what the JSON codec wrote.
	want, _ := json.Marshal(in)
	if raw, _ := (BytesCodec{}).Decode(payload); string(raw) != string(want) {
		t.Errorf("JSON payload as bytes = %q, want %q", raw, want)
	}

	bin := []byte{0, 1, 2, 0xff, '{'}
	if _, err := newPublisher[[]byte](t, e, "bytes", nil).Publish(e.ctx, e.pubPool, bin, nil); err != nil {
		t.Fatal(err)
	}
	payload, h = e.claimOne("bytes")
	if diff := cmp.Diff(bin, payload); diff != "" || h[HeaderContentType] != ContentTypeBytes {
		t.Errorf("bytes round trip (-want +got):\n%s content-type %q", diff, h[HeaderContentType])
	}

	text := "héllo, \"world\"\n"
	if _, err := newPublisher[string](t, e, "text", nil).Publish(e.ctx, e.pubPool, text, nil); err != nil {
		t.Fatal(err)
	}
	payload, h = e.claimOne("text")
	if got, _ := (StringCodec{}).Decode(payload); got != text || h[HeaderContentType] != ContentTypeText {
		t.Errorf("string round trip: %q (%q), want %q", got, h[HeaderContentType], text)
	}
}

func TestPublishHeadersAndCorrelationID(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher[order](t, e, "orders", nil)
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if _, err := pub.Publish(e.ctx, e.pubPool, order{}, &PublishOpts{
		Headers: map[string]string{"tenant": "acme", HeaderTraceparent: tp}, CorrelationID: "req-7"}); err != nil {
		t.Fatal(err)
	}
	_, h := e.claimOne("orders")
	want := map[string]string{"tenant": "acme", HeaderTraceparent: tp, HeaderCorrelationID: "req-7", HeaderContentType: ContentTypeJSON,
		HeaderMessageType: "order"}
	if diff := cmp.Diff(want, h); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}

	if _, err := pub.PublishBatch(e.ctx, e.pubPool, []order{{}, {}}, nil); err != nil {
		t.Fatal(err)
	}
	rows := e.claim(10, "orders")
	seen := map[string]bool{}
	for _, r := range rows {
		var h map[string]string
		if err := json.Unmarshal(r.Headers, &h); err != nil {
			t.Fatal(err)
		}
		if _, err := uuid.Parse(h[HeaderCorrelationID]); err != nil {
			t.Errorf("generated correlation id %q: %v", h[HeaderCorrelationID], err)
		}
		seen[h[HeaderCorrelationID]] = true
	}
	if len(rows) != 2 || len(seen) != 1 {
		t.Errorf("batch of 2 got %d rows with %d distinct correlation ids; want 2 rows sharing one", len(rows), len(seen))
	}
}

func TestPublishScheduling(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher[string](t, e, "later", nil)
	const delay = 300 * time.Millisecond
	id, err := pub.Publish(e.ctx, e.pubPool, "x", &PublishOpts{Delay: delay})
	if err != nil {
		t.Fatal(err)
	}
	row, _ := e.row(id)
	if got := e.claim(1, "later"); len(got) != 0 {
		t.Fatalf("delayed row claimed at once")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := e.claim(1, "later")
		if len(got) == 1 {
			claimed, _ := e.row(got[0].ID)
			if claimed.AcquiredAt.Before(row.NextAttemptAt) || claimed.AcquiredAt.Sub(row.CreatedAt) < delay {
				t.Errorf("claimed at %v, before its due time %v", claimed.AcquiredAt, row.NextAttemptAt)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("delayed row never became claimable")
		}
		time.Sleep(20 * time.Millisecond)
	}

	if _, err := pub.Publish(e.ctx, e.pubPool, "past", &PublishOpts{At: time.Now().Add(-time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if got := e.claim(1, "later"); len(got) != 1 {
		t.Errorf("row scheduled in the past not due now")
	}
	at := e.serverNow().Add(time.Hour)
	id, err = pub.Publish(e.ctx, e.pubPool, "future", &PublishOpts{At: at})
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := e.row(id); !r.NextAttemptAt.Equal(at.Truncate(time.Microsecond)) {
		t.Errorf("due %v, want %v", r.NextAttemptAt, at)
	}
}

func TestTimerDedupeAndCancel(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher[string](t, e, "reminders", nil)
	opts := &PublishOpts{TimerID: "reminder-42", Delay: time.Hour}

	tx := e.begin()
	first, err := pub.Publish(e.ctx, tx, "first", opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(e.ctx, tx, "second", opts); !errors.Is(err, ErrTimerExists) {
		t.Fatalf("duplicate timer: %v, want ErrTimerExists", err)
	}
	// The transaction survived the duplicate.
	other, err := pub.Publish(e.ctx, tx, "other", &PublishOpts{TimerID: "reminder-43"})
	if err != nil {
		t.Fatalf("publish after a duplicate timer in the same tx: %v", err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if r, _ := e.row(first); string(r.Payload) != "first" {
		t.Errorf("timer row holds %q, want the first publish", r.Payload)
	}

	ok, err := e.ob.CancelTimer(e.ctx, e.db.Pool, "reminders", "reminder-42")
	if err != nil || !ok {
		t.Fatalf("CancelTimer: %v, %v; want true", ok, err)
	}
	if ok, _ := e.ob.CancelTimer(e.ctx, e.db.Pool, "reminders", "reminder-42"); ok {
		t.Error("second CancelTimer reported a cancellation")
	}
	if _, ok := e.row(first); ok {
		t.Error("cancelled row still there")
	}

	e.claim(1, "reminders") // takes reminder-43, due now
	if ok, err := e.ob.CancelTimer(e.ctx, e.db.Pool, "reminders", "reminder-43"); ok || err != nil {
		t.Errorf("CancelTimer of a leased row: %v, %v; want false, nil", ok, err)
	}
	if _, ok := e.row(other); !ok {
		t.Error("leased timer row deleted")
	}
	if _, err := e.ob.CancelTimer(e.ctx, e.db.Pool, "reminders", ""); err == nil {
		t.Error("CancelTimer with an empty timer id succeeded")
	}
}

func TestPublishBatchOf10000(t *testing.T) {
	t.Parallel()
	e := setup(t)
	l := listen(t, e.db.URL, e.ob.Channel())
	e.sleepOn("bulk", "sentinel")
	pub := newPublisher[order](t, e, "bulk", nil)
	msgs := make([]order, 10000)
	for i := range msgs {
		msgs[i] = order{ID: "o-" + strings.Repeat("x", i%7), Total: i}
	}
	tx := e.begin()
	got, err := pub.PublishBatch(e.ctx, tx, msgs, &PublishOpts{OrderingKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(msgs) {
		t.Fatalf("%d ids for %d messages", len(got), len(msgs))
	}
	for _, i := range []int{0, 1, 4999, 9999} {
		r, _ := e.row(got[i])
		out, err := JSONCodec[order]{}.Decode(r.Payload)
		if err != nil || !cmp.Equal(out, msgs[i]) {
			t.Errorf("id %d (message %d) holds %+v, want %+v", got[i], i, out, msgs[i])
		}
	}
	if n := e.count("outbox"); n != 10000 {
		t.Errorf("outbox holds %d rows", n)
	}
	e.publish("sentinel")
	if diff := cmp.Diff([]string{e.ob.Channel() + ":bulk"}, l.until("sentinel")); diff != "" {
		t.Errorf("notifications (-want +got):\n%s", diff)
	}
	if ids, err := pub.PublishBatch(e.ctx, e.pubPool, nil, nil); err != nil || ids != nil {
		t.Errorf("empty batch: %v, %v", ids, err)
	}
}

func TestPublishMetrics(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rec := &events{}
	pub := newPublisher(t, e, "m", &PublisherConfig[string]{Metrics: rec})
	if _, err := pub.Publish(e.ctx, e.pubPool, "four", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.PublishBatch(e.ctx, e.pubPool, []string{"a", "bb"}, nil); err != nil {
		t.Fatal(err)
	}
	_, _ = pub.Publish(e.ctx, e.pubPool, "x", &PublishOpts{Delay: -time.Second})
	_, _ = pub.Publish(e.ctx, e.pubPool, "x", &PublishOpts{TimerID: "t"})
	_, _ = pub.Publish(e.ctx, e.pubPool, "x", &PublishOpts{TimerID: "t"})
	want := []MetricEvent{
		{Name: EventPublished, Queue: "m", Count: 1, Bytes: 4},
		{Name: EventPublished, Queue: "m", Count: 2, Bytes: 3},
		{Name: EventPublished, Queue: "m", Count: 1, ErrorType: "input"},
		{Name: EventPublished, Queue: "m", Count: 1, Bytes: 1},
		{Name: EventPublished, Queue: "m", Count: 1, Bytes: 1, ErrorType: "timer_exists"},
	}
	got := rec.all()
	for _, ev := range got {
		if ev.Duration <= 0 {
			t.Errorf("event %+v has no duration", ev)
		}
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(MetricEvent{}, "Duration")); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

type panickyRecorder struct{}

func (panickyRecorder) Record(MetricEvent) { panic("recorder bug") }

func TestPanickingRecorderDoesNotFailPublish(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher(t, e, "m", &PublisherConfig[string]{Metrics: panickyRecorder{}})
	if _, err := pub.Publish(e.ctx, e.pubPool, "x", nil); err != nil {
		t.Fatalf("Publish with a panicking recorder: %v", err)
	}
	if n := e.count("outbox"); n != 1 {
		t.Errorf("outbox holds %d rows, want 1", n)
	}
}

// HeadersFrom adds headers from the publishing context to every message;
// PublishOpts' own headers win, the checks apply to them all, and a panic
// in it fails the call.
func TestPublisherTakesHeadersFromTheContext(t *testing.T) {
	t.Parallel()
	e := setup(t)
	type key struct{}
	from := func(ctx context.Context) map[string]string {
		v, _ := ctx.Value(key{}).(string)
		switch v {
		case "":
			return nil
		case "panic":
			panic("hook bug")
		}
		return map[string]string{"traceparent": v, "tenant": "from-context"}
	}
	pub, err := NewPublisher[string](e.ob, "q", &PublisherConfig[string]{HeadersFrom: from})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.WithValue(e.ctx, key{}, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	one, err := pub.Publish(ctx, e.pubPool, "one", &PublishOpts{Headers: map[string]string{"tenant": "explicit"}})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := pub.PublishBatch(ctx, e.pubPool, []string{"two"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := pub.Publish(e.ctx, e.pubPool, "three", nil)
	if err != nil {
		t.Fatal(err)
	}
	header := func(id int64, k string) string {
		t.Helper()
		var v *string
		if err := e.db.Pool.QueryRow(e.ctx, "SELECT headers->>$2 FROM outbox WHERE id = $1", id, k).Scan(&v); err != nil {
			t.Fatal(err)
		}
		if v == nil {
			return "(none)"
		}
		return *v
	}
	got := []string{header(one, "traceparent"), header(one, "tenant"), header(batch[0], "traceparent"), header(batch[0], "tenant"),
		header(plain, "traceparent")}
	want := []string{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "explicit", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "from-context", "(none)"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("headers (-want +got):\n%s", diff)
	}

	if _, err := pub.Publish(context.WithValue(e.ctx, key{}, "panic"), e.db.Pool, "x", nil); err == nil || !strings.Contains(err.Error(), "HeadersFrom panicked") {
		t.Errorf("a panicking hook: %v", err)
	}
	var inputErr *InputError
	if _, err := pub.Publish(context.WithValue(e.ctx, key{}, strings.Repeat("x", 70000)), e.db.Pool, "x", nil); !errors.As(err, &inputErr) {
		t.Errorf("a malformed traceparent from the context: %v, want an *InputError", err)
	}
	if n := e.count("outbox"); n != 3 {
		t.Errorf("%d rows, want 3", n)
	}
}

// Publishing works in every query exec mode of pgx, so through a pooler
// that needs one other than the default (docs/poolers.md): headers, a
// JSON document, travel as bytes, which pgx's exec and simple protocol
// modes send as bytea whatever the column.
func TestPublishInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		ob := e.outboxOn(func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
		pub, err := NewPublisher[string](ob, "q", nil)
		if err != nil {
			t.Fatal(err)
		}
		opts := &PublishOpts{Headers: map[string]string{"mode": mode.String(), "quote": `"'\`}, CorrelationID: "c"}
		var ids []int64
		id, err := pub.Publish(e.ctx, ob.pool, "one", opts)
		ids = append(ids, id)
		if err == nil {
			var batch []int64
			batch, err = pub.PublishBatch(e.ctx, ob.pool, []string{"two", "three"}, opts)
			ids = append(ids, batch...)
		}
		if err == nil {
			timed := *opts
			timed.TimerID = "timer-" + mode.String()
			id, err = pub.Publish(e.ctx, ob.pool, "four", &timed)
			ids = append(ids, id)
		}
		if err != nil {
			t.Errorf("publishing in query exec mode %q: %v", mode, err)
			continue
		}
		want := map[string]string{"mode": mode.String(), "quote": `"'\`, HeaderCorrelationID: "c",
			HeaderContentType: ContentTypeText, HeaderMessageType: "string"}
		for _, id := range ids {
			r, ok := e.row(id)
			var h map[string]string
			if ok {
				if err := json.Unmarshal(r.Headers, &h); err != nil {
					t.Fatal(err)
				}
			}
			if diff := cmp.Diff(want, h); diff != "" {
				t.Errorf("row %d's headers in query exec mode %q (-want +got):\n%s", id, mode, diff)
			}
		}
	}
}
