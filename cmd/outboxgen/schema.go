package main

import (
	"cmp"
	"fmt"
	"go/types"
	"reflect"
	"slices"
	"strings"
	"unicode"

	"golang.org/x/tools/go/types/typeutil"
)

// node is an ordered document: the AsyncAPI file is written from it as
// YAML or JSON with keys in a fixed order, so output is reproducible.
type node struct {
	keys []string
	vals map[string]any
}

func obj() *node { return &node{vals: map[string]any{}} }

// set adds or replaces key, keeping first-insertion order; it returns n.
func (n *node) set(key string, v any) *node {
	if _, ok := n.vals[key]; !ok {
		n.keys = append(n.keys, key)
	}
	n.vals[key] = v
	return n
}

// schemas turns Go types into JSON Schemas of what encoding/json writes for
// them, collecting named structs under components/schemas.
type schemas struct {
	defs  *node
	names typeutil.Map // *types.Named -> its name under components/schemas
	taken map[string]bool
	begun map[string]bool // definitions begun: a recursive type refers to itself
}

func newSchemas() *schemas {
	return &schemas{defs: obj(), taken: map[string]bool{}, begun: map[string]bool{}}
}

// name returns t's name under components/schemas, choosing it on first
// use: the type's name, with its type arguments for an instance of a
// generic type (Page-Order for Page[Order]), qualified by its package name
// when another type has the name (billing.Order), and numbered when even
// that is taken.
func (s *schemas) name(t *types.Named) string {
	if name, ok := s.names.At(t).(string); ok {
		return name
	}
	base := t.Obj().Name()
	for arg := range t.TypeArgs().Types() {
		qualifier := func(p *types.Package) string {
			if p == t.Obj().Pkg() {
				return ""
			}
			return p.Name()
		}
		base += "-" + strings.TrimRight(componentKey(types.TypeString(arg, qualifier)), "_")
	}
	name := base
	if s.taken[name] && t.Obj().Pkg() != nil {
		base = componentKey(t.Obj().Pkg().Name()) + "." + base
		name = base
	}
	for i := 2; s.taken[name]; i++ {
		name = fmt.Sprintf("%s-%d", base, i)
	}
	s.taken[name] = true
	s.names.Set(t, name)
	return name
}

// componentKey replaces what an AsyncAPI component key cannot hold
// (^[a-zA-Z0-9.\-_]+$) with underscores.
func componentKey(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '.' || r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, s)
}

// ref returns a reference to the schema of the named struct t, defining it
// on first use.
func (s *schemas) ref(t *types.Named) (*node, error) {
	name := s.name(t)
	if !s.begun[name] {
		s.begun[name] = true
		if _, ok := t.Underlying().(*types.Struct); !ok {
			return nil, fmt.Errorf("%s is not a struct", t.Obj().Name())
		}
		def, err := s.structSchema(t)
		if err != nil {
			return nil, err
		}
		s.defs.set(name, def)
	}
	return obj().set("$ref", "#/components/schemas/"+name), nil
}

// structSchema returns the schema of the JSON object encoding/json writes
// for t, a struct type.
func (s *schemas) structSchema(t types.Type) (*node, error) {
	props := obj()
	var required []string
	for _, f := range jsonFields(t) {
		sch, err := s.fieldSchema(f)
		if err != nil {
			return nil, fmt.Errorf("field %s: %w", f.goName, err)
		}
		props.set(f.name, sch)
		if !f.optional {
			required = append(required, f.name)
		}
	}
	n := obj().set("type", "object").set("properties", props)
	if len(required) > 0 {
		n.set("required", required)
	}
	return n.set("additionalProperties", false), nil
}

// fieldSchema is the schema of one member of a JSON object.
func (s *schemas) fieldSchema(f jsonField) (*node, error) {
	if f.quoted && marshalerOf(f.typ) == noMarshaler {
		// ,string writes the value inside a JSON string; a nil pointer
		// is still null. Marshalers ignore it.
		str := obj().set("type", "string")
		if _, ptr := types.Unalias(f.typ).(*types.Pointer); ptr {
			return orNull(str), nil
		}
		return str, nil
	}
	return s.schema(f.typ)
}

// jsonField is one member of the JSON object encoding/json writes for a
// struct.
type jsonField struct {
	name   string     // the member's name
	goName string     // the Go field's name
	typ    types.Type // the Go field's type
	tagged bool       // name comes from the json tag
	index  []int      // the field's index sequence through embedded structs
	quoted bool       // ,string: the value is written inside a JSON string
	// optional is set when the member may be left out: omitempty or
	// omitzero, or an embedded pointer it is promoted through is nil.
	optional bool
}

