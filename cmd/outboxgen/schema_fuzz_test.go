package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The types FuzzJSONSchema builds messages from, declared here for
// encoding/json and in fzTypesSrc for go/types: keep the two in step.
type (
	FzLeaf struct {
		V int    `json:"v"`
		W string `json:",omitempty"`
	}
	FzRec struct {
		Next *FzRec `json:"next,omitempty"`
		N    int
	}
	FzInt     int
	FzText    int
	FzPtrText int
	FzJSON    bool
	FzEmb     struct {
		A int
		B string `json:"b"`
		C bool   `json:",omitempty"`
	}
	FzEmb2 struct {
		A string `json:"a"`
		D []int
	}
	FzDeep struct {
		FzEmb
		*FzEmb2
		E int
	}
	FzCyc struct {
		*FzCyc
		G int
	}
)

func (FzText) MarshalText() ([]byte, error)     { return []byte("text"), nil }
func (*FzPtrText) MarshalText() ([]byte, error) { return []byte("ptr"), nil }
func (FzJSON) MarshalJSON() ([]byte, error)     { return []byte(`{"custom":[1]}`), nil }

const fzTypesSrc = `package p

type (
	FzLeaf struct {
		V int    ` + "`json:\"v\"`" + `
		W string ` + "`json:\",omitempty\"`" + `
	}
	FzRec struct {
		Next *FzRec ` + "`json:\"next,omitempty\"`" + `
		N    int
	}
	FzInt     int
	FzText    int
	FzPtrText int
	FzJSON    bool
	FzEmb     struct {
		A int
		B string ` + "`json:\"b\"`" + `
		C bool   ` + "`json:\",omitempty\"`" + `
	}
	FzEmb2 struct {
		A string ` + "`json:\"a\"`" + `
		D []int
	}
	FzDeep struct {
		FzEmb
		*FzEmb2
		E int
	}
	FzCyc struct {
		*FzCyc
		G int
	}
)

func (FzText) MarshalText() ([]byte, error)     { return []byte("text"), nil }
func (*FzPtrText) MarshalText() ([]byte, error) { return []byte("ptr"), nil }
func (FzJSON) MarshalJSON() ([]byte, error)     { return []byte(` + "`" + `{"custom":[1]}` + "`" + `), nil }
`

// fzType is a field type spelled for go/types and made for reflect.
type fzType struct {
	src string
	typ reflect.Type
}

func fzT[T any](src string) fzType { return fzType{src, reflect.TypeFor[T]()} }

var fzFieldTypes = []fzType{
	fzT[int]("int"), fzT[string]("string"), fzT[bool]("bool"), fzT[float64]("float64"), fzT[uint8]("uint8"),
	fzT[*int]("*int"), fzT[*string]("*string"), fzT[**bool]("**bool"), fzT[*[]int]("*[]int"), fzT[*any]("*any"),
	fzT[[]string]("[]string"), fzT[[]byte]("[]byte"), fzT[[2]int]("[2]int"), fzT[[]any]("[]any"),
	fzT[map[string]int]("map[string]int"), fzT[map[int]bool]("map[int]bool"), fzT[map[FzInt]string]("map[FzInt]string"),
	fzT[map[FzText]int]("map[FzText]int"), fzT[any]("any"), fzT[FzLeaf]("FzLeaf"), fzT[*FzLeaf]("*FzLeaf"),
	fzT[[]FzLeaf]("[]FzLeaf"), fzT[[]*FzLeaf]("[]*FzLeaf"), fzT[map[string]*FzLeaf]("map[string]*FzLeaf"),
	fzT[FzRec]("FzRec"), fzT[FzInt]("FzInt"), fzT[*FzInt]("*FzInt"), fzT[FzText]("FzText"), fzT[*FzText]("*FzText"),
	fzT[FzPtrText]("FzPtrText"), fzT[*FzPtrText]("*FzPtrText"), fzT[FzJSON]("FzJSON"), fzT[[]FzJSON]("[]FzJSON"),
	fzT[FzDeep]("FzDeep"), fzT[struct {
		X int `json:"x"`
	}]("struct{ X int `json:\"x\"` }"),
}

var fzEmbedded = []fzType{
	fzT[FzEmb]("FzEmb"), fzT[*FzEmb]("*FzEmb"), fzT[FzEmb2]("FzEmb2"), fzT[*FzEmb2]("*FzEmb2"),
	fzT[FzDeep]("FzDeep"), fzT[*FzDeep]("*FzDeep"), fzT[FzCyc]("FzCyc"), fzT[*FzCyc]("*FzCyc"),
	fzT[FzLeaf]("FzLeaf"), fzT[FzInt]("FzInt"), fzT[*FzInt]("*FzInt"),
}

var fzNames = []string{"A", "B", "D", "E", "G", "V", "X", "x", "Next", "FzEmb"}

