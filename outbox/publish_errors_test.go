package outbox

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

type nilCodec struct{}

func (*nilCodec) Encode(string) ([]byte, error) { return nil, nil }
func (*nilCodec) Decode([]byte) (string, error) { return "", nil }
func (*nilCodec) ContentType() string           { return "x" }

type panicCodec struct{ StringCodec }

func (panicCodec) Encode(string) ([]byte, error) { panic("codec bug") }

func TestNewPublisherRejectsBadConfig(t *testing.T) {
	t.Parallel()
	ob, err := New(unreachablePool(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		queue string
		cfg   *PublisherConfig[string]
		field string
	}{
		{"empty queue", "", nil, "queue"},
		{"queue over 255 bytes", strings.Repeat("q", 256), nil, "queue"},
		{"queue with a control character", "a\nb", nil, "queue"},
		{"nil codec pointer", "q", &PublisherConfig[string]{Codec: (*nilCodec)(nil)}, "PublisherConfig.Codec"},
		{"negative payload cap", "q", &PublisherConfig[string]{MaxPayloadBytes: -1}, "PublisherConfig.MaxPayloadBytes"},
		{"payload cap over the limit", "q", &PublisherConfig[string]{MaxPayloadBytes: PayloadMaxBytesLimit + 1}, "PublisherConfig.MaxPayloadBytes"},
		{"unknown tier", "q", &PublisherConfig[string]{Tier: TierRing + 1}, "PublisherConfig.Tier"},
		{"negative tier", "q", &PublisherConfig[string]{Tier: -1}, "PublisherConfig.Tier"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewPublisher(ob, tt.queue, tt.cfg)
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tt.field {
				t.Fatalf("NewPublisher: %v; want a *ConfigError for %s", err, tt.field)
			}
		})
	}
	if _, err := NewPublisher[string](nil, "q", nil); err == nil {
		t.Error("NewPublisher with a nil outbox succeeded")
	}
}

func TestPublishRejectsBadInputAndWritesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher(t, e, "q", &PublisherConfig[string]{MaxPayloadBytes: 16})
	chanPub := newPublisher[chan int](t, e, "q", nil)
	panicPub := newPublisher(t, e, "q", &PublisherConfig[string]{Codec: panicCodec{}})

	tests := []struct {
		name  string
		call  func() error
		field string
	}{
		{"negative delay", func() error {
			_, err := pub.Publish(e.ctx, e.pubPool, "x", &PublishOpts{Delay: -time.Second})
			return err
		}, "PublishOpts.Delay"},
		{"delay and at", func() error {
			_, err := pub.Publish(e.ctx, e.pubPool, "x", &PublishOpts{Delay: time.Second, At: time.Now()})
			return err
		}, "PublishOpts.At"},
		{"timer id in a batch", func() error {
			_, err := pub.PublishBatch(e.ctx, e.pubPool, []string{"x"}, &PublishOpts{TimerID: "t"})
			return err
		}, "PublishOpts.TimerID"},
		{"empty header key", func() error {
			_, err := pub.Publish(e.ctx, e.pubPool, "x", &PublishOpts{Headers: map[string]string{"": "v"}})
			return err
		}, "PublishOpts.Headers"},
		{"non-printable header key", func() error {
			_, err := pub.Publish(e.ctx, e.pubPool, "x", &PublishOpts{Headers: map[string]string{"a\x01": "v"}})
			return err
		}, `PublishOpts.Headers["a\x01"]`},
		{"header key with a space", func() error {
			_, err := pub.Publish(e.ctx, e.pubPool, "x", &PublishOpts{Headers: map[string]string{"a b": "v"}})
			return err
		}, `PublishOpts.Headers["a b"]`},
		{"reserved content-type", func() error {
			_, err := pub.Publish(e.ctx, e.pubPool, "x", &PublishOpts{Headers: map[string]string{HeaderContentType: "x"}})
			return err
		}, `PublishOpts.Headers["content-type"]`},
		{"reserved correlation-id", func() error {
			_, err := pub.Publish(e.ctx, e.pubPool, "x", &PublishOpts{Headers: map[string]string{HeaderCorrelationID: "x"}})
			return err
		}, `PublishOpts.Headers["correlation-id"]`},
		{"reserved message-type", func() error {
			_, err := pub.Publish(e.ctx, e.pubPool, "x", &PublishOpts{Headers: map[string]string{HeaderMessageType: "x"}})
			return err
		}, `PublishOpts.Headers["message-type"]`},
		{"malformed traceparent", func() error {
			_, err := pub.Publish(e.ctx, e.pubPool, "x", &PublishOpts{Headers: map[string]string{HeaderTraceparent: "nope"}})
			return err
		}, `PublishOpts.Headers["traceparent"]`},
		{"oversized headers", func() error {
			_, err := pub.Publish(e.ctx, e.pubPool, "x", &PublishOpts{Headers: map[string]string{"big": strings.Repeat("v", HeadersMaxBytes)}})
			return err
		}, "PublishOpts.Headers"},
		{"oversized correlation id", func() error {
			_, err := pub.Publish(e.ctx, e.pubPool, "x", &PublishOpts{CorrelationID: strings.Repeat("c", 256)})
			return err
		}, "PublishOpts.CorrelationID"},
		{"oversized payload", func() error {
			_, err := pub.Publish(e.ctx, e.pubPool, strings.Repeat("p", 17), nil)
			return err
		}, "msg"},
		{"oversized payload in a batch", func() error {
			_, err := pub.PublishBatch(e.ctx, e.pubPool, []string{"ok", strings.Repeat("p", 17)}, nil)
			return err
		}, "msgs[1]"},
		{"unencodable message", func() error {
			_, err := chanPub.Publish(e.ctx, e.pubPool, make(chan int), nil)
			return err
		}, "msg"},
		{"panicking codec", func() error {
			_, err := panicPub.Publish(e.ctx, e.pubPool, "x", nil)
			return err
		}, "msg"},
		{"nil tx", func() error {
			_, err := pub.Publish(e.ctx, nil, "x", nil)
			return err
		}, "tx"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			var in *InputError
			if !errors.As(err, &in) {
				t.Fatalf("err = %v, want an *InputError", err)
			}
			if diff := cmp.Diff(tt.field, in.Field); diff != "" {
				t.Errorf("field (-want +got): %s (%v)", diff, err)
			}
			if !strings.Contains(err.Error(), in.Rule) {
				t.Errorf("message %q lacks the rule", err)
			}
		})
	}
	if n := e.count("outbox"); n != 0 {
		t.Errorf("bad input wrote %d rows", n)
	}
}

