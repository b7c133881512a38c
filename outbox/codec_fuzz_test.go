package outbox

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fuzzOrder is a message with a field of most kinds encoding/json knows.
type fuzzOrder struct {
	ID       string            `json:"id"`
	Total    int64             `json:"total"`
	Rate     float64           `json:"rate,omitempty"`
	Gift     bool              `json:"gift"`
	Note     *string           `json:"note"`
	Lines    []fuzzLine        `json:"lines"`
	Tags     map[string]string `json:"tags,omitempty"`
	Counts   map[int]uint8     `json:"counts,omitempty"`
	Placed   time.Time         `json:"placed"`
	Timeout  time.Duration     `json:"timeout"`
	Raw      json.RawMessage   `json:"raw,omitempty"`
	Sig      []byte            `json:"sig,omitempty"`
	Sum      [2]int16          `json:"sum"`
	Extra    any               `json:"extra"`
	Quoted   int               `json:"quoted,string"`
	fuzzLine                   // embedded: its fields are inlined
}

type fuzzLine struct {
	SKU string `json:"sku"`
	Qty uint   `json:"qty"`
}

// codecCase decodes a payload with one codec and checks what it got.
type codecCase struct {
	name string
	run  func(t *testing.T, payload []byte)
}

// jsonCase checks JSONCodec[T]: Decode does not panic; what it decodes
// encodes again and decodes to the same value (omitempty turns an empty
// map or slice into an absent, nil one).
func jsonCase[T any](name string) codecCase {
	return codecCase{name, func(t *testing.T, payload []byte) {
		var c JSONCodec[T]
		checkCodec(t, name, c, payload)
		v, err := c.Decode(payload)
		if err != nil {
			return
		}
		b, err := c.Encode(v)
		if err != nil {
			t.Fatalf("%s: Decode(%q) = %#v, which does not encode: %v", name, payload, v, err)
		}
		w, err := c.Decode(b)
		if err != nil {
			t.Fatalf("%s: Decode(%q) = %#v, whose encoding %s does not decode: %v", name, payload, v, b, err)
		}
		if diff := cmp.Diff(v, w, cmp.AllowUnexported(fuzzOrder{}), rawJSONEqual, emptyEqual); diff != "" {
			t.Fatalf("%s: Decode(%q) re-encoded as %s decodes differently (-first +second):\n%s", name, payload, b, diff)
		}
	}}
}

// rawJSONEqual compares raw JSON by what it holds: encoding/json compacts
// a RawMessage it encodes, and escapes <, > and & in it.
var rawJSONEqual = cmp.FilterValues(func(x, y any) bool {
	_, rx := x.(json.RawMessage)
	_, ry := y.(json.RawMessage)
	return rx && ry
}, cmp.Comparer(func(a, b json.RawMessage) bool {
	va, erra := decodeJSON(a)
	vb, errb := decodeJSON(b)
	if erra != nil || errb != nil {
		return bytes.Equal(a, b)
	}
	return cmp.Equal(va, vb)
}))

func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

// emptyEqual takes nil and empty maps and slices for equal, as omitempty
// turns an empty one into an absent, nil one. Raw JSON has its own rule.
var emptyEqual = cmp.FilterValues(func(x, y any) bool {
	if _, raw := x.(json.RawMessage); raw {
		return false
	}
	vx, vy := reflect.ValueOf(x), reflect.ValueOf(y)
	return vx.IsValid() && vy.IsValid() && vx.Type() == vy.Type() && (vx.Kind() == reflect.Slice || vx.Kind() == reflect.Map) && vx.Len() == 0 && vy.Len() == 0
}, cmp.Comparer(func(_, _ any) bool { return true }))

// checkCodec runs c.Decode bare, so that a panic fails the fuzz target,
// then through decodePayload, which must agree with it.
func checkCodec[T any](t *testing.T, name string, c Codec[T], payload []byte) {
	t.Helper()
	_, err := c.Decode(payload)
	_, perr := decodePayload(c, payload)
	if (err == nil) != (perr == nil) {
		t.Fatalf("%s: Decode(%q) error %v, decodePayload error %v", name, payload, err, perr)
	}
	if perr != nil && !strings.Contains(perr.Error(), "codec ") {
		t.Fatalf("%s: decodePayload(%q) error %q does not name the codec", name, payload, perr)
	}
}

var codecCases = []codecCase{
	jsonCase[fuzzOrder]("JSONCodec[fuzzOrder]"),
	jsonCase[*fuzzOrder]("JSONCodec[*fuzzOrder]"),
	jsonCase[map[string]any]("JSONCodec[map[string]any]"),
	jsonCase[[]int64]("JSONCodec[[]int64]"),
	jsonCase[any]("JSONCodec[any]"),
	jsonCase[string]("JSONCodec[string]"),
	jsonCase[[]byte]("JSONCodec[[]byte]"),
	jsonCase[time.Time]("JSONCodec[time.Time]"),
	jsonCase[float64]("JSONCodec[float64]"),
	{"BytesCodec", func(t *testing.T, payload []byte) {
		checkCodec(t, "BytesCodec", BytesCodec{}, payload)
		v, err := BytesCodec{}.Decode(payload)
		if err != nil || !bytes.Equal(v, payload) {
			t.Fatalf("BytesCodec.Decode(%q) = %q, %v; want the payload", payload, v, err)
		}
	}},
	{"StringCodec", func(t *testing.T, payload []byte) {
		checkCodec(t, "StringCodec", StringCodec{}, payload)
		v, err := StringCodec{}.Decode(payload)
		if err != nil || v != string(payload) {
			t.Fatalf("StringCodec.Decode(%q) = %q, %v; want the payload", payload, v, err)
		}
		if b, err := (StringCodec{}).Encode(v); err != nil || !bytes.Equal(b, payload) {
			t.Fatalf("StringCodec.Encode(%q) = %q, %v; want the payload back", v, b, err)
		}
	}},
}

// FuzzCodecDecode feeds every built-in codec arbitrary payloads, as rows
// written by other clients or by another codec may hold: decoding never
// panics, an undecodable payload is an error, and a decoded message
// encodes again to a payload that decodes to the same message.
func FuzzCodecDecode(f *testing.F) {
	for _, s := range []string{
		"", "null", "{}", "[]", `"x"`, "1", "-0", "1e400", "0.1", "true",
		`{"id":"o-1","total":1999,"gift":true,"note":null,"lines":[{"sku":"a","qty":2}],"tags":{"k":"v"},"counts":{"1":2},` +
			`"placed":"2024-01-02T03:04:05.123456789+01:00","timeout":5,"raw":{"x":[1]},"sig":"AQI=","sum":[1,2],"extra":{"a":null},"quoted":"42","sku":"b","qty":1}`,
		`{"placed":"0000-01-01T00:00:00Z"}`, `{"placed":"9999-12-31T23:59:59.999999999-23:59"}`, `"2024-01-02T03:04:05Z"`,
		`{"tags":{}}`, `{"quoted":42}`, `{"quoted":"\"42\""}`, `{"counts":{"x":1}}`, `{"counts":{"-1":1}}`, `{"sum":[1,2,3]}`, `{"qty":-1}`,
		`{"ID":"a","id":"b"}`, "{\"id\":\"\xff\"}", `{"id":"\ud800"}`, `[1,2,3]`, `[1.5]`, `{"a":1}{"b":2}`, `{"a":`,
		`{"sig":"not base64"}`, `"AQI="`, `{"raw":}`, strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
		"\xef\xbb\xbf{}", "\x00",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		for _, c := range codecCases {
			c.run(t, payload)
		}
	})
}
