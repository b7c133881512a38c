package main

import (
	"errors"
	"fmt"
	"go/ast"
	"go/constant"
	"go/types"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/tools/go/packages"

	"github.com/outboxgen/outboxgen/outbox"
)

// bindCodec is a codec an annotation's codec= chooses for the bindings'
// publishers and subscribers.
type bindCodec struct {
	// name is codec='s value.
	name string
	// importPath and pkgName are the package of the codec; "" for the
	// outbox's default codec.
	importPath, pkgName string
	// expr is the codec's value for a message type param, e.g.
	// "outboxgojson.Codec[Order]{}".
	expr func(param string) string
	// proto says the message is a generated Protocol Buffers message:
	// bound as a pointer, named by its full name.
	proto bool
	// contentType is what its rows carry.
	contentType string
}

// bindCodecs are the codecs codec= names.
var bindCodecs = []bindCodec{
	{name: "json", contentType: outbox.ContentTypeJSON},
	{name: "gojson", importPath: "github.com/outboxgen/outboxgen/contrib/gojson", pkgName: "outboxgojson",
		expr: func(p string) string { return "outboxgojson.Codec[" + p + "]{}" }, contentType: outbox.ContentTypeJSON},
	{name: "proto", importPath: "github.com/outboxgen/outboxgen/contrib/protocodec", pkgName: "protocodec",
		expr: func(p string) string { return "protocodec.Codec[" + p + "]{}" }, proto: true, contentType: "application/x-protobuf"},
	{name: "protojson", importPath: "github.com/outboxgen/outboxgen/contrib/protocodec", pkgName: "protocodec",
		expr: func(p string) string { return "protocodec.Codec[" + p + "]{JSON: true}" }, proto: true, contentType: outbox.ContentTypeJSON},
}

// codecNamed returns the codec codec= names.
func codecNamed(name string) (bindCodec, error) {
	for _, c := range bindCodecs {
		if c.name == name {
			return c, nil
		}
	}
	var names []string
	for _, c := range bindCodecs {
		names = append(names, c.name)
	}
	return bindCodec{}, fmt.Errorf("codec=%s: want one of %s", name, strings.Join(names, ", "))
}

// isProtoMessage reports whether a pointer to t is a generated Protocol
// Buffers message: it has the ProtoReflect method generated code gives.
func isProtoMessage(t types.Type) bool {
	obj, _, _ := types.LookupFieldOrMethod(types.NewPointer(t), true, nil, "ProtoReflect")
	_, isFunc := obj.(*types.Func)
	return isFunc
}

// protoFullName is the full Protocol Buffers name of the generated
// message type name declares in file, and the name of its .proto file:
// read from the file's descriptor, the string constant file_…_rawDesc
// that protoc-gen-go writes beside the messages, whose file, package and
// message names it holds.
func protoFullName(pkg *packages.Package, file *ast.File, name string) (full, protoFile string, err error) {
	var raw string
	for _, decl := range file.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok {
			continue
		}
		for _, spec := range gd.Specs {
			vs, ok := spec.(*ast.ValueSpec)
			if !ok {
				continue
			}
			for _, id := range vs.Names {
				if !strings.HasSuffix(id.Name, "_rawDesc") {
					continue
				}
				if c, ok := pkg.TypesInfo.Defs[id].(*types.Const); ok && c.Val().Kind() == constant.String {
					raw = constant.StringVal(c.Val())
				}
			}
		}
	}
	if raw == "" {
		return "", "", errors.New("its file holds no file descriptor (a const named file_…_rawDesc, as protoc-gen-go v1.36 and later write it)")
	}
	protoFile, names, err := descriptorNames([]byte(raw))
	if err != nil {
		return "", "", fmt.Errorf("its file descriptor: %w", err)
	}
	full, ok := names[name]
	if !ok {
		return "", "", fmt.Errorf("its file descriptor has no message that protoc-gen-go names %s (it names %s)", name, strings.Join(slices.Sorted(maps.Keys(names)), ", "))
	}
	return full, protoFile, nil
}

