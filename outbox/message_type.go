package outbox

import (
	"reflect"

	"github.com/outboxgen/outboxgen/internal/msgtype"
)

// MessageTyper is implemented by message types that choose the name
// recorded in the message-type header ([HeaderMessageType]) instead of the
// default.
//
// The default name is the Go type's name without its package path:
// "OrderPlaced" for github.com/acme/shop.OrderPlaced. It survives moving
// the type to another package, and a consumer in another service that
// decodes the message into a copy of the type with the same name reads
// the rows. Pointers are spelled as what they point to, as JSON encodes
// *T as T, and so are the type arguments of a generic type and the
// elements of slices, arrays and maps, all without package paths:
// "Envelope[OrderPlaced]", "[]OrderPlaced", "map[string]OrderPlaced",
// "string". Interfaces and byte slices ([]byte, json.RawMessage) record
// no type and read every row, and so do anonymous structs, functions,
// channels and composites of them, which have no name to record.
//
// The default makes every type of one name one contract: a shop's Order
// and a billing service's Order, published to one queue, decode each
// other's rows. Choose a name for one of them to keep them apart.
//
// A subscriber reads a row when the row has no message-type header, when
// its type records none, or when the header is its name. A default name
// also reads its package-qualified spelling, as publishers of earlier
// releases wrote it ("github.com/acme/shop.OrderPlaced" for
// "OrderPlaced"), so rows written by them still decode; such a header
// names the package of each type in it, and a namesake in another package
// ("github.com/acme/billing.OrderPlaced") does not read it. A name chosen
// by OutboxMessageType reads only itself. Any other row ends with reason
// decode_error.
//
// Choose a name when publisher and consumer name their Go types
// differently, to rename a type while rows are in flight (return the old
// name), to move a type while rows of earlier releases are in flight
// (return their package-qualified spelling), to tell apart two messages
// whose Go types share a name, or to version a contract
// ("shop.order_placed.v1").
//
// OutboxMessageType is called once per publisher or worker, on the zero
// value (through a pointer to it for a pointer receiver), so it must
// return a constant. The name must be printable UTF-8 of at most 1024
// bytes; "" records no type, as for []byte.
type MessageTyper interface {
	OutboxMessageType() string
}

// messageTypeMaxBytes caps a message type name; it also counts toward
// HeadersMaxBytes.
const messageTypeMaxBytes = msgtype.MaxBytes

// CodecMessageTyper is implemented by codecs whose format names its
// messages itself, as Protocol Buffers do with a message's full name
// ("shop.v1.OrderPlaced"): the name MessageType returns is the message
// type a publisher with the codec records in the message-type header, and
// the only one a subscriber with it reads, in place of T's name
// ([MessageTyper]). It is called once per publisher or worker and must
// return a constant: printable UTF-8 of at most 1024 bytes, or "" to
// record no type and read every row.
type CodecMessageTyper interface {
	MessageType() string
}

// messageTypeOf returns the message type a Publisher[T] with codec
// records in the message-type header and a Subscriber[T] with it checks
// (see [MessageTyper] and [CodecMessageTyper]). It uses reflection: call
// it once per publisher or worker, never per message.
func messageTypeOf[T any](codec Codec[T]) (msgtype.Type, error) {
	return msgtype.OfCodec(reflect.TypeFor[T](), codec)
}
