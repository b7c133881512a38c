// Package protocodec is an [outbox.Codec] for Protocol Buffers messages:
// the binary wire format by default, protojson as an option.
//
// Its messages are named by their full Protocol Buffers name
// ("shop.v1.OrderPlaced"), which it records in the message-type header
// ([outbox.CodecMessageTyper]) in place of the Go type's name. That name
// is the contract of the .proto file: a publisher and a subscriber in
// different services and modules, each with its own generated code under
// its own Go package path, agree on it, and a subscriber refuses (reason
// decode_error) a row of any other message.
//
// Choosing it is one line in each config:
//
//	pub, err := outbox.NewPublisher(ob, "orders", &outbox.PublisherConfig[*shopv1.OrderPlaced]{
//		Codec: protocodec.Codec[*shopv1.OrderPlaced]{},
//	})
//	sub, err := outbox.NewSubscriber(ob, []string{"orders"}, handle, &outbox.SubscriberConfig[*shopv1.OrderPlaced]{
//		Codec: protocodec.Codec[*shopv1.OrderPlaced]{},
//	})
package protocodec

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/outboxgen/outboxgen/outbox"
)

// Content types of the codec's two formats.
const (
	// ContentTypeProto is the binary wire format's.
	ContentTypeProto = "application/x-protobuf"
	// ContentTypeProtoIANA is the binary wire format's registered name,
	// which the codec reads too.
	ContentTypeProtoIANA = "application/protobuf"
)

// Codec encodes and decodes messages of the generated type T (a pointer,
// such as *shopv1.OrderPlaced; an interface such as proto.Message
// encodes but decodes nothing) with the Protocol Buffers wire format, or
// with protojson when JSON is set. The zero value is ready to use and
// safe for concurrent use.
//
// Encode refuses a nil message: proto would write it as an empty one, and
// an empty row is nearly always a mistake. Decode keeps fields it does
// not know in the binary format, as proto does, so a subscriber built
// against an older .proto reads the rows of a newer one; with JSON it
// ignores them, for the same reason.
type Codec[T proto.Message] struct {
	// JSON writes and reads protojson (content type application/json),
	// readable by people and by JSON consumers, at about twice the size
	// and several times the cost of the wire format.
	JSON bool
}

var (
	_ outbox.Codec[proto.Message]       = Codec[proto.Message]{}
	_ outbox.CodecMessageTyper          = Codec[proto.Message]{}
	_ interface{ Accepts(string) bool } = Codec[proto.Message]{}
)

// ContentType implements [outbox.Codec]: [ContentTypeProto], or
// application/json with JSON.
func (c Codec[T]) ContentType() string {
	if c.JSON {
		return outbox.ContentTypeJSON
	}
	return ContentTypeProto
}

// Accepts reports whether the codec reads rows of contentType: the binary
// format under either of its names, or JSON with JSON.
func (c Codec[T]) Accepts(contentType string) bool {
	if c.JSON {
		return contentType == outbox.ContentTypeJSON
	}
	return contentType == ContentTypeProto || contentType == ContentTypeProtoIANA
}

// MessageType implements [outbox.CodecMessageTyper]: T's full name, such
// as "shop.v1.OrderPlaced".
func (Codec[T]) MessageType() string {
	var zero T
	if any(zero) == nil { // an interface type: no one message
		return ""
	}
	return string(zero.ProtoReflect().Descriptor().FullName())
}

var (
	// errNil is Encode's error for a nil message.
	errNil = errors.New("protocodec: a nil message")
	// errInterface is Decode's error when T is an interface type.
	errInterface = errors.New("protocodec: Codec[T] decodes into a generated message type T, such as *shopv1.OrderPlaced; T is an interface")
)

// Encode implements [outbox.Codec].
func (c Codec[T]) Encode(m T) ([]byte, error) {
	if !m.ProtoReflect().IsValid() {
		return nil, fmt.Errorf("%w (%T)", errNil, m)
	}
	if c.JSON {
		return protojson.Marshal(m)
	}
	return proto.Marshal(m)
}

// unmarshalJSON ignores the fields a newer .proto added.
var unmarshalJSON = protojson.UnmarshalOptions{DiscardUnknown: true}

// Decode implements [outbox.Codec]: a new T holding the payload.
func (c Codec[T]) Decode(payload []byte) (T, error) {
	var zero T
	if any(zero) == nil {
		return zero, errInterface
	}
	m := zero.ProtoReflect().Type().New().Interface().(T)
	var err error
	if c.JSON {
		err = unmarshalJSON.Unmarshal(payload, m)
	} else {
		err = proto.Unmarshal(payload, m)
	}
	if err != nil {
		return zero, err
	}
	return m, nil
}
