package outbox

import (
	"fmt"
	"reflect"
	"strconv"
)

// MessageTyper is implemented by message types that choose the name
// recorded in the message-type header ([HeaderMessageType]) instead of the
// default, their Go package path and type name. Name a type when
// publishers and subscribers use different Go types for the same message
// (services that do not share a package), or to keep rows in flight
// readable across a rename or move of the type.
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
const messageTypeMaxBytes = 1024

// messageTypeOf returns the name a Publisher[T] records in the
// message-type header and a Subscriber[T] checks, or "" when T records
// none: interfaces (a value of any type fits) and byte slices (raw bytes
// are anything) accept every row, and anonymous structs, functions and
// channels have no stable name. It uses reflection: call it once per
// publisher or worker, never per message.
func messageTypeOf[T any]() (string, error) {
	t := reflect.TypeFor[T]()
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() == reflect.Interface {
		return "", nil
	}
	var typer reflect.Value
	switch typerType := reflect.TypeFor[MessageTyper](); {
	case t.Implements(typerType):
		typer = reflect.Zero(t)
	case reflect.PointerTo(t).Implements(typerType):
		typer = reflect.New(t)
	default:
		name, _ := typeName(t)
		if len(name) > messageTypeMaxBytes {
			return "", fmt.Errorf("the name of %v is %d bytes; at most %d: implement MessageTyper to choose a shorter one", t, len(name), messageTypeMaxBytes)
		}
		return name, nil
	}
	name, err := callTyper(typer.Interface().(MessageTyper))
	if err != nil {
		return "", fmt.Errorf("%v.OutboxMessageType: %w", t, err)
	}
	if len(name) > messageTypeMaxBytes || !printable(name, true) {
		return "", fmt.Errorf("%v.OutboxMessageType returned %q; want printable UTF-8 of at most %d bytes", t, name, messageTypeMaxBytes)
	}
	return name, nil
}

func callTyper(m MessageTyper) (name string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panicked: %v", r)
		}
	}()
	return m.OutboxMessageType(), nil
}

// typeName spells t with full package paths, e.g.
// "github.com/acme/shop.Order" or "[]github.com/acme/shop.Order";
// pointers are spelled as what they point to, as JSON encodes *T as T.
// ok is false when t, or a type it is made of, has no stable name or is
// raw bytes.
func typeName(t reflect.Type) (name string, ok bool) {
	switch {
	case t.Kind() == reflect.Interface,
		t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8:
		return "", false
	case t.Name() != "" && t.PkgPath() == "":
		return t.Name(), true // predeclared: string, int, ...
	case t.Name() != "":
		// Name spells the type arguments of a generic type with full
		// package paths too.
		return t.PkgPath() + "." + t.Name(), true
	}
	switch t.Kind() {
	case reflect.Pointer:
		return typeName(t.Elem())
	case reflect.Slice, reflect.Array:
		elem, ok := typeName(t.Elem())
		if !ok {
			return "", false
		}
		if t.Kind() == reflect.Array {
			return "[" + strconv.Itoa(t.Len()) + "]" + elem, true
		}
		return "[]" + elem, true
	case reflect.Map:
		key, ok := typeName(t.Key())
		elem, ok2 := typeName(t.Elem())
		if !ok || !ok2 {
			return "", false
		}
		return "map[" + key + "]" + elem, true
	default: // anonymous structs, functions, channels
		return "", false
	}
}
