package outboxgojson_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	gojson "github.com/goccy/go-json"
	"github.com/google/go-cmp/cmp"

	outboxgojson "github.com/outboxgen/outboxgen/contrib/gojson"
	"github.com/outboxgen/outboxgen/outbox"
)

// cmpOpts compares decoded values field by field, unexported fields
// included, and time.Time by instant, offset and zone name.
var cmpOpts = cmp.Options{
	cmp.Exporter(func(reflect.Type) bool { return true }),
	cmp.Comparer(func(a, b time.Time) bool {
		an, ao := a.Zone()
		bn, bo := b.Zone()
		return a.Equal(b) && an == bn && ao == bo && (a.Location() == time.UTC) == (b.Location() == time.UTC)
	}),
}

// decodeBoth decodes in into a T with outbox.JSONCodec and with the codec
// of this package, and reports where the two differ: one fails and the
// other does not, or both succeed with different values. Error messages
// are not compared.
func decodeBoth[T any](in []byte) (diff string) {
	std, stdErr := outbox.JSONCodec[T]{}.Decode(in)
	got, err := outboxgojson.Codec[T]{}.Decode(in)
	switch {
	case (stdErr == nil) != (err == nil):
		return "encoding/json error: " + errText(stdErr) + "\ngo-json error: " + errText(err)
	case err != nil, decodeEqual(std, got):
		return ""
	}
	return "decoded values differ (-encoding/json +go-json):\n" + cmp.Diff(std, got, cmpOpts)
}

// decodeEqual reports whether two decoded values are equal by cmpOpts.
// reflect.DeepEqual answers first: cmp is slow on deep values, and values
// reflect.DeepEqual finds equal are equal by cmpOpts.
func decodeEqual[T any](a, b T) bool {
	return reflect.DeepEqual(a, b) || cmp.Equal(a, b, cmpOpts)
}

// encodeBoth encodes v with outbox.JSONCodec and with the codec of this
// package, and reports where the two differ: one fails and the other does
// not, or both succeed with different bytes.
func encodeBoth[T any](v T) (diff string) {
	std, stdErr := outbox.JSONCodec[T]{}.Encode(v)
	got, err := outboxgojson.Codec[T]{}.Encode(v)
	switch {
	case (stdErr == nil) != (err == nil):
		return "encoding/json error: " + errText(stdErr) + "\ngo-json error: " + errText(err)
	case err != nil:
		return ""
	case !bytes.Equal(std, got):
		return "encoding/json: " + string(std) + "\ngo-json:       " + string(got)
	}
	return ""
}

func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// as returns a decode check of input into T.
func as[T any]() func([]byte) string { return decodeBoth[T] }

func TestCodec(t *testing.T) {
	t.Parallel()
	c := outboxgojson.Codec[Order]{}
	if got := c.ContentType(); got != outbox.ContentTypeJSON {
		t.Errorf("ContentType() = %q, want %q", got, outbox.ContentTypeJSON)
	}
	b, err := c.Encode(order)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != orderPayload {
		t.Errorf("Encode = %s, want %s", b, orderPayload)
	}
	out, err := c.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if out != order {
		t.Errorf("Decode = %+v, want %+v", out, order)
	}
}

// TestErrors checks what callers can find in the errors: the error a
// method returned, with both codecs; and the types of the errors of the
// decoding itself, which are go-json's own.
func TestErrors(t *testing.T) {
	t.Parallel()
	_, stdErr := outbox.JSONCodec[[]any]{}.Encode([]any{failingMarshaler{}})
	_, err := outboxgojson.Codec[[]any]{}.Encode([]any{failingMarshaler{}})
	if !errors.Is(stdErr, errMarshal) || !errors.Is(err, errMarshal) {
		t.Errorf("MarshalJSON error not found by errors.Is: encoding/json %v, go-json %v", stdErr, err)
	}
	_, stdErr = outbox.JSONCodec[Window]{}.Decode([]byte(`[1,"x"]`))
	_, err = outboxgojson.Codec[Window]{}.Decode([]byte(`[1,"x"]`))
	var stdType *json.UnmarshalTypeError // the error of Window.UnmarshalJSON, returned as it is
	if !errors.As(stdErr, &stdType) || !errors.As(err, &stdType) {
		t.Errorf("UnmarshalJSON error not found by errors.As: encoding/json %#v, go-json %#v", stdErr, err)
	}
	_, err = outboxgojson.Codec[Event]{}.Decode([]byte(`{"count":"x"}`))
	if errors.As(err, &stdType) || !errors.As(err, new(*gojson.UnmarshalTypeError)) {
		t.Errorf("go-json type error %#v: want a *gojson.UnmarshalTypeError, not an *encoding/json.UnmarshalTypeError", err)
	}
	_, err = outboxgojson.Codec[Event]{}.Decode([]byte(`{`))
	if errors.As(err, new(*json.SyntaxError)) || !errors.As(err, new(*gojson.SyntaxError)) {
		t.Errorf("go-json syntax error %#v: want a *gojson.SyntaxError, not an *encoding/json.SyntaxError", err)
	}
	_, err = outboxgojson.Codec[float64]{}.Encode(math.NaN())
	if errors.As(err, new(*json.UnsupportedValueError)) || !errors.As(err, new(*gojson.UnsupportedValueError)) {
		t.Errorf("go-json encoding error %#v: want a *gojson.UnsupportedValueError, not an *encoding/json.UnsupportedValueError", err)
	}
}

