package outbox

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
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
			_, err := pub.Publish(e.ctx, e.db.Pool, "x", &PublishOpts{Delay: -time.Second})
			return err
		}, "PublishOpts.Delay"},
		{"delay and at", func() error {
			_, err := pub.Publish(e.ctx, e.db.Pool, "x", &PublishOpts{Delay: time.Second, At: time.Now()})
			return err
		}, "PublishOpts.At"},
		{"timer id in a batch", func() error {
			_, err := pub.PublishBatch(e.ctx, e.db.Pool, []string{"x"}, &PublishOpts{TimerID: "t"})
			return err
		}, "PublishOpts.TimerID"},
		{"empty header key", func() error {
			_, err := pub.Publish(e.ctx, e.db.Pool, "x", &PublishOpts{Headers: map[string]string{"": "v"}})
			return err
		}, "PublishOpts.Headers"},
		{"non-printable header key", func() error {
			_, err := pub.Publish(e.ctx, e.db.Pool, "x", &PublishOpts{Headers: map[string]string{"a\x01": "v"}})
			return err
		}, `PublishOpts.Headers["a\x01"]`},
		{"header key with a space", func() error {
			_, err := pub.Publish(e.ctx, e.db.Pool, "x", &PublishOpts{Headers: map[string]string{"a b": "v"}})
			return err
		}, `PublishOpts.Headers["a b"]`},
		{"reserved content-type", func() error {
			_, err := pub.Publish(e.ctx, e.db.Pool, "x", &PublishOpts{Headers: map[string]string{HeaderContentType: "x"}})
			return err
		}, `PublishOpts.Headers["content-type"]`},
		{"reserved correlation-id", func() error {
			_, err := pub.Publish(e.ctx, e.db.Pool, "x", &PublishOpts{Headers: map[string]string{HeaderCorrelationID: "x"}})
			return err
		}, `PublishOpts.Headers["correlation-id"]`},
		{"malformed traceparent", func() error {
			_, err := pub.Publish(e.ctx, e.db.Pool, "x", &PublishOpts{Headers: map[string]string{HeaderTraceparent: "nope"}})
			return err
		}, `PublishOpts.Headers["traceparent"]`},
		{"oversized headers", func() error {
			_, err := pub.Publish(e.ctx, e.db.Pool, "x", &PublishOpts{Headers: map[string]string{"big": strings.Repeat("v", HeadersMaxBytes)}})
			return err
		}, "PublishOpts.Headers"},
		{"oversized correlation id", func() error {
			_, err := pub.Publish(e.ctx, e.db.Pool, "x", &PublishOpts{CorrelationID: strings.Repeat("c", 256)})
			return err
		}, "PublishOpts.CorrelationID"},
		{"oversized payload", func() error {
			_, err := pub.Publish(e.ctx, e.db.Pool, strings.Repeat("p", 17), nil)
			return err
		}, "msg"},
		{"oversized payload in a batch", func() error {
			_, err := pub.PublishBatch(e.ctx, e.db.Pool, []string{"ok", strings.Repeat("p", 17)}, nil)
			return err
		}, "msgs[1]"},
		{"unencodable message", func() error {
			_, err := chanPub.Publish(e.ctx, e.db.Pool, make(chan int), nil)
			return err
		}, "msg"},
		{"panicking codec", func() error {
			_, err := panicPub.Publish(e.ctx, e.db.Pool, "x", nil)
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