// TestBadInputLeavesTheTransactionUsable checks input the database would
// refuse: each must be an *InputError before any statement is sent, so the
// caller's transaction can go on and commit.
func TestBadInputLeavesTheTransactionUsable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher[string](t, e, "q", nil)
	opts := func(o PublishOpts) func(tx DBTX) error {
		return func(tx DBTX) error {
			_, err := pub.Publish(e.ctx, tx, "x", &o)
			return err
		}
	}
	batch := func(o PublishOpts) func(tx DBTX) error {
		return func(tx DBTX) error {
			_, err := pub.PublishBatch(e.ctx, tx, []string{"x", "y"}, &o)
			return err
		}
	}
	pgMin := time.Date(-4713, time.November, 24, 0, 0, 0, 0, time.UTC)             // 4714-11-24 00:00:00 UTC BC
	pgMax := time.Date(294276, time.December, 31, 23, 59, 59, 999999000, time.UTC) // 294276-12-31 23:59:59.999999 UTC
	tests := []struct {
		name  string
		call  func(tx DBTX) error
		field string
	}{
		{"NUL in a header value", opts(PublishOpts{Headers: map[string]string{"k": "a\x00b"}}), `PublishOpts.Headers["k"]`},
		{"NUL in a header value of a batch", batch(PublishOpts{Headers: map[string]string{"k": "\x00"}}), `PublishOpts.Headers["k"]`},
		{"NUL in a header key", opts(PublishOpts{Headers: map[string]string{"k\x00": "v"}}), `PublishOpts.Headers["k\x00"]`},
		{"NUL in the ordering key", opts(PublishOpts{OrderingKey: "a\x00b"}), "PublishOpts.OrderingKey"},
		{"NUL in the timer id", opts(PublishOpts{TimerID: "a\x00b"}), "PublishOpts.TimerID"},
		{"NUL in the correlation id", opts(PublishOpts{CorrelationID: "a\x00b"}), "PublishOpts.CorrelationID"},
		{"At a microsecond before timestamptz begins", opts(PublishOpts{At: pgMin.Add(-time.Microsecond)}), "PublishOpts.At"},
		{"At a nanosecond before timestamptz begins", opts(PublishOpts{At: pgMin.Add(-time.Nanosecond)}), "PublishOpts.At"},
		{"At just after timestamptz ends", opts(PublishOpts{At: pgMax.Add(time.Microsecond)}), "PublishOpts.At"},
		{"At far past timestamptz", batch(PublishOpts{At: time.Date(1<<40, 1, 1, 0, 0, 0, 0, time.UTC)}), "PublishOpts.At"},
		{"NUL in a timer id to cancel", func(tx DBTX) error {
			_, err := e.ob.CancelTimer(e.ctx, tx, "q", "a\x00b")
			return err
		}, "timerID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tx, err := e.db.Pool.Begin(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(context.Background()) }()
			err = tt.call(tx)
			var in *InputError
			if !errors.As(err, &in) || in.Field != tt.field {
				t.Fatalf("err = %v, want an *InputError for %s", err, tt.field)
			}
			id, err := pub.Publish(e.ctx, tx, tt.name, nil)
			if err != nil {
				t.Fatalf("Publish after the InputError: %v", err)
			}
			if err := tx.Commit(e.ctx); err != nil {
				t.Fatalf("Commit after the InputError: %v", err)
			}
			if r, ok := e.row(id); !ok || string(r.Payload) != tt.name {
				t.Errorf("row %d: %q, %v", id, r.Payload, ok)
			}
		})
	}
}