// jsonFields lists the members of the JSON object of t, a struct type, as
// encoding/json's typeFields does: exported fields, and the fields of
// embedded structs breadth first (each struct type once, so recursive
// embedding ends); a json tag renames a field when its name is valid, "-"
// drops it; of fields with one name, the shallowest wins, then the tagged
// one, and two equally good cancel out.
func jsonFields(t types.Type) []jsonField {
	type level struct {
		typ      types.Type
		index    []int
		optional bool
	}
	var (
		fields           []jsonField
		visited          typeutil.Map
		count, nextCount typeutil.Map
		next             = []level{{typ: t}}
	)
	for len(next) > 0 {
		current := next
		next = nil
		count, nextCount = nextCount, typeutil.Map{}
		for _, l := range current {
			if visited.At(l.typ) != nil {
				continue
			}
			visited.Set(l.typ, true)
			st := l.typ.Underlying().(*types.Struct)
			for i := range st.NumFields() {
				sf := st.Field(i)
				ft := types.Unalias(sf.Type())
				// encoding/json looks through an unnamed pointer.
				elem := ft
				if p, ok := ft.(*types.Pointer); ok {
					elem = types.Unalias(p.Elem())
				}
				_, isStruct := elem.Underlying().(*types.Struct)
				if sf.Embedded() && !sf.Exported() && !isStruct || !sf.Embedded() && !sf.Exported() {
					continue
				}
				tag := reflect.StructTag(st.Tag(i)).Get("json")
				if tag == "-" {
					continue
				}
				name, opts, _ := strings.Cut(tag, ",")
				if !validTagName(name) {
					name = ""
				}
				index := append(slices.Clone(l.index), i)
				if name != "" || !sf.Embedded() || !isStruct {
					f := jsonField{
						name: cmp.Or(name, sf.Name()), goName: sf.Name(), typ: ft, tagged: name != "", index: index,
						quoted:   hasOption(opts, "string") && quotable(elem),
						optional: l.optional || hasOption(opts, "omitempty") || hasOption(opts, "omitzero"),
					}
					fields = append(fields, f)
					if n, _ := count.At(l.typ).(int); n > 1 {
						// Several embeddings at this depth: a duplicate
						// makes the field cancel out below.
						fields = append(fields, f)
					}
					continue
				}
				n, _ := nextCount.At(elem).(int)
				nextCount.Set(elem, n+1)
				if n == 0 {
					_, viaPointer := ft.(*types.Pointer)
					next = append(next, level{typ: elem, index: index, optional: l.optional || viaPointer})
				}
			}
		}
	}
	slices.SortFunc(fields, func(a, b jsonField) int {
		if c := strings.Compare(a.name, b.name); c != 0 {
			return c
		}
		if c := cmp.Compare(len(a.index), len(b.index)); c != 0 {
			return c
		}
		if a.tagged != b.tagged {
			if a.tagged {
				return -1
			}
			return 1
		}
		return slices.Compare(a.index, b.index)
	})
	var out []jsonField
	for i := 0; i < len(fields); {
		j := i + 1
		for j < len(fields) && fields[j].name == fields[i].name {
			j++
		}
		// The first is the shallowest, tagged first; a second as good
		// hides it.
		if j-i == 1 || len(fields[i].index) != len(fields[i+1].index) || fields[i].tagged != fields[i+1].tagged {
			out = append(out, fields[i])
		}
		i = j
	}
	slices.SortFunc(out, func(a, b jsonField) int { return slices.Compare(a.index, b.index) })
	return out
}

// validTagName is encoding/json's rule for a name in a json tag; a field
// with an invalid one keeps its Go name.
func validTagName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !strings.ContainsRune("!#$%&()*+-./:;<=>?@[]^_{|}~ ", c) && !unicode.IsLetter(c) && !unicode.IsDigit(c) {
			return false
		}
	}
	return true
}

// hasOption reports whether the comma-separated options of a json tag
// hold option.
func hasOption(opts, option string) bool {
	return opts != "" && slices.Contains(strings.Split(opts, ","), option)
}

// quotable reports whether ,string applies to t: booleans, numbers and
// strings.
func quotable(t types.Type) bool {
	b, ok := t.Underlying().(*types.Basic)
	return ok && b.Info()&(types.IsBoolean|types.IsInteger|types.IsFloat|types.IsString) != 0 && b.Info()&types.IsUntyped == 0 &&
		b.Kind() != types.UnsafePointer
}

// orNull allows null besides n: encoding/json writes a nil pointer, slice
// or map as null. A schema that allows null already (any value, or one
// made by orNull) is returned as it is: null must match one branch of a
// oneOf, not two.
func orNull(n *node) *node {
	if len(n.keys) == 0 {
		return n
	}
	if alts, ok := n.vals["oneOf"].([]any); ok && len(n.keys) == 1 {
		for _, a := range alts {
			if a, ok := a.(*node); ok && len(a.keys) == 1 && a.vals["type"] == "null" {
				return n
			}
		}
	}
	return obj().set("oneOf", []any{n, obj().set("type", "null")})
}

