package outbox

import (
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// headerDocuments are header documents as PostgreSQL prints them and as
// other clients may write them, each read by stringObject or left to
// encoding/json (fast: stringObject reads it).
var headerDocuments = []struct {
	raw  string
	fast bool
}{
	{`{"content-type": "application/json", "message-type": "shop.order", "correlation-id": "0b5c3a9e-4e0f-4c2a-9a57-2f1d9f0c1e11"}`, true},
	{`{}`, true},
	{` { } `, true},
	{"{\n\t\"a\" :\r\"b\" ,\"c\":\"d\"}\n", true},
	{`{"":""}`, true},
	{`{"a": "x", "a": "y"}`, true},
	{`{"A": "1", "a": "2"}`, true},
	{`{"q": "say \"hi\"", "p": "a\\b", "s": "a\/b", "c": "\b\f\n\r\t"}`, true},
	{`{"k\"ey": "v"}`, true},
	{`{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`, true},
	{`{"é": "ünïcödé", "emoji": "😀", "sep": "` + "\u2028" + `"}`, true},
	{`{"a": "\u00e9"}`, false},
	{`{"a": "\ud800"}`, false},
	{`{"a": "\u0000"}`, false},
	{"{\"a\": \"\xff\"}", false},
	{"{\"a\": \"\xed\xa0\x80\"}", false},
	{"{\"a\": \"x\ty\"}", false},
	{`{"a": 1}`, false},
	{`{"a": null}`, false},
	{`{"a": true}`, false},
	{`{"a": {"b": "c"}}`, false},
	{`{"a": ["b"]}`, false},
	{`{"a": "b",}`, false},
	{`{"a" "b"}`, false},
	{`{"a": "b"} {}`, false},
	{`{"a": "b"`, false},
	{`{"a": "b\`, false},
	{`{"a": "\x"}`, false},
	{`{a: "b"}`, false},
	{`null`, false},
	{`[]`, false},
	{`"x"`, false},
	{``, false},
}

// TestHeaderDocumentsReadAsEncodingJSONReadsThem checks stringObject,
// the header reading a subscriber does for every row whose headers
// differ from the last one's, against encoding/json: what it reads, it
// reads to the same map; what it leaves, decode reads as before.
func TestHeaderDocumentsReadAsEncodingJSONReadsThem(t *testing.T) {
	t.Parallel()
	for _, d := range headerDocuments {
		t.Run(fmt.Sprintf("%q", d.raw), func(t *testing.T) {
			t.Parallel()
			got, ok := stringObject(d.raw)
			if ok != d.fast {
				t.Fatalf("stringObject read it: %v, want %v", ok, d.fast)
			}
			var want map[string]string
			werr := json.Unmarshal([]byte(d.raw), &want)
			if ok {
				if werr != nil {
					t.Fatalf("stringObject read %q, which encoding/json refuses: %v", got, werr)
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("stringObject differs from encoding/json (-json +stringObject):\n%s", diff)
				}
			}
			m, err := (&headerCache{}).decode([]byte(d.raw))
			ref, rerr := decodeHeadersJSON([]byte(d.raw))
			if (err == nil) != (rerr == nil) || (err != nil && err.Error() != rerr.Error()) {
				t.Fatalf("decode error %v, encoding/json's reading %v", err, rerr)
			}
			if diff := cmp.Diff(ref, m); diff != "" {
				t.Errorf("decode differs from encoding/json's reading (-json +decode):\n%s", diff)
			}
		})
	}
}

// FuzzHeadersReadAsEncodingJSONReadsThem is the test above on arbitrary
// documents: decode, with stringObject first, gives what encoding/json's
// reading gives, the same headers or the same error.
func FuzzHeadersReadAsEncodingJSONReadsThem(f *testing.F) {
	for _, d := range headerDocuments {
		f.Add([]byte(d.raw))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		fast, ok := stringObject(string(raw))
		var want map[string]string
		if werr := json.Unmarshal(raw, &want); ok && werr != nil {
			t.Fatalf("stringObject read %q as %q; encoding/json refuses it: %v", raw, fast, werr)
		}
		if ok {
			if diff := cmp.Diff(want, fast); diff != "" {
				t.Fatalf("stringObject(%q) differs from encoding/json (-json +stringObject):\n%s", raw, diff)
			}
		}
		m, err := (&headerCache{}).decode(raw)
		ref, rerr := decodeHeadersJSON(raw)
		if (err == nil) != (rerr == nil) || (err != nil && err.Error() != rerr.Error()) {
			t.Fatalf("decode(%q) error %v; encoding/json's reading %v", raw, err, rerr)
		}
		if diff := cmp.Diff(ref, m); diff != "" {
			t.Fatalf("decode(%q) differs from encoding/json's reading (-json +decode):\n%s", raw, diff)
		}
	})
}

// BenchmarkHeaderDecode measures the reading of a header document that
// differs from the last row's (one correlation id per message, as
// Publish writes), by decode and by encoding/json alone, and of one that
// is the last row's (the rows of one PublishBatch).
func BenchmarkHeaderDecode(b *testing.B) {
	raw := []byte(headerDocuments[0].raw)
	b.Run("same-document", func(b *testing.B) {
		b.ReportAllocs()
		var hc headerCache
		for b.Loop() {
			if _, err := hc.decode(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
	other := []byte(strings.Replace(string(raw), "0b5c3a9e", "1c6d4b0f", 1))
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		var hc headerCache
		docs := [][]byte{raw, other}
		i := 0
		for b.Loop() {
			i++
			if _, err := hc.decode(docs[i%2]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		// decode before stringObject: encoding/json, the document kept
		// for the cache, and the handler's copy.
		b.ReportAllocs()
		for b.Loop() {
			m, err := decodeHeadersJSON(raw)
			if err != nil {
				b.Fatal(err)
			}
			keep := string(raw)
			_, _ = keep, maps.Clone(m)
		}
	})
}
