package outbox

import (
	"encoding/json"
	"fmt"
)

// Codec turns a message of type T into an outbox payload and back.
//
// The publisher stores ContentType in the message's content-type header, so
// a subscriber can refuse a payload written by a codec it cannot read.
// Implementations must be safe for concurrent use.
//
// A codec for protocol buffers needs no support from this package:
//
//	type ProtoCodec[T proto.Message] struct{ New func() T }
//
//	func (ProtoCodec[T]) ContentType() string           { return "application/x-protobuf" }
//	func (ProtoCodec[T]) Encode(m T) ([]byte, error)    { return proto.Marshal(m) }
//	func (c ProtoCodec[T]) Decode(b []byte) (T, error) {
//		m := c.New()
//		return m, proto.Unmarshal(b, m)
//	}
type Codec[T any] interface {
	// Encode returns the payload for v.
	Encode(v T) ([]byte, error)
	// Decode returns the message a payload holds. An error makes the
	// delivery terminal with reason decode_error: retrying cannot help.
	Decode(payload []byte) (T, error)
	// ContentType names the payload format, e.g. "application/json".
	ContentType() string
}

// Content types of the built-in codecs.
const (
	ContentTypeJSON  = "application/json"
	ContentTypeBytes = "application/octet-stream"
	ContentTypeText  = "text/plain; charset=utf-8"
)

// JSONCodec encodes messages with encoding/json. It is the default codec
// for every type but []byte and string.
type JSONCodec[T any] struct{}

// Encode implements [Codec].
func (JSONCodec[T]) Encode(v T) ([]byte, error) { return json.Marshal(v) }

// Decode implements [Codec].
func (JSONCodec[T]) Decode(payload []byte) (T, error) {
	var v T
	err := json.Unmarshal(payload, &v)
	return v, err
}

// ContentType implements [Codec].
func (JSONCodec[T]) ContentType() string { return ContentTypeJSON }

// BytesCodec passes payloads through untouched: what is published is what is
// delivered, byte for byte, whatever codec wrote it. It is the default codec
// for []byte. A nil slice is published as an empty payload and delivered
// as an empty slice.
type BytesCodec struct{}

// Encode implements [Codec].
func (BytesCodec) Encode(v []byte) ([]byte, error) { return v, nil }

// Decode implements [Codec]. The returned slice is the payload itself.
func (BytesCodec) Decode(payload []byte) ([]byte, error) { return payload, nil }

// ContentType implements [Codec].
func (BytesCodec) ContentType() string { return ContentTypeBytes }

// StringCodec stores strings as their bytes. It is the default codec for
// string.
type StringCodec struct{}

// Encode implements [Codec].
func (StringCodec) Encode(v string) ([]byte, error) { return []byte(v), nil }

// Decode implements [Codec].
func (StringCodec) Decode(payload []byte) (string, error) { return string(payload), nil }

// ContentType implements [Codec].
func (StringCodec) ContentType() string { return ContentTypeText }

// DefaultCodec returns the codec used when none is configured: [BytesCodec]
// for []byte, [StringCodec] for string, and [JSONCodec] for anything else.
func DefaultCodec[T any]() Codec[T] {
	var zero T
	switch any(zero).(type) {
	case []byte:
		return any(BytesCodec{}).(Codec[T])
	case string:
		return any(StringCodec{}).(Codec[T])
	default:
		return JSONCodec[T]{}
	}
}

// encode runs the codec and turns its failure or panic into an
// *InputError whose Field the caller fills in: a codec is user code, and a
// panic must not unwind through the caller's transaction.
func encode[T any](c Codec[T], v T) (b []byte, err *InputError) {
	defer func() {
		if r := recover(); r != nil {
			b, err = nil, &InputError{Rule: fmt.Sprintf("codec %T panicked", c), Err: fmt.Errorf("%v", r)}
		}
	}()
	b, cerr := c.Encode(v)
	if cerr != nil {
		return nil, &InputError{Rule: fmt.Sprintf("codec %T cannot encode it", c), Err: cerr}
	}
	return b, nil
}