// schema returns the JSON Schema of t as encoding/json encodes it.
func (s *schemas) schema(t types.Type) (*node, error) {
	t = types.Unalias(t)
	if named, ok := t.(*types.Named); ok {
		switch path := named.Obj().Pkg(); {
		case path != nil && path.Path() == "time" && named.Obj().Name() == "Time":
			return obj().set("type", "string").set("format", "date-time"), nil
		case path != nil && path.Path() == "time" && named.Obj().Name() == "Duration":
			return obj().set("type", "integer").set("description", "nanoseconds"), nil
		}
	}
	switch marshalerOf(t) {
	case jsonMarshaler, maybeMarshaler:
		// Whatever its method writes, or (a method of *T on a T that is
		// not addressable) the default encoding.
		return obj(), nil
	case textMarshaler:
		if _, ptr := t.(*types.Pointer); ptr {
			return orNull(obj().set("type", "string")), nil
		}
		return obj().set("type", "string"), nil
	}
	if named, ok := t.(*types.Named); ok {
		if _, ok := named.Underlying().(*types.Struct); ok {
			return s.ref(named)
		}
	}
	switch u := t.Underlying().(type) {
	case *types.Basic:
		switch {
		case u.Kind() == types.UnsafePointer || u.Info()&types.IsUntyped != 0:
		case u.Info()&types.IsBoolean != 0:
			return obj().set("type", "boolean"), nil
		case u.Info()&types.IsInteger != 0:
			return obj().set("type", "integer"), nil
		case u.Info()&types.IsFloat != 0:
			return obj().set("type", "number"), nil
		case u.Info()&types.IsString != 0:
			return obj().set("type", "string"), nil
		}
	case *types.Pointer:
		inner, err := s.schema(u.Elem())
		if err != nil {
			return nil, err
		}
		return orNull(inner), nil
	case *types.Slice:
		if b, ok := u.Elem().Underlying().(*types.Basic); ok && b.Kind() == types.Byte &&
			marshalerOf(u.Elem()) == noMarshaler && marshalerOf(types.NewPointer(u.Elem())) == noMarshaler {
			return orNull(obj().set("type", "string").set("contentEncoding", "base64")), nil
		}
		items, err := s.schema(u.Elem())
		if err != nil {
			return nil, err
		}
		return orNull(obj().set("type", "array").set("items", items)), nil
	case *types.Array:
		items, err := s.schema(u.Elem())
		if err != nil {
			return nil, err
		}
		return obj().set("type", "array").set("items", items).set("minItems", u.Len()).set("maxItems", u.Len()), nil
	case *types.Map:
		k, ok := u.Key().Underlying().(*types.Basic)
		if (!ok || k.Info()&(types.IsString|types.IsInteger) == 0) && !hasMethods(u.Key(), textMarshalerMethod) {
			return nil, fmt.Errorf("map key %s cannot be a JSON object key", u.Key())
		}
		vals, err := s.schema(u.Elem())
		if err != nil {
			return nil, err
		}
		return orNull(obj().set("type", "object").set("additionalProperties", vals)), nil
	case *types.Struct:
		return s.structSchema(u)
	case *types.Interface:
		return obj(), nil
	}
	if b, ok := t.(*types.Basic); ok && b.Kind() == types.Invalid {
		return nil, fmt.Errorf("its type does not compile")
	}
	return nil, fmt.Errorf("type %s has no JSON form", t)
}

// marshaler says how a type's own methods take part in its encoding.
type marshaler int

const (
	noMarshaler    marshaler = iota
	jsonMarshaler            // it has MarshalJSON
	textMarshaler            // it has MarshalText (and no MarshalJSON)
	maybeMarshaler           // *T has either: used only where T is addressable
)

var (
	byteSlice           = types.NewSlice(types.Typ[types.Byte])
	marshalerResults    = types.NewTuple(types.NewParam(0, nil, "", byteSlice), types.NewParam(0, nil, "", types.Universe.Lookup("error").Type()))
	jsonMarshalerMethod = types.NewFunc(0, nil, "MarshalJSON", types.NewSignatureType(nil, nil, nil, nil, marshalerResults, false))
	textMarshalerMethod = types.NewFunc(0, nil, "MarshalText", types.NewSignatureType(nil, nil, nil, nil, marshalerResults, false))
)

func marshalerOf(t types.Type) marshaler {
	switch {
	case hasMethods(t, jsonMarshalerMethod):
		return jsonMarshaler
	case hasMethods(t, textMarshalerMethod):
		return textMarshaler
	}
	if _, ptr := t.Underlying().(*types.Pointer); !ptr {
		if _, iface := t.Underlying().(*types.Interface); !iface {
			p := types.NewPointer(t)
			if hasMethods(p, jsonMarshalerMethod) || hasMethods(p, textMarshalerMethod) {
				return maybeMarshaler
			}
		}
	}
	return noMarshaler
}

// hasMethods reports whether t's method set has m, as encoding/json's
// Implements checks.
func hasMethods(t types.Type, m *types.Func) bool {
	return types.Implements(t, types.NewInterfaceType([]*types.Func{m}, nil).Complete())
}