// descriptorNames reads a serialized FileDescriptorProto and returns its
// file's name and, for each message it declares (nested ones too), the Go
// name protoc-gen-go gives it and its full name.
func descriptorNames(b []byte) (string, map[string]string, error) {
	var fileName, pkgName string
	var messages [][]byte
	err := fields(b, func(num int, v []byte) {
		switch num {
		case 1: // name
			fileName = string(v)
		case 2: // package
			pkgName = string(v)
		case 4: // message_type
			messages = append(messages, v)
		}
	})
	if err != nil {
		return "", nil, err
	}
	out := map[string]string{}
	var walk func(msg []byte, goPrefix, fullPrefix string) error
	walk = func(msg []byte, goPrefix, fullPrefix string) error {
		var name string
		var nested [][]byte
		if err := fields(msg, func(num int, v []byte) {
			switch num {
			case 1: // name
				name = string(v)
			case 3: // nested_type
				nested = append(nested, v)
			}
		}); err != nil {
			return err
		}
		goName, full := goPrefix+goCamelCase(name), fullPrefix+name
		out[goName] = full
		for _, n := range nested {
			if err := walk(n, goName+"_", full+"."); err != nil {
				return err
			}
		}
		return nil
	}
	prefix := ""
	if pkgName != "" {
		prefix = pkgName + "."
	}
	for _, m := range messages {
		if err := walk(m, "", prefix); err != nil {
			return "", nil, err
		}
	}
	return fileName, out, nil
}

// fields calls f with the number and bytes of each length-delimited
// field of the protobuf message b, skipping the others.
func fields(b []byte, f func(num int, v []byte)) error {
	for len(b) > 0 {
		key, n := uvarint(b)
		if n <= 0 {
			return errors.New("a malformed field key")
		}
		b = b[n:]
		num, wire := int(key>>3), key&7
		switch wire {
		case 0: // varint
			_, n := uvarint(b)
			if n <= 0 {
				return errors.New("a malformed varint")
			}
			b = b[n:]
		case 1: // 64-bit
			if len(b) < 8 {
				return errors.New("a truncated 64-bit field")
			}
			b = b[8:]
		case 2: // length-delimited
			l, n := uvarint(b)
			if n <= 0 || uint64(len(b)-n) < l {
				return errors.New("a truncated length-delimited field")
			}
			f(num, b[n:n+int(l)])
			b = b[n+int(l):]
		case 5: // 32-bit
			if len(b) < 4 {
				return errors.New("a truncated 32-bit field")
			}
			b = b[4:]
		default:
			return fmt.Errorf("wire type %d", wire)
		}
	}
	return nil
}

// uvarint decodes a varint, as encoding/binary's does.
func uvarint(b []byte) (uint64, int) {
	var x uint64
	for i, c := range b {
		if i == 10 {
			return 0, -1
		}
		x |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return x, i + 1
		}
	}
	return 0, 0
}

// goCamelCase is the Go name protoc-gen-go gives a message named s: the
// first letter and each letter after an underscore upper-cased, the
// underscores before a lower-case letter dropped, a dot written as an
// underscore (protogen.GoCamelCase).
func goCamelCase(s string) string {
	var b []byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '.' && i+1 < len(s) && isASCIILower(s[i+1]):
		case c == '.':
			b = append(b, '_')
		case c == '_' && (i == 0 || s[i-1] == '.'):
			b = append(b, 'X')
		case c == '_' && i+1 < len(s) && isASCIILower(s[i+1]):
		case isASCIIDigit(c):
			b = append(b, c)
		default:
			if isASCIILower(c) {
				c -= 'a' - 'A'
			}
			b = append(b, c)
			for ; i+1 < len(s) && isASCIILower(s[i+1]); i++ {
				b = append(b, s[i+1])
			}
		}
	}
	return string(b)
}

func isASCIILower(c byte) bool { return 'a' <= c && c <= 'z' }
func isASCIIDigit(c byte) bool { return '0' <= c && c <= '9' }

// protoPayload is the AsyncAPI payload of a Protocol Buffers message: the
// text of its .proto file (multi-format schema, protobuf 3) when bind
// finds the file beside the generated code, as protoc's
// paths=source_relative puts it; else a schema that names the message.
func protoPayload(b binding, dir string) *node {
	if b.protoFile != "" {
		if src, err := os.ReadFile(filepath.Join(dir, filepath.Base(b.protoFile))); err == nil {
			return obj().set("schemaFormat", "application/vnd.google.protobuf;version=3").set("schema", string(src))
		}
	}
	format := "the Protocol Buffers wire format"
	if b.codec.contentType == outbox.ContentTypeJSON {
		format = "protojson"
	}
	return obj().set("description", fmt.Sprintf("a %s message (%s), as its .proto file defines it", b.Recorded, format))
}
