package outboxgojson_test

import (
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	gojson "github.com/goccy/go-json"

	outboxgojson "github.com/outboxgen/outboxgen/contrib/gojson"
	"github.com/outboxgen/outboxgen/outbox"
)

// FuzzDecodeMatchesEncodingJSON decodes its input into an Event and into
// an interface value with both codecs: both must fail, or both succeed
// with equal values.
func FuzzDecodeMatchesEncodingJSON(f *testing.F) {
	for _, c := range decodeCases() {
		if len(c.in) <= 4096 {
			f.Add([]byte(c.in))
		}
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if d := decodeBoth[Event](in); d != "" && !float32Explained(in) && !stringOptionExplained(in) {
			t.Errorf("into Event, input %q:\n%s", in, d)
		}
		if d := decodeBoth[any](in); d != "" {
			t.Errorf("into any, input %q:\n%s", in, d)
		}
	})
}

// float32Explained reports whether the two decodings of in into an Event
// differ only as the Codec's documentation says go-json decodes a
// float32: as the float64 nearest to the number, converted to a float32
// (rounded twice), and refused when that float64 exceeds
// math.MaxFloat32, though the number rounds to math.MaxFloat32 as a
// float32. Both codecs must agree on in decoded into an EventOf[float64],
// whose Ratio is a float64.
func float32Explained(in []byte) bool {
	if decodeBoth[EventOf[float64]](in) != "" {
		return false
	}
	wide, err := outbox.JSONCodec[EventOf[float64]]{}.Decode(in)
	if err != nil {
		return false
	}
	std, stdErr := outbox.JSONCodec[Event]{}.Decode(in)
	got, err := outboxgojson.Codec[Event]{}.Decode(in)
	if stdErr != nil {
		return false
	}
	var typeErr *gojson.UnmarshalTypeError
	if err != nil {
		return math.Abs(wide.Ratio) > math.MaxFloat32 &&
			errors.As(err, &typeErr) && typeErr.Type == reflect.TypeFor[float32]()
	}
	if got.Ratio != float32(wide.Ratio) {
		return false
	}
	got.Ratio = std.Ratio
	return decodeEqual(std, got)
}

// stringOptionExplained reports whether the two decodings of in into an
// Event differ as the Codec's documentation says go-json reads a number of
// a field with the string option: encoding/json refuses the JSON string
// of such a field unless it starts with '-' or a digit, and go-json
// accepts what strconv parses, such as "+1", ".5" or "NaN". encoding/json
// stops at the first error, so the rest of such an input is not compared.
func stringOptionExplained(in []byte) bool {
	_, stdErr := outbox.JSONCodec[Event]{}.Decode(in)
	_, err := outboxgojson.Codec[Event]{}.Decode(in)
	if stdErr == nil || err != nil {
		return false
	}
	m := stringOptionError.FindStringSubmatch(stdErr.Error())
	if m == nil {
		return false
	}
	s, err := strconv.Unquote(m[1])
	return err == nil && s != "" && strings.ContainsRune("+.iInN", rune(s[0]))
}

// stringOptionError matches the error of encoding/json for a JSON string
// of a field with the string option which does not start as a number.
var stringOptionError = regexp.MustCompile(`^json: invalid use of ,string struct tag, trying to unmarshal ("(?:[^"\\]|\\.)*") into `)

