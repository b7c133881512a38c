package main

import (
	"encoding/json"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// otherSrc is package example.com/other, which the sources of
// TestSchemaOfOddTypes may import.
const otherSrc = `package other

type Order struct{ Total int ` + "`json:\"total\"`" + ` }

type Pair[T any] struct{ V T }
`

// sourceImporter imports the standard library from the compiler's export
// data (the go command builds it, or finds it in its cache: type-checking
// the packages the sources import from their source took seconds under
// -race) and example.com/other from otherSrc.
type sourceImporter struct {
	std   types.ImporterFrom
	other *types.Package
}

func (i *sourceImporter) Import(path string) (*types.Package, error) {
	return i.ImportFrom(path, "", 0)
}

func (i *sourceImporter) ImportFrom(path, dir string, mode types.ImportMode) (*types.Package, error) {
	if path == "example.com/other" {
		return i.other, nil
	}
	return i.std.ImportFrom(path, dir, mode)
}

func newSourceImporter(t *testing.T, fset *token.FileSet) *sourceImporter {
	t.Helper()
	imp := &sourceImporter{std: importer.ForCompiler(fset, "gc", nil).(types.ImporterFrom)}
	imp.other = checkSource(t, fset, imp, "example.com/other", otherSrc)
	return imp
}

func checkSource(t *testing.T, fset *token.FileSet, imp types.Importer, path, src string) *types.Package {
	t.Helper()
	file, err := parser.ParseFile(fset, path+".go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	pkg, err := (&types.Config{Importer: imp}).Check(path, fset, []*ast.File{file}, nil)
	if err != nil {
		t.Fatalf("type-check %s: %v", path, err)
	}
	return pkg
}

// TestSchemaOfOddTypes gives the JSON Schema bind writes for types that
// stretch encoding/json's rules: each is what encoding/json writes, or a
// clear error naming the field.
func TestSchemaOfOddTypes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, src string
		// want is the message's schema and the definitions, or the
		// error.
		want, err string
	}{
		{name: "recursive through a pointer", src: `type M struct {
			Val  int ` + "`json:\"val\"`" + `
			Next *M  ` + "`json:\"next,omitempty\"`" + `
		}`, want: `{"schema": {"$ref": "#/components/schemas/M"}, "defs": {"M": {"type": "object", "properties": {
			"val": {"type": "integer"}, "next": {"oneOf": [{"$ref": "#/components/schemas/M"}, {"type": "null"}]}},
			"required": ["val"], "additionalProperties": false}}}`},
		{name: "recursive through embedding", src: `type M struct { *M; X int }`,
			want: `{"schema": {"$ref": "#/components/schemas/M"}, "defs": {"M": {"type": "object", "properties": {
				"X": {"type": "integer"}}, "required": ["X"], "additionalProperties": false}}}`},
		{name: "mutually embedded", src: `type M struct { *B; X int }
			type B struct { *M; Y int }`,
			want: `{"schema": {"$ref": "#/components/schemas/M"}, "defs": {"M": {"type": "object", "properties": {
				"Y": {"type": "integer"}, "X": {"type": "integer"}}, "required": ["X"], "additionalProperties": false}}}`},
		{name: "recursive through an alias", src: `type NA = M
			type M struct { Next *NA }`,
			want: `{"schema": {"$ref": "#/components/schemas/M"}, "defs": {"M": {"type": "object", "properties": {
				"Next": {"oneOf": [{"$ref": "#/components/schemas/M"}, {"type": "null"}]}}, "required": ["Next"], "additionalProperties": false}}}`},
		{name: "fields of an embedded pointer may be absent", src: `type Audit struct { By string ` + "`json:\"by\"`" + ` }
			type M struct { *Audit; ID int }`,
			want: `{"schema": {"$ref": "#/components/schemas/M"}, "defs": {"M": {"type": "object", "properties": {
				"by": {"type": "string"}, "ID": {"type": "integer"}}, "required": ["ID"], "additionalProperties": false}}}`},
		{name: "embedded fields of one name cancel out, a tagged or shallower one wins", src: `type E1 struct { Name, Both string; Deep int }
			type E2 struct { Name string ` + "`json:\"Name\"`" + `; Both string }
			type M struct { E1; E2; Deep string }`,
			want: `{"schema": {"$ref": "#/components/schemas/M"}, "defs": {"M": {"type": "object", "properties": {
				"Name": {"type": "string"}, "Deep": {"type": "string"}}, "required": ["Name", "Deep"], "additionalProperties": false}}}`},
		{name: "invalid tag names keep the Go name; -, names a field -", src: `type M struct {
			A int ` + "`json:\"a'b\"`" + `
			B int ` + "`json:\"-,\"`" + `
			C int ` + "`json:\"-\"`" + `
			D int ` + "`json:\",omitempty\"`" + `
		}`, want: `{"schema": {"$ref": "#/components/schemas/M"}, "defs": {"M": {"type": "object", "properties": {
			"A": {"type": "integer"}, "-": {"type": "integer"}, "D": {"type": "integer"}}, "required": ["A", "-"], "additionalProperties": false}}}`},
		{name: "string option", src: `type M struct {
			N int        ` + "`json:\",string\"`" + `
			P *float64   ` + "`json:\",string\"`" + `
			B bool       ` + "`json:\",string\"`" + `
			T time.Time  ` + "`json:\",string\"`" + `
			D time.Duration ` + "`json:\",string\"`" + `
			L []int      ` + "`json:\",string\"`" + `
		}`, want: `{"schema": {"$ref": "#/components/schemas/M"}, "defs": {"M": {"type": "object", "properties": {
			"N": {"type": "string"}, "P": {"oneOf": [{"type": "string"}, {"type": "null"}]}, "B": {"type": "string"},
			"T": {"type": "string", "format": "date-time"}, "D": {"type": "string"},
			"L": {"oneOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "null"}]}},
			"required": ["N", "P", "B", "T", "D", "L"], "additionalProperties": false}}}`},
		{name: "nil slices and maps are null, arrays never", src: `type M struct {
			S []int; B []byte; R json.RawMessage; A [2]bool; IM map[int]string; KM map[Key]int; PP **int
		}
		type Key struct{}
		func (Key) MarshalText() ([]byte, error) { return nil, nil }`,
			want: `{"schema": {"$ref": "#/components/schemas/M"}, "defs": {"M": {"type": "object", "properties": {
			"S": {"oneOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "null"}]},
			"B": {"oneOf": [{"type": "string", "contentEncoding": "base64"}, {"type": "null"}]},
			"R": {},
			"A": {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 2},
			"IM": {"oneOf": [{"type": "object", "additionalProperties": {"type": "string"}}, {"type": "null"}]},
			"KM": {"oneOf": [{"type": "object", "additionalProperties": {"type": "integer"}}, {"type": "null"}]},
			"PP": {"oneOf": [{"type": "integer"}, {"type": "null"}]}},
			"required": ["S", "B", "R", "A", "IM", "KM", "PP"], "additionalProperties": false}}}`},
		{name: "map with bool keys", src: `type M struct { Flags map[bool]int }`, err: "field Flags: map key bool cannot be a JSON object key"},
		{name: "map with array keys", src: `type M struct { Grid map[[2]int]int }`, err: "field Grid: map key [2]int cannot be a JSON object key"},
		{name: "map with float keys", src: `type M struct { Rates map[float64]int }`, err: "field Rates: map key float64 cannot be a JSON object key"},
		{name: "interfaces hold anything", src: `type M struct { Any any; Err error; S fmt.Stringer; error }`,
			want: `{"schema": {"$ref": "#/components/schemas/M"}, "defs": {"M": {"type": "object", "properties": {
			"Any": {}, "Err": {}, "S": {}}, "required": ["Any", "Err", "S"], "additionalProperties": false}}}`},
		{name: "channel", src: `type M struct { C chan int }`, err: "field C: type chan int has no JSON form"},
		{name: "function", src: `type M struct { OnDone func() }`, err: "field OnDone: type func() has no JSON form"},
		{name: "complex number", src: `type M struct { Z complex128 }`, err: "field Z: type complex128 has no JSON form"},
		{name: "unsafe pointer", src: `type M struct { P unsafe.Pointer }`, err: "field P: type unsafe.Pointer has no JSON form"},
		{name: "channels and functions that encoding/json skips", src: `type M struct {
			C chan int ` + "`json:\"-\"`" + `
			f func()
			X int
		}`, want: `{"schema": {"$ref": "#/components/schemas/M"}, "defs": {"M": {"type": "object", "properties": {
			"X": {"type": "integer"}}, "required": ["X"], "additionalProperties": false}}}`},
		{name: "generic instantiations", src: `type Pair[T any] struct { V T }
			type M struct { I Pair[int]; S Pair[string]; P *Pair[Pair[string]]; O other.Pair[other.Order] }`,
			want: `{"schema": {"$ref": "#/components/schemas/M"}, "defs": {
			"Pair-int": {"type": "object", "properties": {"V": {"type": "integer"}}, "required": ["V"], "additionalProperties": false},
			"Pair-string": {"type": "object", "properties": {"V": {"type": "string"}}, "required": ["V"], "additionalProperties": false},
			"Pair-Pair_string": {"type": "object", "properties": {"V": {"$ref": "#/components/schemas/Pair-string"}}, "required": ["V"], "additionalProperties": false},
			"Order": {"type": "object", "properties": {"total": {"type": "integer"}}, "required": ["total"], "additionalProperties": false},
			"Pair-Order": {"type": "object", "properties": {"V": {"$ref": "#/components/schemas/Order"}}, "required": ["V"], "additionalProperties": false},
			"M": {"type": "object", "properties": {"I": {"$ref": "#/components/schemas/Pair-int"}, "S": {"$ref": "#/components/schemas/Pair-string"},
				"P": {"oneOf": [{"$ref": "#/components/schemas/Pair-Pair_string"}, {"type": "null"}]}, "O": {"$ref": "#/components/schemas/Pair-Order"}},
				"required": ["I", "S", "P", "O"], "additionalProperties": false}}}`},
		{name: "types of one name from two packages", src: `type Order struct { ID string; Other other.Order }`,
			want: `{"schema": {"$ref": "#/components/schemas/Order"}, "defs": {
			"other.Order": {"type": "object", "properties": {"total": {"type": "integer"}}, "required": ["total"], "additionalProperties": false},
			"Order": {"type": "object", "properties": {"ID": {"type": "string"}, "Other": {"$ref": "#/components/schemas/other.Order"}},
				"required": ["ID", "Other"], "additionalProperties": false}}}`},
		{name: "marshalers write what they write", src: `type Money int
			func (Money) MarshalJSON() ([]byte, error) { return nil, nil }
			type Level int
			func (Level) MarshalText() ([]byte, error) { return nil, nil }
			type Addressed struct{ X int }
			func (*Addressed) MarshalText() ([]byte, error) { return nil, nil }
			type M struct {
				Price Money; L Level; PL *Level; A Addressed; PA *Addressed
				Q Level ` + "`json:\",string\"`" + `
			}`,
			want: `{"schema": {"$ref": "#/components/schemas/M"}, "defs": {"M": {"type": "object", "properties": {
			"Price": {}, "L": {"type": "string"}, "PL": {"oneOf": [{"type": "string"}, {"type": "null"}]}, "A": {},
			"PA": {"oneOf": [{"type": "string"}, {"type": "null"}]}, "Q": {"type": "string"}},
			"required": ["Price", "L", "PL", "A", "PA", "Q"], "additionalProperties": false}}}`},
		{name: "embedding a marshaler makes the message one", src: `type Level int
			func (Level) MarshalText() ([]byte, error) { return nil, nil }
			type M struct { Level; X int }`,
			want: `{"schema": {"type": "string"}, "defs": {}}`},
		{name: "anonymous structs are inlined", src: `type M struct { Inner struct { A int ` + "`json:\"a\"`" + ` } ` + "`json:\"inner\"`" + ` }`,
			want: `{"schema": {"$ref": "#/components/schemas/M"}, "defs": {"M": {"type": "object", "properties": {
			"inner": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false}},
			"required": ["inner"], "additionalProperties": false}}}`},
	}
	fset := token.NewFileSet()
	imp := newSourceImporter(t, fset)
	for i, tt := range tests {
		// Sequential subtests: the importer is not safe for concurrent use.
		t.Run(tt.name, func(t *testing.T) {
			src := `package p

import (
	"encoding/json"
	"fmt"
	"time"
	"unsafe"

	"example.com/other"
)

var (
	_ json.RawMessage
	_ fmt.Stringer
	_ time.Time
	_ unsafe.Pointer
	_ other.Order
)

` + tt.src
			pkg := checkSource(t, fset, imp, "example.com/p"+strings.Repeat("x", i), src)
			msg := pkg.Scope().Lookup("M")
			if msg == nil {
				msg = pkg.Scope().Lookup("Order")
			}
			s := newSchemas()
			sch, err := s.schema(msg.Type())
			if tt.err != "" {
				if err == nil || err.Error() != tt.err {
					t.Errorf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got, want any
			var b strings.Builder
			writeJSON(&b, obj().set("schema", sch).set("defs", s.defs), "")
			if err := json.Unmarshal([]byte(b.String()), &got); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(tt.want), &want); err != nil {
				t.Fatalf("want: %v", err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("schema (-want +got):\n%s", diff)
			}
		})
	}
}
