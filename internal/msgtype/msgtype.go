// Package msgtype names the message types recorded in the message-type
// header and decides which recorded names a Go type reads. The outbox
// package (publishers and subscribers) and outboxtest share it, so the
// rule lives in one place; its public description is the doc of
// outbox.MessageTyper.
package msgtype

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxBytes caps a message type name.
const MaxBytes = 1024

// typer has the method set of outbox.MessageTyper.
type typer interface {
	OutboxMessageType() string
}

// Type is the message type of a Go type.
type Type struct {
	// Name is what a publisher records; "" records nothing, and reads
	// every row.
	Name string
	// Chosen says Name was returned by the type's OutboxMessageType
	// method: an explicit contract, matched exactly.
	Chosen bool
	// Qualified is how publishers before the bare names spelled a default
	// Name: with the package path of every named type in it
	// ("github.com/acme/shop.OrderPlaced"). It is "" for a chosen name.
	Qualified string
}

// Of returns the message type of t. A type that implements
// OutboxMessageType (through a pointer too) has the name it returns.
// Other types are named by their type name without package paths
// (Unqualified), pointers spelled as what they point to, since JSON
// encodes *T as T: "OrderPlaced", "[]OrderPlaced",
// "map[string]OrderPlaced", "Envelope[OrderPlaced]", "string". Interfaces
// (a value of any type fits) and byte slices (raw bytes are anything)
// have no name, nor have anonymous structs, functions and channels, or
// composites of them. Of uses reflection: call it once per publisher or
// worker, never per message.
func Of(t reflect.Type) (Type, error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() == reflect.Interface {
		return Type{}, nil
	}
	var v reflect.Value
	switch typerType := reflect.TypeFor[typer](); {
	case t.Implements(typerType):
		v = reflect.Zero(t)
	case reflect.PointerTo(t).Implements(typerType):
		v = reflect.New(t)
	default:
		name, _ := typeName(t, false)
		if len(name) > MaxBytes {
			return Type{}, fmt.Errorf("the name of %v is %d bytes; at most %d: implement MessageTyper to choose a shorter one", t, len(name), MaxBytes)
		}
		qualified, _ := typeName(t, true)
		return Type{Name: name, Qualified: qualified}, nil
	}
	return chosen(fmt.Sprintf("%v.OutboxMessageType", t), v.Interface().(typer).OutboxMessageType)
}

// namer has the method set of outbox.CodecMessageTyper.
type namer interface {
	MessageType() string
}

// OfCodec returns the message type of t as codec writes and reads it: the
// name codec's MessageType method returns, when it has one (a format
// that names its messages itself, as Protocol Buffers do), else Of(t).
func OfCodec(t reflect.Type, codec any) (Type, error) {
	n, ok := codec.(namer)
	if !ok {
		return Of(t)
	}
	return chosen(fmt.Sprintf("%T.MessageType", codec), n.MessageType)
}

// chosen is the message type a method (what names it) returns: a name
// chosen for the type, matched exactly, or none.
func chosen(what string, method func() string) (Type, error) {
	name, err := call(method)
	if err != nil {
		return Type{}, fmt.Errorf("%s: %w", what, err)
	}
	if len(name) > MaxBytes || !Printable(name, true) {
		return Type{}, fmt.Errorf("%s returned %q; want printable UTF-8 of at most %d bytes", what, name, MaxBytes)
	}
	return Type{Name: name, Chosen: name != ""}, nil
}

// Reads reports whether a row whose message-type header is header may be
// decoded as t. Rows without the header, and types without a name, match
// anything; a chosen name matches only itself; a default name also
// matches its package-qualified spelling, as publishers before the bare
// names wrote it ("github.com/acme/shop.OrderPlaced" for "OrderPlaced"),
// and only that: a qualified header names the package of each type in
// it, so it is read only by the types of those packages, never by a
// namesake elsewhere ("github.com/acme/billing.OrderPlaced"). Pointer
// stars are ignored in either spelling, as JSON encodes *T as T.
func (t Type) Reads(header string) bool {
	switch {
	case header == "" || t.Name == "" || header == t.Name:
		return true
	case t.Chosen || t.Qualified == "":
		return false
	}
	return Unstarred(header) == Unstarred(t.Qualified)
}