// FuzzEncodeMatchesEncodingJSON encodes an Event whose fields hold the
// fuzzed values, and some of those values alone, with both codecs: both
// must fail, or both succeed with the same bytes.
func FuzzEncodeMatchesEncodingJSON(f *testing.F) {
	f.Add("evt_1", "order.created", int64(7), uint64(42), 129.5, []byte(`{"a":[1,2.5e3,"x"]}`))
	f.Add(`<a href="x">&amp;</a>`, "x<y>&z", int64(-1), uint64(math.MaxUint64), 1e21, []byte(` [ 1 ,	"<&>" ] `))
	f.Add("a\xffb\xc3", "\xed\xa0\x80", int64(math.MinInt64), uint64(0), 1e-7, []byte("\"\xff\""))
	f.Add("\x00\x01\b\f\n\r\t\x1f\x7f\"\\/", "\u2028\u2029", int64(math.MaxInt64), uint64(1<<63), math.MaxFloat64, []byte(`{"a":}`))
	f.Add("größe 😀 \ufeff", "GRÖßE", int64(1e12), uint64(255), math.SmallestNonzeroFloat64, []byte(``))
	f.Add("", "", int64(0), uint64(0), math.Copysign(0, -1), []byte(`null`))
	f.Add("1", "-1", int64(-128), uint64(65536), float64(math.MaxFloat32), []byte(`1 2`))
	f.Add("id", "ID", int64(253402300800), uint64(999999999), math.NaN(), []byte(`"\u2028"`))
	f.Add("K", "\u212a", int64(-62135596801), uint64(1<<40), math.Inf(1), []byte(`{"b":1,"a":2,"b":3}`))
	f.Add("1e400", "C-1", int64(3), uint64(16777217), 0.1, []byte(`1e400`))
	f.Add("x", "y", int64(-9), uint64(1<<32|86399), 3.4028235677973366e38, []byte(`[-0, 1E+2, 0.10]`))
	f.Fuzz(func(t *testing.T, s, key string, n int64, u uint64, x float64, raw []byte) {
		e := eventFrom(s, key, n, u, x, raw)
		check := func(what string, d string) {
			if d != "" {
				t.Errorf("%s of (%q, %q, %d, %d, %v, %q):\n%s", what, s, key, n, u, x, raw, d)
			}
		}
		check("Event", encodeBoth(e))
		check("*Event", encodeBoth(&e))
		check("float64", encodeBoth(x))
		check("float32", encodeBoth(float32(x)))
		check("json.RawMessage", encodeBoth(json.RawMessage(raw)))
		check("MarshalJSON output", encodeBoth(rawJSON(raw)))
		check("string of bytes", encodeBoth(string(raw)))
		check("time", encodeBoth(timeFrom(key, n, u)))
		check("map", encodeBoth(map[string]any{s: x, key: raw, string(raw): n}))
	})
}

// eventFrom returns an Event of the fuzzed values. Values which make
// encoding fail (a NaN, an infinity, a year beyond 9999, invalid raw JSON)
// are left out, so that the other fields are compared; the fuzz function
// encodes them alone.
func eventFrom(s, key string, n int64, u uint64, x float64, raw []byte) Event {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		x = 0
	}
	ratio := float32(x)
	if math.IsInf(float64(ratio), 0) {
		ratio = 0
	}
	ref := n
	code := Code(u)
	at := timeFrom(key, n, u)
	if at.Year() < 0 || at.Year() > 9999 {
		at = time.Time{}
	}
	e := Event{
		Header: Header{ID: s, Kind: key, Version: int(n), Seq: n},
		trace:  trace{TraceID: s},
		Kind:   s,
		Total:  Money{Amount: s, Currency: key},
		Note:   &s,
		Qty:    int(n), Price: x, Paid: n%2 == 0, Ref: &ref, Label: s,
		Count: int8(n), Units: uint16(u), Big: u, Delta: n, Ratio: ratio, Score: x,
		Tags: []string{s, key}, Lines: []Money{{Amount: key, Currency: s}}, Matrix: [2][2]int{{int(n), int(u)}, {int(u), int(n)}},
		Blob: raw, Digest: [4]byte{byte(u), byte(u >> 8), byte(u >> 16), byte(u >> 24)},
		Attrs: map[string]string{s: key, key: s}, ByID: map[int]string{int(n): s, int(u): key}, ByCode: map[Code]int{Code(n): 1, Code(u): 2},
		Level: Level(n), Code: Code(n), CodePtr: &code, Window: Window{int(n), int(u)}, WinPtr: &Window{int(u), int(n)},
		Any: map[string]any{s: x, key: []any{n, u, s, nil, true}},
		At:  at, AtPtr: &at,
		Opt: s, OptStruct: Money{Amount: key},
		OptTime: at, Zero: at, ZeroSpan: Span{int(n), int(u)}, ZeroMoney: Money{Amount: s},
		Skip: s, Dash: key, Plain: s, Größe: key, HTMLKey: s, private: int(n),
	}
	if json.Valid(raw) {
		e.Raw = raw
	}
	if n%2 != 0 {
		e.Audit = &Audit{Version: int(u), By: key}
		e.Discount = &Money{Amount: s}
		e.OptInts = []int{int(n)}
		e.OptMap = map[string]int{key: int(n)}
		e.OptPtr = new(int(n))
		e.ZeroInts = []int{}
	}
	return e
}

// timeFrom returns a time of the fuzzed values, in a zone of up to 26
// hours from UTC, with seconds.
func timeFrom(zone string, n int64, u uint64) time.Time {
	return time.Unix(n, int64(u%1e9)).In(time.FixedZone(zone, int(int32(u>>32))%(26*3600)))
}