// fzStruct is a message type built from fuzz input: up to four fields,
// each a named field of a menu type or an embedded menu type, with a
// fuzzed tag.
type fzStruct struct {
	src    string       // Go source declaring it as Msg
	typ    reflect.Type // the same struct for encoding/json
	fields []string     // its fields as Go source, for messages
}

func buildFzStruct(tags [4]string, shape uint64) fzStruct {
	var (
		fields []reflect.StructField
		lines  []string
		used   = map[string]bool{}
	)
	for i, tag := range tags {
		b := shape >> (16 * i) & 0xffff
		var f reflect.StructField
		var line string
		switch b & 3 {
		case 3: // no field
			continue
		case 0:
			e := fzEmbedded[(b>>2)%uint64(len(fzEmbedded))]
			name := strings.TrimPrefix(e.src, "*")
			f = reflect.StructField{Name: name, Type: e.typ, Anonymous: true}
			line = e.src
		default:
			name := fzNames[(b>>2)%uint64(len(fzNames))]
			ft := fzFieldTypes[(b>>6)%uint64(len(fzFieldTypes))]
			f = reflect.StructField{Name: name, Type: ft.typ}
			if name == "x" {
				f.PkgPath = "p"
			}
			line = name + " " + ft.src
		}
		if used[f.Name] {
			continue
		}
		used[f.Name] = true
		f.Tag = reflect.StructTag(tag)
		fields = append(fields, f)
		lines = append(lines, line+" "+strconv.Quote(tag))
	}
	return fzStruct{
		src:    fzTypesSrc + "\ntype Msg struct {\n\t" + strings.Join(lines, "\n\t") + "\n}\n",
		typ:    reflect.StructOf(fields),
		fields: lines,
	}
}

// fzField is the lowest specification of a field named fzNames[name] of
// type fzFieldTypes[typ].
func fzField(name, typ uint64) uint64 {
	for b := uint64(1); b < 1<<16; b++ {
		if b&3 != 0 && b&3 != 3 && (b>>2)%uint64(len(fzNames)) == name && (b>>6)%uint64(len(fzFieldTypes)) == typ {
			return b
		}
	}
	return fzNone
}

// fzEmbed specifies an embedded fzEmbedded[typ].
func fzEmbed(typ uint64) uint64 { return typ << 2 }

// fzNone specifies no field.
const fzNone = 3

// fzShape is FuzzJSONSchema's shape of four field specifications, 16 bits
// each (see buildFzStruct).
func fzShape(f0, f1, f2, f3 uint64) uint64 { return f0 | f1<<16 | f2<<32 | f3<<48 }