// TestPublishAtTheEdgesOfTheServersRange publishes the extreme schedules
// the server can store, in one transaction that must then commit.
func TestPublishAtTheEdgesOfTheServersRange(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher[string](t, e, "q", nil)
	pgMin := time.Date(-4713, time.November, 24, 0, 0, 0, 0, time.UTC)
	pgMax := time.Date(294276, time.December, 31, 23, 59, 59, 999999000, time.UTC)
	before := e.serverNow()
	tx := e.fixtureTx()
	var got []time.Time
	for _, o := range []PublishOpts{
		{At: pgMin},
		{At: pgMax},
		{At: pgMax.Add(999 * time.Nanosecond)}, // truncated to pgMax
		{Delay: math.MaxInt64},
	} {
		id, err := pub.Publish(e.ctx, tx, "x", &o)
		if err != nil {
			t.Fatalf("Publish(%+v): %v", o, err)
		}
		var due time.Time
		if err := tx.QueryRow(e.ctx, "SELECT next_attempt_at FROM outbox WHERE id = $1", id).Scan(&due); err != nil {
			t.Fatal(err)
		}
		got = append(got, due)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if got[0].Before(before) || got[0].After(e.serverNow()) {
		t.Errorf("At %v is due %v; want now (a time in the past means now)", pgMin, got[0])
	}
	if diff := cmp.Diff([]time.Time{pgMax, pgMax}, got[1:3], cmpopts.EquateApproxTime(0)); diff != "" {
		t.Errorf("At at the end of the range (-want +got):\n%s", diff)
	}
	if lo := before.Add(math.MaxInt64).Truncate(time.Microsecond); got[3].Before(lo) || got[3].After(lo.Add(time.Minute)) {
		t.Errorf("Delay %v is due %v; want about %v", time.Duration(math.MaxInt64), got[3], lo)
	}
}

// TestNilPayloadIsStoredEmpty publishes nil []byte payloads, alone and in
// a batch, in a transaction that must then commit.
func TestNilPayloadIsStoredEmpty(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher[[]byte](t, e, "raw", nil)
	tx := e.begin()
	id, err := pub.Publish(e.ctx, tx, nil, nil)
	if err != nil {
		t.Fatalf("Publish(nil): %v", err)
	}
	batch, err := pub.PublishBatch(e.ctx, tx, [][]byte{[]byte("a"), nil, {}}, nil)
	if err != nil {
		t.Fatalf("PublishBatch with a nil element: %v", err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	got := map[int64]string{}
	for _, id := range append([]int64{id}, batch...) {
		r, ok := e.row(id)
		if !ok {
			t.Fatalf("row %d missing", id)
		}
		got[id] = string(r.Payload)
	}
	want := map[int64]string{id: "", batch[0]: "a", batch[1]: "", batch[2]: ""}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("payloads (-want +got):\n%s", diff)
	}

	delivered := make(chan []byte, 4)
	startSub(t, e.ob, []string{"raw"}, func(_ context.Context, m *Message[[]byte]) error {
		delivered <- m.Payload
		return nil
	}, fastConfig[[]byte](nil))
	for range 4 {
		select {
		case p := <-delivered:
			if p == nil || (len(p) != 0 && string(p) != "a") {
				t.Errorf("delivered %#v; want an empty, non-nil slice or \"a\"", p)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("not every row was delivered")
		}
	}
}
