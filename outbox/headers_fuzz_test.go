package outbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/internal/msgtype"
)

// FuzzHeadersRoundTrip checks that headers a publisher accepts are stored
// as a JSON object PostgreSQL's jsonb takes (valid UTF-8, no NUL) and
// decode, as a subscriber reads them, to exactly the caller's headers
// plus the reserved ones; and that headers it refuses get an *InputError
// naming the headers field.
func FuzzHeadersRoundTrip(f *testing.F) {
	f.Add("x-tenant", "acme", "", "", "corr-1", "app.Order")
	f.Add("a", "", "b", "é\u2028<&>", "", "")
	f.Add(HeaderTraceparent, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "k", `"\`, "c", "")
	f.Add(HeaderTraceparent, "00-XYZ", "", "", "c", "")
	f.Add("", "v", "", "", "c", "")
	f.Add("k k", "v", "", "", "c", "")
	f.Add("k", "a\x00b", "", "", "c", "")
	f.Add("k", "\xff", "", "", "c", "")
	f.Add(HeaderContentType, "text/plain", "", "", "c", "")
	f.Add(HeaderMessageType, "x", "", "", "c", "")
	f.Add("k", strings.Repeat("v", HeadersMaxBytes), "", "", "c", "")
	f.Add("Content-Type", "x", "\u00a0", "y", "c", "")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, correlationID, messageType string) {
		h := map[string]string{}
		if k1 != "" || v1 != "" {
			h[k1] = v1
		}
		if k2 != "" || v2 != "" {
			h[k2] = v2
		}
		// The publisher validates the correlation id and the message
		// type before they reach the headers.
		if checkKey("PublishOpts.CorrelationID", correlationID) != nil || correlationID == "" {
			return
		}
		if len(messageType) > messageTypeMaxBytes || !msgtype.Printable(messageType, true) {
			return
		}
		reserved := len(HeaderContentType) + len(ContentTypeJSON) + len(HeaderCorrelationID) + len(correlationID)
		if messageType != "" {
			reserved += len(HeaderMessageType) + len(messageType)
		}
		if err := checkHeaders("PublishOpts.Headers", h, reserved); err != nil {
			var ie *InputError
			if !errors.As(err, &ie) || !strings.HasPrefix(ie.Field, "PublishOpts.Headers") || ie.Rule == "" {
				t.Fatalf("checkHeaders(%q) = %v (%T); want an *InputError naming the headers", h, err, err)
			}
			return
		}
		raw, err := encodeHeaders(h, ContentTypeJSON, correlationID, messageType)
		if err != nil {
			t.Fatalf("encodeHeaders(%q) of accepted headers: %v", h, err)
		}
		if !utf8.Valid(raw) || bytes.Contains(raw, []byte(`\u0000`)) || raw[0] != '{' {
			t.Fatalf("encodeHeaders(%q) = %s: jsonb cannot store it as an object", h, raw)
		}
		want := maps.Clone(h)
		want[HeaderContentType] = ContentTypeJSON
		want[HeaderCorrelationID] = correlationID
		if messageType != "" {
			want[HeaderMessageType] = messageType
		}
		got, err := (&headerCache{}).decode(raw)
		if err != nil {
			t.Fatalf("decode(%s): %v", raw, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("headers %q came back different (-want +got):\n%s", h, diff)
		}
	})
}

// FuzzHeadersDecode feeds a subscriber's header decoding arbitrary bytes,
// as rows written by other clients may hold: it never panics, and what it
// accepts re-encodes to a document that decodes to the same headers. The
// cache it keeps never lets a handler's changes leak into the next
// message.
func FuzzHeadersDecode(f *testing.F) {
	for _, s := range []string{
		`{"content-type":"application/json","correlation-id":"c"}`, `{}`, `null`, ` null `, `[]`, `"x"`, `1`,
		`{"a":1}`, `{"a":null}`, `{"a":"x","a":"y"}`, `{"a":"\ud800"}`, "{\"a\":\"\xff\"}", `{"a":"\u0000"}`,
		`{"a":"b"} {}`, `{"a":`, `{"":""}`, `{"A":"1","a":"2"}`, "",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		hc := &headerCache{}
		m, err := hc.decode(raw)
		if err != nil {
			if _, again := hc.decode(raw); again == nil {
				t.Fatalf("decode(%q) failed (%v), then succeeded", raw, err)
			}
			return
		}
		doc, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("decode(%q) = %q, which does not encode: %v", raw, m, err)
		}
		again, err := (&headerCache{}).decode(doc)
		if err != nil {
			t.Fatalf("decode(%q) = %q, whose encoding %s does not decode: %v", raw, m, doc, err)
		}
		if diff := cmp.Diff(m, again); diff != "" {
			t.Fatalf("decode(%q) = %q; re-encoded as %s it decodes differently (-first +second):\n%s", raw, m, doc, diff)
		}
		want := maps.Clone(m)
		if m != nil {
			m["changed-by-handler"] = "x"
		}
		cached, err := hc.decode(raw)
		if err != nil {
			t.Fatalf("decode(%q) succeeded, then failed: %v", raw, err)
		}
		if diff := cmp.Diff(want, cached); diff != "" {
			t.Fatalf("second decode(%q) differs from the first (-first +second):\n%s", raw, diff)
		}
	})
}