// TestDecodeCopies checks that a decoded value does not refer to the
// payload, which its caller may reuse.
func TestDecodeCopies(t *testing.T) {
	t.Parallel()
	payload := []byte(`{"id":"e1","tags":["t"],"blob":"aGVsbG8=","raw":{"a":"b"},"any":{"k":["v"]},"attrs":{"k":"v"}}`)
	want, err := outbox.JSONCodec[Event]{}.Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	got, err := outboxgojson.Codec[Event]{}.Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	for i := range payload {
		payload[i] = 'x'
	}
	if d := cmp.Diff(want, got, cmpOpts); d != "" {
		t.Errorf("decoded value after the payload changed (-encoding/json +go-json):\n%s", d)
	}
}

// TestConcurrent encodes and decodes from several goroutines at once,
// starting with a type the codec has not compiled yet.
func TestConcurrent(t *testing.T) {
	t.Parallel()
	type message struct {
		Event
		Orders []Order `json:"orders"`
	}
	want := &message{Orders: []Order{order, order}}
	want.ID, want.Tags, want.Level, want.Raw = "e1", []string{"a"}, 3, json.RawMessage(`{"a":1}`)
	c := outboxgojson.Codec[*message]{} // a pointer, so that Window is addressable and written as [0, 0]
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				b, err := c.Encode(want)
				if err != nil {
					t.Error(err)
					return
				}
				got, err := c.Decode(b)
				if err != nil {
					t.Error(err)
					return
				}
				if !decodeEqual(want, got) {
					t.Errorf("round trip of %s:\n%s", b, cmp.Diff(want, got, cmpOpts))
					return
				}
			}
		})
	}
	wg.Wait()
}

const fullEvent = `{
	"id": "evt_1", "Seq": 7, "by": "ops", "trace_id": "tr-9", "kind": "order.created",
	"total": {"amount": "129.50", "currency": "EUR"},
	"discount": {"amount": "5.00", "currency": "EUR"},
	"note": "leave at the door",
	"qty": "3", "price": "9.75", "paid": "true", "ref": "42", "label": "\"gift\"",
	"count": -12, "units": 65535, "big": 18446744073709551615, "delta": -9223372036854775808,
	"ratio": 0.1, "score": 6.02214076e23,
	"tags": ["a", "b"], "lines": [{"amount": "1", "currency": "EUR"}], "matrix": [[1, 2], [3, 4]],
	"blob": "aGVsbG8=", "digest": [1, 2, 3, 4],
	"attrs": {"k": "v"}, "by_id": {"-2": "b", "10": "a"}, "by_code": {"C-1": 1},
	"level": "L3", "code": "C-7", "code_ptr": "C-8", "window": [1, 2], "win_ptr": [3, 4],
	"raw": {"a": [1, 2.5e3, "x"]}, "any": {"n": 1, "l": [true, null, "s"]},
	"at": "2024-02-29T12:30:00.123456789+05:30", "at_ptr": "2024-01-01T00:00:00Z",
	"opt": "o", "opt_ints": [1], "opt_map": {"m": 1}, "opt_ptr": 5, "opt_struct": {"amount": "0"},
	"zero": "2001-01-01T00:00:00Z", "zero_span": {"A": 1, "B": 2}, "zero_money": {"amount": "1"},
	"zero_ints": [], "-": "dash", "Plain": "p", "größe": "g", "x<y>&z": "h"
}`

// decodeCase is an input to decode with both codecs into the type check
// decodes into. A case whose known is set has a known difference, which
// known tells from others: it must still differ, so that the
// documentation of Codec stays true.
type decodeCase struct {
	name  string
	in    string
	check func([]byte) string
	known func([]byte) bool
}