// IsQualified reports whether name spells a package path, as the default
// names of publishers before the bare names did.
func IsQualified(name string) bool { return Unqualified(name) != Unstarred(name) }

// Unqualified removes the package paths from a Go type's spelling, and
// its pointer stars: "github.com/acme/shop.Envelope[*github.com/acme/shop.Order]"
// becomes "Envelope[Order]". In every run of characters an import path or
// identifier can hold, only what follows the last dot is kept; quoted
// struct tags of anonymous struct type arguments are copied as they are.
func Unqualified(name string) string {
	if !strings.ContainsAny(name, "./*") {
		return name
	}
	return strip(name, true)
}

// Unstarred removes the pointer stars from a Go type's spelling and keeps
// its package paths: "github.com/acme/shop.Envelope[*github.com/acme/shop.Order]"
// becomes "github.com/acme/shop.Envelope[github.com/acme/shop.Order]".
// Quoted struct tags are copied as they are.
func Unstarred(name string) string {
	if !strings.Contains(name, "*") {
		return name
	}
	return strip(name, false)
}

// strip removes the pointer stars from name outside quoted struct tags,
// and with paths also the package paths.
func strip(name string, paths bool) string {
	var b strings.Builder
	b.Grow(len(name))
	for i := 0; i < len(name); {
		switch c := name[i]; {
		case c == '"':
			j := i + 1
			for j < len(name) && name[j] != '"' {
				if name[j] == '\\' {
					j++
				}
				j++
			}
			j = min(j+1, len(name))
			b.WriteString(name[i:j])
			i = j
		case c == '*':
			i++
		case paths && pathByte(c):
			j := i + 1
			for j < len(name) && pathByte(name[j]) {
				j++
			}
			run := name[i:j]
			b.WriteString(run[strings.LastIndexByte(run, '.')+1:])
			i = j
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String()
}

// pathByte reports whether c can be part of an import path or an
// identifier: ASCII letters and digits, "_./-~+", and the bytes of
// non-ASCII letters (and of the middle dot the compiler gives local types).
func pathByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		strings.IndexByte("_./-~+", c) >= 0 || c >= utf8.RuneSelf
}

// typeName spells t as Of describes, or with qualified as publishers
// before the bare names did: each named type with its package path, the
// type arguments of a generic type as reflect spells them; ok is false
// when t, or a type it is made of, has no stable name or is raw bytes.
func typeName(t reflect.Type, qualified bool) (name string, ok bool) {
	switch {
	case t.Kind() == reflect.Interface,
		t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8:
		return "", false
	case t.Name() != "" && qualified && t.PkgPath() != "":
		return t.PkgPath() + "." + t.Name(), true
	case t.Name() != "":
		// Name spells the type arguments of a generic type with their
		// package paths.
		return Unqualified(t.Name()), true
	}
	switch t.Kind() {
	case reflect.Pointer:
		return typeName(t.Elem(), qualified)
	case reflect.Slice, reflect.Array:
		elem, ok := typeName(t.Elem(), qualified)
		if !ok {
			return "", false
		}
		if t.Kind() == reflect.Array {
			return "[" + strconv.Itoa(t.Len()) + "]" + elem, true
		}
		return "[]" + elem, true
	case reflect.Map:
		key, ok := typeName(t.Key(), qualified)
		elem, ok2 := typeName(t.Elem(), qualified)
		if !ok || !ok2 {
			return "", false
		}
		return "map[" + key + "]" + elem, true
	default: // anonymous structs, functions, channels
		return "", false
	}
}

func call(method func() string) (name string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panicked: %v", r)
		}
	}()
	return method(), nil
}

// Printable reports whether s is valid UTF-8 of printable characters;
// spaces (U+0020 only) are allowed when spaces is true. It is the rule of
// every header the outbox writes (names without spaces, values with), a
// message type name included.
func Printable(s string, spaces bool) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || (r == ' ' && !spaces) {
			return false
		}
	}
	return true
}