// FuzzJSONSchema checks the JSON Schemas bind writes against
// encoding/json itself: for a struct built from fuzzed tags, field names,
// types and embeddings, the JSON encoding/json writes for its zero value
// and for filled-in values validates against the schema derived from the
// same struct by go/types.
func FuzzJSONSchema(f *testing.F) {
	for _, s := range []struct {
		tags  [4]string
		shape uint64
	}{
		{[4]string{}, fzShape(fzField(0, 0), fzNone, fzNone, fzNone)},                          // A int
		{[4]string{}, fzShape(fzField(6, 21), fzField(1, 23), fzField(2, 11), fzField(3, 14))}, // nil slices and maps
		{[4]string{}, fzShape(fzField(6, 7), fzField(1, 8), fzField(2, 9), fzField(0, 0))},     // **bool, *[]int, *any
		{[4]string{}, fzShape(fzEmbed(3), fzField(0, 0), fzNone, fzNone)},                      // *FzEmb2, A int
		{[4]string{}, fzShape(fzEmbed(4), fzNone, fzNone, fzNone)},                             // FzDeep
		{[4]string{}, fzShape(fzEmbed(7), fzField(4, 1), fzNone, fzNone)},                      // *FzCyc, G string
		{[4]string{}, fzShape(fzEmbed(0), fzEmbed(3), fzNone, fzNone)},                         // FzEmb, *FzEmb2
		{[4]string{"", `json:"A"`}, fzShape(fzEmbed(0), fzEmbed(2), fzNone, fzNone)},           // a tag wins
		{[4]string{`json:"-,"`, `json:"a'b"`, `json:",string"`, `json:"x,omitzero"`}, fzShape(fzField(0, 0), fzField(1, 1), fzField(6, 5), fzField(5, 11))},
		{[4]string{`json:",string"`, `json:"n,string"`, `json:",string"`, `json:",omitempty,string"`}, fzShape(fzField(0, 27), fzField(1, 26), fzField(2, 2), fzField(6, 30))},
		{[4]string{`json:"true"`, `json:"1"`, `json:"$ref"`, `json:"é"`}, fzShape(fzField(0, 31), fzField(1, 32), fzField(2, 29), fzField(3, 17))},
		{[4]string{`json:"a" yaml:"b"`, `json:"\"a\""`, `json`, `json:"-"`}, fzShape(fzField(0, 24), fzField(1, 33), fzField(2, 34), fzField(7, 18))},
		{[4]string{`json:"FzEmb"`, "", "", ""}, fzShape(fzEmbed(1), fzField(9, 19), fzEmbed(9), fzEmbed(10))},
	} {
		f.Add(s.tags[0], s.tags[1], s.tags[2], s.tags[3], s.shape, int64(len(s.tags[0])))
	}
	f.Fuzz(func(t *testing.T, tag0, tag1, tag2, tag3 string, shape uint64, seed int64) {
		msg := buildFzStruct([4]string{tag0, tag1, tag2, tag3}, shape)
		fset := token.NewFileSet()
		file, err := parser.ParseFile(fset, "msg.go", msg.src, 0)
		if err != nil {
			t.Fatalf("parse:\n%s\n%v", msg.src, err)
		}
		pkg, err := new(types.Config).Check("p", fset, []*ast.File{file}, nil)
		if err != nil {
			t.Fatalf("type-check:\n%s\n%v", msg.src, err)
		}
		s := newSchemas()
		root, err := s.schema(pkg.Scope().Lookup("Msg").Type())
		if err != nil {
			t.Fatalf("schema of\n%s\n%v", msg.src, err)
		}
		schema, defs := toJSON(t, root), toJSON(t, s.defs).(map[string]any)
		checkSchemaDefs(t, defs)
		r := rand.New(rand.NewPCG(uint64(seed), uint64(seed)>>32))
		for i := range 4 {
			v := reflect.New(msg.typ).Elem()
			if i > 0 {
				fill(v, r, 0)
			}
			b, err := json.Marshal(v.Interface())
			if err != nil {
				t.Fatalf("encoding/json cannot encode %#v: %v", v.Interface(), err)
			}
			d := json.NewDecoder(bytes.NewReader(b))
			d.UseNumber()
			var doc any
			if err := d.Decode(&doc); err != nil {
				t.Fatal(err)
			}
			if err := validate(doc, schema, defs, "$"); err != nil {
				t.Fatalf("struct {\n\t%s\n}\nencodes as %s, which its schema refuses: %v\nschema %s\ndefinitions %s",
					strings.Join(msg.fields, "\n\t"), b, err, mustJSON(schema), mustJSON(defs))
			}
		}
	})
}

// toJSON turns a schema node into plain JSON values through writeJSON.
func toJSON(t *testing.T, n *node) any {
	t.Helper()
	var b strings.Builder
	writeJSON(&b, n, "")
	d := json.NewDecoder(strings.NewReader(b.String()))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("writeJSON wrote invalid JSON: %v\n%s", err, b.String())
	}
	return v
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// checkSchemaDefs checks what JSON Schema asks of every object schema:
// required names are unique properties.
func checkSchemaDefs(t *testing.T, defs map[string]any) {
	t.Helper()
	for name, d := range defs {
		def := d.(map[string]any)
		req, _ := def["required"].([]any)
		props, _ := def["properties"].(map[string]any)
		seen := map[string]bool{}
		for _, r := range req {
			r := r.(string)
			if seen[r] || props[r] == nil {
				t.Fatalf("schema %s: required %q is repeated or not a property: %s", name, r, mustJSON(def))
			}
			seen[r] = true
		}
	}
}