// decodeCases are the cases of TestDecodeMatchesEncodingJSON and the seeds
// of FuzzDecodeMatchesEncodingJSON.
func decodeCases() []decodeCase {
	deep := func(n int) string { return `{"any":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}` }
	return []decodeCase{
		{"full event", fullEvent, as[Event](), nil},
		{"full event into a pointer", fullEvent, as[*Event](), nil},
		{"empty object", `{}`, as[Event](), nil},
		{"top-level null", `null`, as[Event](), nil},
		{"top-level null into a pointer", `null`, as[*Event](), nil},
		{"top-level array into a struct", `[]`, as[Event](), nil},
		{"top-level string into a struct", `"x"`, as[Event](), nil},
		{"empty input", ``, as[Event](), nil},
		{"white space only", " \n\t", as[Event](), nil},
		{"trailing white space", "{} \n", as[Event](), nil},
		{"trailing value", `{} {}`, as[Event](), nil},
		{"trailing comma", `{"id":"a",}`, as[Event](), nil},
		{"single quotes", `{'id':'a'}`, as[Event](), nil},
		{"byte order mark", "\ufeff{}", as[Event](), nil},
		{"cut input", `{"id":"a"`, as[Event](), nil},

		{"nested struct", `{"total":{"amount":"1.00","currency":"EUR"}}`, as[Event](), nil},
		{"nested struct through a pointer", `{"discount":{"amount":"0.10"}}`, as[Event](), nil},
		{"nested struct of the wrong type", `{"total":"1.00"}`, as[Event](), nil},
		{"promoted fields", `{"id":"e1","Seq":7,"trace_id":"t"}`, as[Event](), nil},
		{"promoted field through a nil embedded pointer", `{"by":"ops"}`, as[Event](), nil},
		{"shadowed field", `{"kind":"outer"}`, as[Event](), nil},
		{"fields colliding at one depth are ignored", `{"version":3}`, as[Event](), nil},
		{"key of a shallower field differing in case", `{"aB":1}`, as[CaseOuter](), nil},
		{"key of a shallower field", `{"ab":1,"AB":2}`, as[CaseOuter](), nil},

		{"null into pointers", `{"discount":null,"note":null,"ref":null,"code_ptr":null,"win_ptr":null}`, as[Event](), nil},
		{"null into values", `{"total":null,"tags":null,"count":null,"score":null,"at":null,"blob":null}`, as[Event](), nil},
		{"null into an Unmarshaler value", `{"level":null,"window":null}`, as[Event](), nil},
		{"null into a TextUnmarshaler value", `{"code":null}`, as[Event](), nil},
		{"null into interface and raw", `{"any":null,"raw":null}`, as[Event](), nil},

		{"string option", `{"qty":"12","price":"9.5","paid":"true","ref":"42","label":"\"x\""}`, as[Event](), nil},
		{"string option unquoted", `{"qty":12}`, as[Event](), nil},
		{"string option quoted null", `{"qty":"null","ref":"null","label":"null"}`, as[Event](), nil},
		{"string option with space", `{"qty":" 12"}`, as[Event](), nil},
		{"string option of a string not quoted twice", `{"label":"x"}`, as[Event](), nil},
		{"string option of a bool", `{"paid":"1"}`, as[Event](), nil},
		{"string option escaped", `{"qty":"\u0031\u0032"}`, as[Event](), nil},
		{"string option with leading zeros", `{"qty":"007","ref":"-0"}`, as[Event](), nil},
		{"string option of negative infinity", `{"price":"-Inf"}`, as[Event](), nil},
		{"string option with a plus sign", `{"qty":"+1"}`, as[Event](), stringOptionExplained},
		{"string option with a leading dot", `{"price":".5"}`, as[Event](), stringOptionExplained},
		{"string option of NaN", `{"price":"NaN"}`, as[Event](), stringOptionExplained},
		{"string option of infinity", `{"price":"Infinity"}`, as[Event](), stringOptionExplained},
		{"string option of a plus sign before an unsigned integer", `{"units":1,"big":"+1"}`, as[struct {
			Big uint64 `json:"big,string"`
		}](), nil},

		{"case-insensitive keys", `{"ID":"e1","KIND":"k","Total":{"AMOUNT":"1"},"plain":"p"}`, as[Event](), nil},
		{"exact key then folded key", `{"Plain":"a","PLAIN":"b"}`, as[Event](), nil},
		{"kelvin sign folds to k", `{"\u212aind":"x"}`, as[Event](), nil},
		{"long s folds to s", `{"\u017feq":5}`, as[Event](), nil},
		{"unicode key", `{"größe":"a"}`, as[Event](), nil},
		{"unicode key folded", `{"GRÖßE":"a"}`, as[Event](), nil},
		{"escaped key", `{"\u0069\u0064":"x","x\u003cy\u003e\u0026z":"h"}`, as[Event](), nil},
		{"HTML key", `{"x<y>&z":"h"}`, as[Event](), nil},
		{"skipped field", `{"Skip":"x","skip":"y"}`, as[Event](), nil},
		{"field named dash", `{"-":"y"}`, as[Event](), nil},
		{"unexported field", `{"private":1,"trace":{"TraceID":"t"}}`, as[Event](), nil},
		{"duplicate keys: last wins", `{"id":"a","id":"b","qty":"1","qty":"2"}`, as[Event](), nil},
		{"duplicate keys merge structs", `{"total":{"amount":"1"},"total":{"currency":"EUR"}}`, as[Event](), nil},
		{"duplicate keys merge pointed-to structs", `{"discount":{"amount":"1"},"discount":{"currency":"EUR"}}`, as[Event](), nil},
		{"duplicate keys merge maps", `{"attrs":{"a":"1"},"attrs":{"b":"2"}}`, as[Event](), nil},
		{"duplicate keys replace slices", `{"tags":["a","b"],"tags":["c"]}`, as[Event](), nil},
		{"duplicate keys replace interfaces", `{"any":{"a":1},"any":{"b":2}}`, as[Event](), nil},
		{"duplicate map keys", `{"attrs":{"a":"1","a":"2"}}`, as[Event](), nil},

		{"unknown fields ignored", `{"nope":{"a":[1,{"b":null}],"c":"\u00e9"},"id":"x"}`, as[Event](), nil},
		{"unknown field with an invalid value", `{"nope":[1,],"id":"x"}`, as[Event](), nil},
		{"unknown field with a bad escape", `{"nope":"\q"}`, as[Event](), nil},

		{"invalid UTF-8 in a string", "{\"id\":\"a\xffb\",\"tags\":[\"\xc3\"]}", as[Event](), nil},
		{"invalid UTF-8 in a key", "{\"i\xffd\":\"a\"}", as[Event](), nil},
		{"invalid UTF-8 in a map key", "{\"attrs\":{\"\xff\":\"a\"}}", as[Event](), nil},
		{"UTF-8 of a surrogate", "{\"id\":\"\xed\xa0\x80\"}", as[Event](), nil},
		{"lone surrogate escape", `{"id":"\ud800","kind":"\udc00x"}`, as[Event](), nil},
		{"surrogate pair escape", `{"id":"\ud83d\ude00"}`, as[Event](), nil},
		{"escapes", `{"id":"\/\b\f\n\r\t\"\\\u0000\u001f"}`, as[Event](), nil},
		{"invalid escape", `{"id":"\x"}`, as[Event](), nil},
		{"short unicode escape", `{"id":"\u12"}`, as[Event](), nil},
		{"control character in a string", "{\"id\":\"a\x01\"}", as[Event](), nil},
		{"DEL in a string", "{\"id\":\"a\x7f\"}", as[Event](), nil},
		{"U+2028 in a string", "{\"id\":\"\u2028\"}", as[Event](), nil},

		{"integer limits", `{"count":-128,"units":65535,"big":18446744073709551615,"delta":-9223372036854775808}`, as[Event](), nil},
		{"int8 overflow", `{"count":128}`, as[Event](), nil},
		{"uint64 overflow", `{"big":18446744073709551616}`, as[Event](), nil},
		{"negative into unsigned", `{"units":-1}`, as[Event](), nil},
		{"negative zero into unsigned", `{"units":-0}`, as[Event](), nil},
		{"fraction into an integer", `{"count":1.5}`, as[Event](), nil},
		{"integral fraction into an integer", `{"count":1.0}`, as[Event](), nil},
		{"exponent into an integer", `{"count":1e2}`, as[Event](), nil},
		{"leading zero", `{"count":01}`, as[Event](), nil},
		{"plus sign", `{"count":+1}`, as[Event](), nil},
		{"bare minus", `{"count":-}`, as[Event](), nil},
		{"float64 overflow", `{"score":1e400}`, as[Event](), nil},
		{"float64 underflow", `{"score":1e-400}`, as[Event](), nil},
		{"largest float64", `{"score":1.7976931348623157e308}`, as[Event](), nil},
		{"smallest float64", `{"score":5e-324}`, as[Event](), nil},
		{"float64 rounding", `{"score":0.1000000000000000055511151231257827}`, as[Event](), nil},
		{"negative zero", `{"score":-0}`, as[Event](), nil},
		{"float32", `{"ratio":0.1}`, as[Event](), nil},
		{"float32 overflow", `{"ratio":3.5e38}`, as[Event](), nil},
		{"float32 rounded once", `{"ratio":1.0000000596046447753906250000000001}`, as[Event](), float32Explained},
		{"largest float32", `{"ratio":3.4028235e38}`, as[Event](), float32Explained},
		{"largest float32 as encoding/json writes it", `{"ratio":3.4028235e+38}`, as[Event](), float32Explained},
		{"largest float32 in full", `{"ratio":340282346638528859811704183484516925440}`, as[Event](), nil},
		{"string into a number", `{"count":"1"}`, as[Event](), nil},
		{"number into a string", `{"id":1}`, as[Event](), nil},
		{"bool into a number", `{"count":true}`, as[Event](), nil},
		{"error in one field, the others decoded", `{"count":"x","id":"a"}`, as[Event](), nil},

		{"slices and arrays", `{"tags":["a"],"lines":[{"amount":"1"}],"matrix":[[1],[2,3,4]],"digest":[9]}`, as[Event](), nil},
		{"array longer than its type", `[1,2,3]`, as[[2]int](), nil},
		{"array shorter than its type", `[1]`, as[[2]int](), nil},
		{"empty slice", `{"tags":[]}`, as[Event](), nil},
		{"bytes from base64", `{"blob":"aGVsbG8="}`, as[Event](), nil},
		{"bytes from unpadded base64", `{"blob":"aGVsbG8"}`, as[Event](), nil},
		{"bytes from URL base64", `{"blob":"-_8="}`, as[Event](), nil},
		{"bytes from base64 with a newline", `{"blob":"aGVs\nbG8="}`, as[Event](), nil},
		{"bytes from base64 with an escape", `{"blob":"aGVsbG8\u003d"}`, as[Event](), nil},
		{"bytes from an array", `{"blob":[1,2,255]}`, as[Event](), nil},
		{"bytes from an array out of range", `{"blob":[256]}`, as[Event](), nil},
		{"bytes from an empty string", `{"blob":""}`, as[Event](), nil},
		{"byte array from base64", `{"digest":"AQIDBA=="}`, as[Event](), nil},

		{"map with string keys", `{"attrs":{"b":"2","a":"1","":"0"}}`, as[Event](), nil},
		{"map with int keys", `{"by_id":{"1":"a","-2":"b"}}`, as[Event](), nil},
		{"map int key not a number", `{"by_id":{"x":"a"}}`, as[Event](), nil},
		{"map int key with a fraction", `{"by_id":{"1.0":"a"}}`, as[Event](), nil},
		{"map int key with a space", `{"by_id":{" 1":"a"}}`, as[Event](), nil},
		{"map int key with a plus sign", `{"by_id":{"+1":"a"}}`, as[Event](), nil},
		{"map int key overflow", `{"by_id":{"9223372036854775808":"a"}}`, as[Event](), nil},
		{"map with TextUnmarshaler keys", `{"by_code":{"C-1":1,"C-2":2}}`, as[Event](), nil},
		{"map TextUnmarshaler key refused", `{"by_code":{"1":1}}`, as[Event](), nil},
		{"map of the wrong type", `{"attrs":[]}`, as[Event](), nil},
		{"map value of the wrong type", `{"attrs":{"a":1}}`, as[Event](), nil},

		{"UnmarshalJSON", `{"level":"L3","window":[1,2],"win_ptr":[3,4]}`, as[Event](), nil},
		{"UnmarshalJSON error", `{"level":3}`, as[Event](), nil},
		{"UnmarshalJSON given its value verbatim", `{"level": "\u004c3" }`, as[Event](), nil},
		{"UnmarshalText", `{"code":"C-7","code_ptr":"C-8"}`, as[Event](), nil},
		{"UnmarshalText error", `{"code":"7"}`, as[Event](), nil},
		{"UnmarshalText given a number", `{"code":7}`, as[Event](), nil},
		{"UnmarshalText given an escaped string", `{"code":"C-\u0037"}`, as[Event](), nil},

		{"raw message verbatim", `{"raw": { "a" : [1, 2.50] , "b":"\u00e9" } }`, as[Event](), nil},
		{"raw message of a string", `{"raw":"x\ny"}`, as[Event](), nil},
		{"interface values", `{"any":{"a":[1,"x",true,false,null,{"b":2.5}],"c":{}}}`, as[Event](), nil},
		{"interface large integer", `{"any":12345678901234567890}`, as[Event](), nil},
		{"interface float overflow", `{"any":1e400}`, as[Event](), nil},
		{"interface at the top level", `[{"a":1},"b",2,null]`, as[any](), nil},
		{"map of interfaces", `{"a":{"b":[1]}}`, as[map[string]any](), nil},
		{"json.Number", `{"N":5}`, as[struct{ N json.Number }](), nil},
		{"json.Number from a string", `{"N":"5"}`, as[struct{ N json.Number }](), nil},
		{"json.Number from a string that is not a number", `{"N":"x"}`, as[struct{ N json.Number }](), nil},

		{"time", `{"at":"2024-02-29T12:30:00.123456789+05:30","at_ptr":"2024-01-01T00:00:00Z"}`, as[Event](), nil},
		{"time invalid", `{"at":"2024-13-01T00:00:00Z"}`, as[Event](), nil},
		{"time lower-case z", `{"at":"2024-01-01t00:00:00z"}`, as[Event](), nil},
		{"time without a zone", `{"at":"2024-01-01T00:00:00"}`, as[Event](), nil},
		{"time as a number", `{"at":0}`, as[Event](), nil},

		{"nesting within the limit", deep(9990), as[Event](), nil},
		{"nesting beyond the limit", deep(10001), as[Event](), nil},
	}
}

func TestDecodeMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, c := range decodeCases() {
		t.Run(c.name, func(t *testing.T) {
			d := c.check([]byte(c.in))
			switch {
			case c.known == nil && d != "":
				t.Errorf("input %q:\n%s", c.in, d)
			case c.known != nil && d == "":
				t.Errorf("input %q: the known difference is gone: update Codec's documentation", c.in)
			case c.known != nil && !c.known([]byte(c.in)):
				t.Errorf("input %q: not the known difference:\n%s", c.in, d)
			}
		})
	}
}

func TestEncodeMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	ref := int64(42)
	code := Code(8)
	at := time.Date(2024, 2, 29, 12, 30, 0, 123456789, time.FixedZone("IST", 5*3600+1800))
	note := "leave at the door"
	full := Event{
		Header: Header{ID: "evt_1", Kind: "shadowed", Version: 2, Seq: 7},
		Audit:  &Audit{Version: 3, By: "ops"},
		trace:  trace{TraceID: "tr-9"},
		Kind:   "order.created",
		Total:  Money{Amount: "129.50", Currency: "EUR"}, Discount: &Money{Amount: "5"}, Note: &note,
		Qty: 3, Price: 9.75, Paid: true, Ref: &ref, Label: "gift",
		Count: -12, Units: 65535, Big: math.MaxUint64, Delta: math.MinInt64, Ratio: 0.1, Score: 6.02214076e23,
		Tags: []string{"a", "b"}, Lines: []Money{{Amount: "1"}}, Matrix: [2][2]int{{1, 2}, {3, 4}},
		Blob: []byte("hello"), Digest: [4]byte{1, 2, 3, 4},
		Attrs: map[string]string{"k": "v", "a": "b"}, ByID: map[int]string{10: "a", 2: "b", -1: "c"},
		ByCode: map[Code]int{10: 1, 2: 2},
		Level:  3, Code: 7, CodePtr: &code, Window: Window{1, 2}, WinPtr: &Window{3, 4},
		Raw: json.RawMessage(`{ "a" : [1, 2.50] }`), Any: map[string]any{"n": 1, "l": []any{true, nil, "s"}},
		At: at, AtPtr: &at,
		Opt: "o", OptInts: []int{1}, OptMap: map[string]int{"m": 1}, OptPtr: new(int), OptStruct: Money{Amount: "0"},
		OptTime: at, Zero: at, ZeroSpan: Span{1, 2}, ZeroMoney: Money{Amount: "1"}, ZeroInts: []int{},
		Skip: "skip", Dash: "dash", Plain: "p", Größe: "g", HTMLKey: "h", private: 1,
	}
	cycle := &Node{Name: "a"}
	cycle.Next = cycle
	var nilWindow *Window
	for _, c := range []struct {
		name  string
		check func() string
		known string // a known difference, which must still differ
	}{
		{"full event", func() string { return encodeBoth(full) }, ""},
		{"full event through a pointer", func() string { return encodeBoth(&full) }, ""},
		{"zero event", func() string { return encodeBoth(Event{}) }, ""},
		{"nil event pointer", func() string { return encodeBoth[*Event](nil) }, ""},
		{"empty but not nil", func() string {
			return encodeBoth(Event{Tags: []string{}, Attrs: map[string]string{}, Blob: []byte{}, OptInts: []int{}, OptMap: map[string]int{},
				Raw: json.RawMessage{}, Any: []any{}, ZeroInts: []int{}})
		}, ""},
		{"omitzero uses IsZero", func() string { return encodeBoth(Event{ZeroSpan: Span{3, 3}}) }, ""},
		{"omitempty keeps zero structs and times", func() string { return encodeBoth(Event{OptStruct: Money{}, OptTime: time.Time{}}) }, ""},
		{"omitempty drops a nil pointer, keeps a pointer to zero", func() string { return encodeBoth(Event{OptPtr: new(int)}) }, ""},

		{"HTML characters", func() string { return encodeBoth(Event{Header: Header{ID: `<a href="x">&amp;</a>`}}) }, ""},
		{"line and paragraph separators", func() string { return encodeBoth("\u2028\u2029") }, ""},
		{"invalid UTF-8", func() string { return encodeBoth("a\xffb\xc3") }, ""},
		{"UTF-8 of a surrogate", func() string { return encodeBoth("\xed\xa0\x80") }, ""},
		{"control characters", func() string { return encodeBoth("\x00\x01\b\f\n\r\t\x1f\x7f\"\\/") }, ""},
		{"unicode", func() string { return encodeBoth("größe 😀 \ufeff \ufffd") }, ""},
		{"invalid UTF-8 in a map key", func() string { return encodeBoth(map[string]int{"\xff": 1, "<": 2}) }, ""},

		{"float64 formats", func() string {
			return encodeBoth([]float64{0, 1, -1, 0.1, 1e20, 1e21, 123456789e13, 1e-6, 1e-7, 0.000001234, math.MaxFloat64, math.SmallestNonzeroFloat64,
				math.Copysign(0, -1), 1.0 / 3, 100, 1e100, 12345678.9})
		}, ""},
		{"float32 formats", func() string {
			return encodeBoth([]float32{0, 0.1, 1.0 / 3, 1e20, 1e21, 1e-6, 1e-7, math.MaxFloat32, math.SmallestNonzeroFloat32, 16777217})
		}, ""},
		{"NaN", func() string { return encodeBoth(math.NaN()) }, ""},
		{"infinity", func() string { return encodeBoth(Event{Score: math.Inf(-1)}) }, ""},
		{"float32 infinity", func() string { return encodeBoth(float32(math.Inf(1))) }, ""},
		{"integer limits", func() string {
			return encodeBoth([]any{int64(math.MinInt64), int64(math.MaxInt64), uint64(math.MaxUint64), int8(-128), uint8(255)})
		}, ""},
		{"string option", func() string { return encodeBoth(Event{Qty: -3, Price: 1e21, Paid: false, Ref: &ref, Label: `a"<b>`}) }, ""},
		{"string option of a float NaN", func() string { return encodeBoth(Event{Price: math.NaN()}) }, ""},

		{"map keys sorted", func() string { return encodeBoth(map[string]int{"b": 1, "a": 2, "B": 3, "": 4, "é": 5, "aa": 6}) }, ""},
		{"map int keys sorted as strings", func() string { return encodeBoth(map[int]string{10: "a", 2: "b", -1: "c", 0: "d"}) }, ""},
		{"map uint keys", func() string { return encodeBoth(map[uint8]bool{255: true, 1: false}) }, ""},
		{"map TextMarshaler keys", func() string { return encodeBoth(map[Code]int{10: 1, 2: 2, -3: 3}) }, ""},
		{"map float keys refused", func() string { return encodeBoth(map[float64]int{1: 1}) }, ""},
		{"map of maps", func() string { return encodeBoth(map[string]map[string]int{"z": {"b": 1, "a": 2}, "a": nil}) }, ""},

		{"MarshalJSON", func() string { return encodeBoth(Event{Level: 5}) }, ""},
		{"MarshalJSON on a pointer, value not addressable", func() string { return encodeBoth(Window{1, 2}) }, ""},
		{"MarshalJSON on a pointer, through a pointer", func() string { return encodeBoth(&Window{1, 2}) }, ""},
		{"MarshalJSON on a pointer, in a slice", func() string { return encodeBoth([]Window{{1, 2}}) }, ""},
		{"MarshalJSON on a pointer, in an array", func() string { return encodeBoth([1]Window{{1, 2}}) }, "array elements addressable"},
		{"MarshalJSON on a pointer, in an array field", func() string { return encodeBoth(struct{ A [1]Window }{}) }, "array elements addressable"},
		{"MarshalJSON on a pointer, in an array field through a pointer", func() string { return encodeBoth(&struct{ A [1]Window }{}) }, ""},
		{"MarshalJSON on a pointer, in an array in a slice", func() string { return encodeBoth([][1]Window{{}}) }, ""},
		{"MarshalJSON on a pointer, in an array in an interface", func() string { return encodeBoth[any](&[1]Window{}) }, ""},
		{"MarshalJSON on a pointer, in an array in a map", func() string { return encodeBoth(map[string][1]Window{"k": {}}) }, "array elements addressable"},
		{"MarshalText on a pointer, in an array", func() string { return encodeBoth([2]textPtr{{1}, {2}}) }, "array elements addressable"},
		{"MarshalJSON on a pointer, in a map", func() string { return encodeBoth(map[string]Window{"w": {1, 2}}) }, ""},
		{"MarshalJSON of a nil pointer", func() string { return encodeBoth(nilWindow) }, ""},
		{"MarshalJSON of a nil pointer in an interface", func() string { return encodeBoth[any](nilWindow) }, ""},
		{"MarshalJSON promoted from an embedded field", func() string { return encodeBoth(Stamped{Level: 4, Note: "n"}) }, ""},
		{"MarshalJSON error", func() string { return encodeBoth([]any{failingMarshaler{}}) }, ""},
		{"MarshalJSON output compacted", func() string { return encodeBoth(rawJSON(" { \"a\" :\n[ 1 , 2 ] } ")) }, ""},
		{"MarshalJSON output HTML-escaped", func() string { return encodeBoth(rawJSON(`"<&>\u2028"`)) }, ""},
		{"MarshalJSON output invalid", func() string { return encodeBoth(rawJSON(`{"a":}`)) }, ""},
		{"MarshalJSON output empty", func() string { return encodeBoth(rawJSON(``)) }, ""},
		{"MarshalJSON output two values", func() string { return encodeBoth(rawJSON(`1 2`)) }, ""},
		{"MarshalJSON output invalid UTF-8", func() string { return encodeBoth(rawJSON("\"\xff\"")) }, ""},
		{"MarshalText", func() string { return encodeBoth(Event{Code: -4, CodePtr: &code}) }, ""},
		{"raw message compacted", func() string { return encodeBoth(json.RawMessage(" [ 1 ,\t\"<x>\" ] ")) }, ""},
		{"nil raw message", func() string { return encodeBoth(json.RawMessage(nil)) }, ""},

		{"interface values", func() string {
			return encodeBoth([]any{nil, 1, "s", true, 1.5, []byte("b"), map[string]any{"z": 1, "a": nil}, &Window{5, 6}, Window{7, 8}, Code(1)})
		}, ""},
		{"bytes", func() string { return encodeBoth([][]byte{nil, {}, {0}, {0xff, 0xfe}, []byte("hello world")}) }, ""},
		{"named byte slices", func() string { return encodeBoth(struct{ B json.RawMessage }{B: json.RawMessage(`"x"`)}) }, ""},
		{"byte array", func() string { return encodeBoth([3]byte{1, 2, 3}) }, ""},

		{"time", func() string {
			return encodeBoth([]time.Time{at, {}, time.Unix(0, 1).UTC(), at.In(time.FixedZone("", -3600))})
		}, ""},
		{"time with a year beyond 9999", func() string { return encodeBoth(time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)) }, ""},
		{"time with a negative year", func() string { return encodeBoth(time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)) }, ""},
		{"time with a zone offset in seconds", func() string { return encodeBoth(at.In(time.FixedZone("", 3601))) }, ""},
		{"time with a zone offset beyond 24 hours", func() string { return encodeBoth(at.In(time.FixedZone("", 25*3600))) }, ""},

		{"pointer cycle", func() string { return encodeBoth(cycle) }, ""},
		{"channel", func() string { return encodeBoth(struct{ C chan int }{C: make(chan int)}) }, ""},
		{"function", func() string { return encodeBoth(struct{ F func() }{F: func() {}}) }, ""},
		{"complex number", func() string { return encodeBoth(complex(1, 2)) }, ""},
		{"nil function", func() string { return encodeBoth(struct{ F func() }{}) }, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := c.check()
			switch {
			case c.known == "" && d != "":
				t.Error(d)
			case c.known != "" && d == "":
				t.Errorf("the known difference (%s) is gone: update Codec's documentation", c.known)
			}
		})
	}
}
