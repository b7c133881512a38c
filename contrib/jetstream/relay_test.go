package outboxjs_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	outboxjs "github.com/outboxgen/outboxgen/contrib/jetstream"
	"github.com/outboxgen/outboxgen/outbox"
)

// Rows arrive on the subjects the mapping gives, with their headers,
// ordering key and a message id made of the outbox and the row; the
// outbox is empty afterwards.
func TestRelayPublishesSubjectsAndHeaders(t *testing.T) {
	t.Parallel()
	e := setup(t)
	s := e.stream(t, 0)
	pub, err := outbox.NewPublisher[[]byte](e.f.Outbox, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	keyed, err := pub.Publish(ctx, e.f.Pool, []byte(`{"id":1}`), &outbox.PublishOpts{
		OrderingKey: "customer-42", Headers: map[string]string{"tenant": "acme", "Trace-Id": "t-1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	unkeyed, err := pub.Publish(ctx, e.f.Pool, []byte(`{"id":2}`), &outbox.PublishOpts{CorrelationID: "c-2"})
	if err != nil {
		t.Fatal(err)
	}
	created := e.createdAt(t)
	relay := e.relay(t)
	run(t, relay)
	waitFor(t, 10*time.Second, "the rows were not relayed", func() bool { return msgs(t, s) == 2 && e.rows(t) == 0 })

	id := func(row int64) string {
		return outboxjs.MsgID(e.f.Schema+".outbox", &outbox.Message[[]byte]{ID: row, CreatedAt: created[row]})
	}
	want := []*nats.Msg{
		{Subject: e.prefix + ".orders.customer-42", Data: []byte(`{"id":1}`), Header: nats.Header{
			"tenant": {"acme"}, "Trace-Id": {"t-1"}, "Outbox-Queue": {"orders"}, "Outbox-Ordering-Key": {"customer-42"},
			"Nats-Msg-Id": {id(keyed)},
		}},
		{Subject: e.prefix + ".orders.none", Data: []byte(`{"id":2}`), Header: nats.Header{
			"correlation-id": {"c-2"}, "Outbox-Queue": {"orders"}, "Nats-Msg-Id": {id(unkeyed)},
		}},
	}
	got := stored(t, s)
	for _, m := range got {
		// The publisher's own headers: a fresh correlation id and the
		// content type.
		if m.Header.Get("correlation-id") != "c-2" {
			delete(m.Header, "correlation-id")
		}
		delete(m.Header, "content-type")
	}
	// The two rows have different keys: either may be stored first.
	byData := cmpopts.SortSlices(func(a, b *nats.Msg) bool { return string(a.Data) < string(b.Data) })
	if diff := cmp.Diff(want, got, byData, cmpopts.IgnoreUnexported(nats.Msg{}), cmpopts.IgnoreFields(nats.Msg{}, "Sub")); diff != "" {
		t.Errorf("stream (-want +got):\n%s", diff)
	}
}

// The start-up check refuses a stream whose duplicate window is shorter
// than the relay's redelivery timing, names both, and relays nothing;
// WarnOnly relays all the same; a long enough window passes.
func TestCheckRefusesAShortDuplicateWindow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	s := e.stream(t, 10*time.Second)
	pub, err := outbox.NewPublisher[[]byte](e.f.Outbox, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(t.Context(), e.f.Pool, []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	cfg := &outboxjs.Config{Subject: e.subject, Subjects: []string{e.prefix + ".orders.*"}, Subscriber: fastSubscriber()}
	relay, err := outboxjs.NewRelay(e.f.Outbox, e.nc, []string{"orders"}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// LeaseTTL 30 s (the default) alone exceeds the 10 s window.
	wantTiming := outboxjs.Redelivery{
		PublishTimeout: 5 * time.Second, LeaseTTL: 30 * time.Second, MaxRetryDelay: 50 * time.Millisecond,
		MaxFetchInterval: 50 * time.Millisecond, Margin: time.Second,
	}
	if diff := cmp.Diff(wantTiming, relay.Redelivery()); diff != "" {
		t.Errorf("Redelivery (-want +got):\n%s", diff)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err = relay.Run(ctx)
	var we *outboxjs.WindowError
	if !errors.As(err, &we) {
		t.Fatalf("Run = %v, want a *WindowError", err)
	}
	want := &outboxjs.WindowError{
		Stream: strings.ToUpper(e.prefix), Subjects: []string{e.prefix + ".orders.*"},
		Duplicates: 10 * time.Second, Redelivery: wantTiming,
	}
	if diff := cmp.Diff(want, we); diff != "" {
		t.Errorf("WindowError (-want +got):\n%s", diff)
	}
	for _, part := range []string{"drops duplicates for 10s", "up to 36.05s", "LeaseTTL 30s", "at least 36.05s", "WarnOnly"} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("the error %q does not say %q", err, part)
		}
	}
	if got := e.rows(t); got != 1 {
		t.Errorf("%d rows left after a refused start; want 1 (nothing relayed)", got)
	}

	// A shorter lease fits the window.
	short := fastSubscriber()
	short.LeaseTTL = 3 * time.Second
	relay, err = outboxjs.NewRelay(e.f.Outbox, e.nc, []string{"orders"}, &outboxjs.Config{
		Subject: e.subject, Subjects: cfg.Subjects, Subscriber: short,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := relay.Check(t.Context()); err != nil {
		t.Errorf("Check with a %v redelivery and a 10s window: %v", relay.Redelivery().Bound(), err)
	}

	// WarnOnly relays despite the short window.
	cfg.WarnOnly = true
	relay, err = outboxjs.NewRelay(e.f.Outbox, e.nc, []string{"orders"}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, relay)
	waitFor(t, 10*time.Second, "WarnOnly did not relay", func() bool { return msgs(t, s) == 1 && e.rows(t) == 0 })
}

// A subject no stream captures is refused at start.
func TestCheckRefusesASubjectWithoutAStream(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.stream(t, 0)
	relay, err := outboxjs.NewRelay(e.f.Outbox, e.nc, []string{"orders"}, &outboxjs.Config{
		Subject:  func(*outbox.Message[[]byte]) (string, error) { return "nowhere." + e.prefix, nil },
		Subjects: []string{"nowhere." + e.prefix}, Subscriber: fastSubscriber(),
	})
	if err != nil {
		t.Fatal(err)
	}
	err = relay.Run(t.Context())
	if !errors.Is(err, outboxjs.ErrNoStream) || !strings.Contains(err.Error(), `"nowhere.`+e.prefix+`"`) {
		t.Errorf("Run = %v, want ErrNoStream naming the subject", err)
	}
}

// A broker that refuses a publish (its stream is gone) fails the
// handler: the row is retried, neither dropped nor dead-lettered, and
// arrives once the stream is back.
func TestBrokerFailureRetriesTheRow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	s := e.stream(t, 0)
	cfg := s.CachedInfo().Config
	relay, err := outboxjs.NewRelay(e.f.Outbox, e.nc, []string{"orders"}, &outboxjs.Config{
		Subject: e.subject, Subjects: []string{e.prefix + ".>"}, Subscriber: fastSubscriber(),
		PublishTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := outbox.NewPublisher[[]byte](e.f.Outbox, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(t.Context(), e.f.Pool, []byte("before"), &outbox.PublishOpts{OrderingKey: "k"}); err != nil {
		t.Fatal(err)
	}
	run(t, relay) // the check passes: the stream exists
	waitFor(t, 5*time.Second, "the relay did not start", func() bool { return msgs(t, s) == 1 && e.rows(t) == 0 })
	if err := e.js.DeleteStream(t.Context(), cfg.Name); err != nil {
		t.Fatal(err)
	}

	if _, err := pub.Publish(t.Context(), e.f.Pool, []byte("survives"), &outbox.PublishOpts{OrderingKey: "k"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the row was not retried", func() bool { return e.rows(t) == 1 && e.attempts(t) >= 2 })
	dead, err := e.f.Outbox.DeadLetters(t.Context(), outbox.DeadLetterFilter{}, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 0 {
		t.Fatalf("dead-lettered while the stream was gone: %+v", dead)
	}

	s, err = e.js.CreateStream(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the row did not arrive after the stream came back", func() bool { return msgs(t, s) == 1 && e.rows(t) == 0 })
	if got := stored(t, s); string(got[0].Data) != "survives" || got[0].Subject != e.prefix+".orders.k" {
		t.Errorf("stored %q on %s", got[0].Data, got[0].Subject)
	}
}

// NewRelay names the field that breaks a rule.
func TestNewRelayValidates(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, tc := range []struct {
		name   string
		queues []string
		cfg    *outboxjs.Config
		field  string
	}{
		{"Subject without Subjects", []string{"q"},
			&outboxjs.Config{Subject: outboxjs.DefaultSubject}, "outboxjs.Config.Subjects"},
		{"a wildcard subject", []string{"q"},
			&outboxjs.Config{Subjects: []string{"a.>.b"}}, "outboxjs.Config.Subjects"},
		{"a queue that is no subject", []string{"orders created"}, nil, "outboxjs.Config.Subject"},
		{"a retry strategy it cannot bound", []string{"q"},
			&outboxjs.Config{Subscriber: &outbox.SubscriberConfig[[]byte]{Retry: myRetry{}}}, "outboxjs.Config.MaxRetryDelay"},
		{"an exponential retry without a cap", []string{"q"},
			&outboxjs.Config{Subscriber: &outbox.SubscriberConfig[[]byte]{Retry: &outbox.ExponentialRetry{Initial: time.Second, Multiplier: 2}}},
			"outboxjs.Config.MaxRetryDelay"},
		{"a bad stream name", []string{"q"}, &outboxjs.Config{Stream: "a.b"}, "outboxjs.Config.Stream"},
		{"a negative timeout", []string{"q"}, &outboxjs.Config{PublishTimeout: -1}, "outboxjs.Config.PublishTimeout"},
		{"a bad subscriber config", []string{"q"},
			&outboxjs.Config{Subscriber: &outbox.SubscriberConfig[[]byte]{Workers: -1}}, "SubscriberConfig.Workers"},
	} {
		_, err := outboxjs.NewRelay(e.f.Outbox, e.nc, tc.queues, tc.cfg)
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("%s: NewRelay = %v, want a *ConfigError of %s", tc.name, err, tc.field)
		}
	}
	// A stated bound makes any strategy usable.
	if _, err := outboxjs.NewRelay(e.f.Outbox, e.nc, []string{"q"}, &outboxjs.Config{
		MaxRetryDelay: time.Second, Subscriber: &outbox.SubscriberConfig[[]byte]{Retry: myRetry{}},
	}); err != nil {
		t.Errorf("NewRelay with MaxRetryDelay: %v", err)
	}
}

type myRetry struct{}

func (myRetry) NextDelay(int, time.Duration, error) (time.Duration, bool) { return time.Second, true }

// The retry strategies' longest waits enter the redelivery timing.
func TestRedeliveryCountsTheLongestRetry(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, tc := range []struct {
		retry outbox.RetryStrategy
		want  time.Duration
	}{
		{nil, 12 * time.Second}, // DefaultRetry: 10 s + 20 % jitter
		{outbox.NoRetry{}, 0},
		{outbox.ConstantRetry{Delay: 3 * time.Second}, 3 * time.Second},
		{outbox.LinearRetry{Initial: time.Second, Step: time.Second, MaxAttempts: 5}, 4 * time.Second},
		{&outbox.LinearRetry{Initial: time.Second, Step: time.Second, MaxDelay: 7 * time.Second}, 7 * time.Second},
		{&outbox.ExponentialRetry{Initial: time.Second, Multiplier: 2, MaxAttempts: 5}, 8 * time.Second},
		{&outbox.ExponentialRetry{Initial: time.Second, Multiplier: 2, MaxDelay: time.Minute, Jitter: 0.5}, 90 * time.Second},
	} {
		relay, err := outboxjs.NewRelay(e.f.Outbox, e.nc, []string{"q"}, &outboxjs.Config{
			Subscriber: &outbox.SubscriberConfig[[]byte]{Retry: tc.retry},
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := relay.Redelivery().MaxRetryDelay; got != tc.want {
			t.Errorf("%#v: MaxRetryDelay %v, want %v", tc.retry, got, tc.want)
		}
	}
}

// A mapping that fails, or gives no subject one can publish to, ends
// the row at once in the dead-letter table, with the reason.
func TestBadSubjectDeadLettersTheRow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.stream(t, 0)
	pub, err := outbox.NewPublisher[[]byte](e.f.Outbox, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(t.Context(), e.f.Pool, []byte("x"), &outbox.PublishOpts{OrderingKey: "has space"}); err != nil {
		t.Fatal(err)
	}
	relay := e.relay(t)
	run(t, relay)
	var dead []outbox.DeadLetter
	waitFor(t, 10*time.Second, "the row was not dead-lettered", func() bool {
		dead, err = e.f.Outbox.DeadLetters(t.Context(), outbox.DeadLetterFilter{}, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		return len(dead) == 1
	})
	if dead[0].Reason != outbox.ReasonRejected || !strings.Contains(dead[0].LastError, "not a subject to publish to") {
		t.Errorf("dead letter: reason %q, error %q", dead[0].Reason, dead[0].LastError)
	}
}

// Config.Stream makes every publish expect that stream: a subject
// another stream captures is refused and retried, never stored there.
func TestExpectedStream(t *testing.T) {
	t.Parallel()
	e := setup(t)
	s := e.stream(t, 0)
	other := e.prefix + "_other"
	if _, err := e.js.CreateStream(t.Context(), jetstream.StreamConfig{Name: strings.ToUpper(other), Subjects: []string{other + ".>"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.js.DeleteStream(context.Background(), strings.ToUpper(other)) })
	pub, err := outbox.NewPublisher[[]byte](e.f.Outbox, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(t.Context(), e.f.Pool, []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	relay, err := outboxjs.NewRelay(e.f.Outbox, e.nc, []string{"orders"}, &outboxjs.Config{
		Subject:  func(*outbox.Message[[]byte]) (string, error) { return other + ".orders", nil },
		Subjects: []string{other + ".>"}, Stream: s.CachedInfo().Config.Name, Subscriber: fastSubscriber(),
	})
	if err != nil {
		t.Fatal(err)
	}
	run(t, relay)
	waitFor(t, 10*time.Second, "the row was not retried", func() bool { return e.attempts(t) >= 2 })
	o, err := e.js.Stream(t.Context(), strings.ToUpper(other))
	if err != nil {
		t.Fatal(err)
	}
	if n := o.CachedInfo().State.Msgs; n != 0 {
		t.Errorf("the other stream holds %d messages; want 0", n)
	}
}

// A row published again within the duplicate window (here: its first
// publish reached the stream but the relay never learnt it) is stored
// once: the stream drops the second copy by its id, and the row is
// acknowledged all the same.
func TestRepublishedRowIsStoredOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	s := e.stream(t, 0)
	pub, err := outbox.NewPublisher[[]byte](e.f.Outbox, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	row, err := pub.Publish(t.Context(), e.f.Pool, []byte("once"), &outbox.PublishOpts{OrderingKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	first := &nats.Msg{Subject: e.prefix + ".orders.k", Data: []byte("once"), Header: nats.Header{}}
	id := outboxjs.MsgID(e.f.Schema+".outbox", &outbox.Message[[]byte]{ID: row, CreatedAt: e.createdAt(t)[row]})
	if _, err := e.js.PublishMsg(t.Context(), first, jetstream.WithMsgID(id)); err != nil {
		t.Fatal(err)
	}

	relay := e.relay(t)
	run(t, relay)
	waitFor(t, 10*time.Second, "the row was not acknowledged", func() bool { return e.rows(t) == 0 })
	if n := msgs(t, s); n != 1 {
		t.Errorf("the stream holds %d messages; want 1", n)
	}
}

// DefaultHeader copies the row's headers but those named Nats-*, in any
// case, which JetStream would obey as directives.
func TestDefaultHeaderDropsJetStreamDirectives(t *testing.T) {
	t.Parallel()
	got, err := outboxjs.DefaultHeader(&outbox.Message[[]byte]{Queue: "orders", OrderingKey: "k", Headers: map[string]string{
		"Nats-Rollup": "all", "Nats-Expected-Last-Sequence": "999", "nats-msg-id": "forged", "NATS-TTL": "1s",
		"Nats-": "x", "nAtS-Expected-Stream": "OTHER",
		"Nats": "kept", "NatsX": "kept", "X-Nats-Rollup": "kept", "tenant": "acme",
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := nats.Header{
		"Nats": {"kept"}, "NatsX": {"kept"}, "X-Nats-Rollup": {"kept"}, "tenant": {"acme"},
		"Outbox-Queue": {"orders"}, "Outbox-Ordering-Key": {"k"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("DefaultHeader (-want +got):\n%s", diff)
	}
}

// A row the stream refuses for what it is (here: larger than the
// stream's MaxMsgSize, though below the server's max_payload) is
// dead-lettered at its first refusal, with the broker's reason, even
// under the relay's default retry strategy, which never gives up; the
// later rows of its key are relayed, in order.
func TestRowTheStreamRefusesForGoodIsDeadLettered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	s := e.streamWith(t, jetstream.StreamConfig{MaxMsgSize: 1024})
	pub, err := outbox.NewPublisher[[]byte](e.f.Outbox, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	big := []byte(strings.Repeat("x", 4096))
	for _, p := range [][]byte{big, []byte("after-1"), []byte("after-2"), []byte("after-3")} {
		if _, err := pub.Publish(t.Context(), e.f.Pool, p, &outbox.PublishOpts{OrderingKey: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	sc := fastSubscriber()
	sc.Retry = nil // the relay's default: no cap on attempts
	relay, err := outboxjs.NewRelay(e.f.Outbox, e.nc, []string{"orders"}, &outboxjs.Config{
		Subject: e.subject, Subjects: []string{e.prefix + ".>"}, Subscriber: sc,
	})
	if err != nil {
		t.Fatal(err)
	}
	run(t, relay)
	waitFor(t, 10*time.Second, "the key's later rows were not relayed", func() bool { return msgs(t, s) == 3 && e.rows(t) == 0 })

	var data []string
	for _, m := range stored(t, s) {
		data = append(data, string(m.Data))
	}
	if diff := cmp.Diff([]string{"after-1", "after-2", "after-3"}, data); diff != "" {
		t.Errorf("stream (-want +got):\n%s", diff)
	}
	dead, err := e.f.Outbox.DeadLetters(t.Context(), outbox.DeadLetterFilter{}, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	type letter struct {
		Queue, OrderingKey, Reason string
		Payload                    []byte
		Attempts                   int
		SaysWhy                    bool
	}
	var got []letter
	for _, d := range dead {
		got = append(got, letter{
			Queue: d.Queue, OrderingKey: d.OrderingKey, Reason: d.Reason, Payload: d.Payload, Attempts: d.Attempts,
			SaysWhy: strings.Contains(d.LastError, "message size exceeds maximum allowed"),
		})
	}
	want := []letter{{Queue: "orders", OrderingKey: "k", Reason: outbox.ReasonRejected, Payload: big, Attempts: 1, SaysWhy: true}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("dead letters (-want +got):\n%s", diff)
		for _, d := range dead {
			t.Logf("last error: %s", d.LastError)
		}
	}
}

// Headers named Nats-* on a row are data, never JetStream directives:
// a row carrying Nats-Rollup: all does not purge the messages stored
// before it, one carrying Nats-Expected-Last-Sequence: 999 is not
// refused, and rows carrying the same forged nats-msg-id are each
// stored, once, under the relay's own id.
func TestOutboxHeadersNeverActAsJetStreamDirectives(t *testing.T) {
	t.Parallel()
	e := setup(t)
	s := e.streamWith(t, jetstream.StreamConfig{AllowRollup: true})
	pub, err := outbox.NewPublisher[[]byte](e.f.Outbox, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	rows := []struct {
		data    string
		headers map[string]string
	}{
		{"first", nil},
		{"second", map[string]string{"nats-msg-id": "forged"}},
		{"third", map[string]string{"nats-msg-id": "forged"}},
		{"rollup", map[string]string{"Nats-Rollup": "all", "tenant": "acme"}},
		{"expects", map[string]string{"Nats-Expected-Last-Sequence": "999", "NATS-EXPECTED-LAST-MSG-ID": "nope"}},
	}
	ids := make([]int64, len(rows))
	for i, r := range rows {
		// One key: the rows are published in this order.
		ids[i], err = pub.Publish(t.Context(), e.f.Pool, []byte(r.data), &outbox.PublishOpts{OrderingKey: "k", Headers: r.headers})
		if err != nil {
			t.Fatal(err)
		}
	}
	created := e.createdAt(t)
	run(t, e.relay(t))
	waitFor(t, 10*time.Second, "the rows were not relayed", func() bool { return e.rows(t) == 0 })

	type msg struct {
		Data, MsgID string
		Directives  []string // headers named Nats-* but the relay's id
		Tenant      string
	}
	var want []msg
	for i, r := range rows {
		m := msg{Data: r.data, MsgID: outboxjs.MsgID(e.f.Schema+".outbox", &outbox.Message[[]byte]{ID: ids[i], CreatedAt: created[ids[i]]})}
		if r.data == "rollup" {
			m.Tenant = "acme"
		}
		want = append(want, m)
	}
	var got []msg
	for _, m := range stored(t, s) {
		g := msg{Data: string(m.Data), MsgID: m.Header.Get(jetstream.MsgIDHeader), Tenant: m.Header.Get("tenant")}
		for k := range m.Header {
			if k != jetstream.MsgIDHeader && len(k) >= 5 && strings.EqualFold(k[:5], "Nats-") {
				g.Directives = append(g.Directives, k)
			}
		}
		got = append(got, g)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stream (-want +got):\n%s", diff)
	}
	dead, err := e.f.Outbox.DeadLetters(t.Context(), outbox.DeadLetterFilter{}, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 0 {
		t.Errorf("dead-lettered: %+v", dead)
	}
}

// A directive of a custom Config.Header that cannot hold (here an
// expected last sequence the stream is not at) dead-letters its row at
// the first refusal, and the key's later rows are relayed; a message id
// the mapping returns in another case is replaced by the relay's own.
func TestDirectiveTheStreamRefusesDeadLettersTheRow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	s := e.stream(t, 0)
	pub, err := outbox.NewPublisher[[]byte](e.f.Outbox, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for _, p := range []string{"expects", "after"} {
		id, err := pub.Publish(t.Context(), e.f.Pool, []byte(p), &outbox.PublishOpts{OrderingKey: "k"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	created := e.createdAt(t)
	relay, err := outboxjs.NewRelay(e.f.Outbox, e.nc, []string{"orders"}, &outboxjs.Config{
		Subject: e.subject, Subjects: []string{e.prefix + ".>"}, Subscriber: fastSubscriber(),
		Header: func(m *outbox.Message[[]byte]) (nats.Header, error) {
			h, err := outboxjs.DefaultHeader(m)
			if string(m.Payload) == "expects" {
				h.Set(jetstream.ExpectedLastSeqHeader, "999")
			}
			h.Set("nats-msg-id", "forged")
			return h, err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	run(t, relay)
	waitFor(t, 10*time.Second, "the rows were not relayed or dead-lettered", func() bool { return msgs(t, s) == 1 && e.rows(t) == 0 })

	got := stored(t, s)
	want := []*nats.Msg{{Subject: e.prefix + ".orders.k", Data: []byte("after"), Header: nats.Header{
		"Outbox-Queue": {"orders"}, "Outbox-Ordering-Key": {"k"},
		"Nats-Msg-Id": {outboxjs.MsgID(e.f.Schema+".outbox", &outbox.Message[[]byte]{ID: ids[1], CreatedAt: created[ids[1]]})},
	}}}
	for _, m := range got {
		delete(m.Header, "correlation-id") // the publisher's own headers
		delete(m.Header, "content-type")
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreUnexported(nats.Msg{}), cmpopts.IgnoreFields(nats.Msg{}, "Sub")); diff != "" {
		t.Errorf("stream (-want +got):\n%s", diff)
	}
	dead, err := e.f.Outbox.DeadLetters(t.Context(), outbox.DeadLetterFilter{}, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || dead[0].ID != ids[0] || dead[0].Reason != outbox.ReasonRejected || dead[0].Attempts != 1 ||
		!strings.Contains(dead[0].LastError, "wrong last sequence") {
		t.Errorf("dead letters: %+v; want row %d rejected at its first attempt for the wrong last sequence", dead, ids[0])
	}
}