// fill sets v to arbitrary values: nil or not, empty or not.
func fill(v reflect.Value, r *rand.Rand, depth int) {
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(r.IntN(2) == 1)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(r.IntN(200)) - 100)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		v.SetUint(uint64(r.IntN(200)))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(r.IntN(2000))/8 - 100)
	case reflect.String:
		v.SetString([]string{"", "x", `é"<\`, "0"}[r.IntN(4)])
	case reflect.Pointer:
		if depth < 4 && r.IntN(3) > 0 {
			p := reflect.New(v.Type().Elem())
			fill(p.Elem(), r, depth+1)
			v.Set(p)
		}
	case reflect.Slice:
		if n := r.IntN(4) - 1; n >= 0 && depth < 4 {
			s := reflect.MakeSlice(v.Type(), n, n)
			for i := range n {
				fill(s.Index(i), r, depth+1)
			}
			v.Set(s)
		}
	case reflect.Array:
		for i := range v.Len() {
			fill(v.Index(i), r, depth+1)
		}
	case reflect.Map:
		if r.IntN(3) > 0 && depth < 4 {
			m := reflect.MakeMap(v.Type())
			for range r.IntN(3) {
				k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
				fill(k, r, depth+1)
				fill(e, r, depth+1)
				m.SetMapIndex(k, e)
			}
			v.Set(m)
		}
	case reflect.Interface:
		switch r.IntN(4) {
		case 1:
			v.Set(reflect.ValueOf("s"))
		case 2:
			v.Set(reflect.ValueOf(map[string]any{"k": []any{1.5, nil}}))
		case 3:
			v.Set(reflect.ValueOf(FzLeaf{V: 1}))
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Field(i).CanSet() {
				fill(v.Field(i), r, depth+1)
			}
		}
	}
}

// validate checks v, decoded with UseNumber, against the subset of JSON
// Schema bind writes; a keyword outside it fails, so that the subset
// stays known.
func validate(v any, schema any, defs map[string]any, path string) error {
	sch, ok := schema.(map[string]any)
	if !ok {
		return fmt.Errorf("%s: schema %v is not an object", path, schema)
	}
	for k := range sch {
		switch k {
		case "$ref", "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
			"oneOf", "format", "contentEncoding", "description", "const":
		default:
			return fmt.Errorf("%s: unknown keyword %q", path, k)
		}
	}
	if ref, ok := sch["$ref"].(string); ok {
		name, ok := strings.CutPrefix(ref, "#/components/schemas/")
		if !ok || defs[name] == nil {
			return fmt.Errorf("%s: dangling $ref %q", path, ref)
		}
		if err := validate(v, defs[name], defs, path); err != nil {
			return err
		}
	}
	if alts, ok := sch["oneOf"].([]any); ok {
		var errs []string
		for _, a := range alts {
			if err := validate(v, a, defs, path); err != nil {
				errs = append(errs, err.Error())
			}
		}
		if len(alts)-len(errs) != 1 {
			return fmt.Errorf("%s: %s matches %d branches of oneOf (%s)", path, mustJSON(v), len(alts)-len(errs), strings.Join(errs, "; "))
		}
	}
	if typ, ok := sch["type"].(string); ok {
		var match bool
		switch typ {
		case "object":
			_, match = v.(map[string]any)
		case "array":
			_, match = v.([]any)
		case "string":
			_, match = v.(string)
		case "boolean":
			_, match = v.(bool)
		case "null":
			match = v == nil
		case "number":
			_, match = v.(json.Number)
		case "integer":
			n, isNum := v.(json.Number)
			_, err := strconv.ParseInt(string(n), 10, 64)
			_, uerr := strconv.ParseUint(string(n), 10, 64)
			match = isNum && (err == nil || uerr == nil)
		default:
			return fmt.Errorf("%s: unknown type %q", path, typ)
		}
		if !match {
			return fmt.Errorf("%s: %s is not of type %s", path, mustJSON(v), typ)
		}
	}
	if c, ok := sch["const"]; ok && mustJSON(c) != mustJSON(v) {
		return fmt.Errorf("%s: %s is not %s", path, mustJSON(v), mustJSON(c))
	}
	if s, ok := v.(string); ok {
		if sch["contentEncoding"] == "base64" {
			if _, err := base64.StdEncoding.DecodeString(s); err != nil {
				return fmt.Errorf("%s: %q is not base64", path, s)
			}
		}
		if sch["format"] == "date-time" {
			if _, err := time.Parse(time.RFC3339Nano, s); err != nil {
				return fmt.Errorf("%s: %q is not a date-time", path, s)
			}
		}
	}
	if o, ok := v.(map[string]any); ok {
		props, _ := sch["properties"].(map[string]any)
		for _, k := range slices.Sorted(func(yield func(string) bool) {
			for k := range o {
				if !yield(k) {
					return
				}
			}
		}) {
			p := path + "." + k
			switch extra := sch["additionalProperties"]; {
			case props[k] != nil:
				if err := validate(o[k], props[k], defs, p); err != nil {
					return err
				}
			case extra == false:
				return fmt.Errorf("%s: property %q is not in the schema", path, k)
			case extra != nil:
				if err := validate(o[k], extra, defs, p); err != nil {
					return err
				}
			}
		}
		req, _ := sch["required"].([]any)
		for _, r := range req {
			if _, ok := o[r.(string)]; !ok {
				return fmt.Errorf("%s: required property %q is missing", path, r)
			}
		}
	}
	if a, ok := v.([]any); ok {
		if n, ok := sch["minItems"].(json.Number); ok {
			if lo, _ := n.Int64(); int64(len(a)) < lo {
				return fmt.Errorf("%s: %d items; at least %d", path, len(a), lo)
			}
		}
		if n, ok := sch["maxItems"].(json.Number); ok {
			if hi, _ := n.Int64(); int64(len(a)) > hi {
				return fmt.Errorf("%s: %d items; at most %d", path, len(a), hi)
			}
		}
		if items, ok := sch["items"]; ok {
			for i, e := range a {
				if err := validate(e, items, defs, fmt.Sprintf("%s[%d]", path, i)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
