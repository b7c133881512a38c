// Package outboxgojson encodes and decodes outbox messages with
// github.com/goccy/go-json, a faster implementation of encoding/json.
//
// [Codec] is a drop-in for [outbox.JSONCodec], the default codec of struct
// types: it writes the same bytes under the same content type,
// application/json, so rows stay readable by any JSON consumer, and the
// publishers and subscribers of a queue can switch to it, or back, one
// side at a time. Set it as the Codec of a publisher's or a subscriber's
// config:
//
//	pub, err := outbox.NewPublisher(ob, "orders", &outbox.PublisherConfig[Order]{Codec: outboxgojson.Codec[Order]{}})
//	sub, err := outbox.NewSubscriber(ob, queues, handle, &outbox.SubscriberConfig[Order]{Codec: outboxgojson.Codec[Order]{}})
//
// The documentation of [Codec] lists the few inputs on which it differs
// from encoding/json.
//
// It is a module of its own, so that the outbox package does not depend on
// go-json.
package outboxgojson

import (
	json "github.com/goccy/go-json"

	"github.com/outboxgen/outboxgen/outbox"
)

var _ outbox.Codec[struct{}] = Codec[struct{}]{}

// Codec is an [outbox.Codec] that encodes messages of type T with
// go-json's Marshal and decodes them with its Unmarshal. Its zero value is
// ready to use, and it is safe for concurrent use.
//
// It is a drop-in for [outbox.JSONCodec]: its content type is the same,
// and it writes the same bytes, decodes the same values and fails on the
// same inputs as encoding/json (compared: go-json v0.12.0 with
// encoding/json of Go 1.26), with these exceptions:
//
//   - A JSON number decoded into a float32 is rounded to a float64 and
//     then to a float32, where encoding/json rounds it once, so a number
//     just off the middle of two float32 values can get the farther one
//     (1.0000000596046447753906250000000001 gives 1, not 1.0000001). And
//     a number whose float64 exceeds math.MaxFloat32 fails, though it
//     rounds to math.MaxFloat32: 3.4028235e+38, which is how encoding/json
//     and this codec write math.MaxFloat32, does not decode into a
//     float32.
//   - A number of a field with the string option is read from its JSON
//     string by strconv, as by encoding/json, but encoding/json first
//     refuses a string that does not start with '-' or a digit. This codec
//     accepts a plus sign before a signed integer or a float ("+1"), and a
//     float that starts with a dot (".5") or is "Inf", "Infinity" or "NaN"
//     in any case.
//   - A MarshalJSON or MarshalText method with a pointer receiver is
//     called for the elements of an array that is not addressable (held in
//     T's value without a pointer or a slice on the way, or in a map value
//     or an interface value). encoding/json calls such a method only for
//     an addressable value, and writes the others by their fields.
//   - Error messages can differ, and the errors of the encoding and the
//     decoding themselves are go-json's types (*json.SyntaxError,
//     *json.UnmarshalTypeError, *json.UnsupportedValueError, ... of
//     github.com/goccy/go-json), which errors.As does not find as the
//     types of encoding/json. An error that a MarshalJSON, UnmarshalJSON,
//     MarshalText or UnmarshalText method returns is found by errors.Is
//     and errors.As as with encoding/json. The outbox ends every delivery
//     whose payload Decode refuses alike, with reason decode_error.
//   - The value Decode returns with an error can differ.
type Codec[T any] struct{}

// Encode implements [outbox.Codec]: it returns go-json's encoding of v.
func (Codec[T]) Encode(v T) ([]byte, error) { return json.Marshal(v) }

// Decode implements [outbox.Codec]: it decodes payload into a new T with
// go-json.
func (Codec[T]) Decode(payload []byte) (T, error) {
	var v T
	err := json.Unmarshal(payload, &v)
	return v, err
}

// ContentType implements [outbox.Codec]. It returns
// [outbox.ContentTypeJSON], "application/json", the content type of
// [outbox.JSONCodec], so that either codec reads the rows the other wrote.
func (Codec[T]) ContentType() string { return outbox.ContentTypeJSON }
