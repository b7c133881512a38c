package main

import (
	"fmt"
	"go/types"
	"reflect"
	"strings"
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

// schemas turns Go types into JSON Schemas, collecting named structs under
// components/schemas.
type schemas struct {
	defs  *node
	stack map[string]bool
}

func newSchemas() *schemas { return &schemas{defs: obj(), stack: map[string]bool{}} }

// ref returns a reference to the schema of the named struct t, defining it
// on first use.
func (s *schemas) ref(t *types.Named) (*node, error) {
	name := t.Obj().Name()
	if _, ok := s.defs.vals[name]; !ok && !s.stack[name] {
		s.stack[name] = true
		st, ok := t.Underlying().(*types.Struct)
		if !ok {
			return nil, fmt.Errorf("%s is not a struct", name)
		}
		def, err := s.structSchema(st)
		if err != nil {
			return nil, err
		}
		delete(s.stack, name)
		s.defs.set(name, def)
	}
	return obj().set("$ref", "#/components/schemas/"+name), nil
}

func (s *schemas) structSchema(st *types.Struct) (*node, error) {
	props := obj()
	var required []string
	if err := s.fields(st, props, &required); err != nil {
		return nil, err
	}
	n := obj().set("type", "object").set("properties", props)
	if len(required) > 0 {
		n.set("required", required)
	}
	return n.set("additionalProperties", false), nil
}

// fields adds st's JSON fields to props, following encoding/json's rules
// for tags, unexported fields and embedded structs.
func (s *schemas) fields(st *types.Struct, props *node, required *[]string) error {
	for i := range st.NumFields() {
		f := st.Field(i)
		tag := reflect.StructTag(st.Tag(i)).Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" && opts == "" {
			continue
		}
		if f.Embedded() && name == "" {
			t := f.Type()
			if p, ok := t.(*types.Pointer); ok {
				t = p.Elem()
			}
			if inner, ok := t.Underlying().(*types.Struct); ok {
				if err := s.fields(inner, props, required); err != nil {
					return err
				}
				continue
			}
		}
		if !f.Exported() {
			continue
		}
		if name == "" {
			name = f.Name()
		}
		sch, err := s.schema(f.Type())
		if err != nil {
			return fmt.Errorf("field %s: %w", f.Name(), err)
		}
		props.set(name, sch)
		// encoding/json writes every field (nil pointers as null) unless
		// omitempty or omitzero may leave it out.
		if !strings.Contains(","+opts+",", ",omitempty,") && !strings.Contains(","+opts+",", ",omitzero,") {
			*required = append(*required, name)
		}
	}
	return nil
}

// schema returns the JSON Schema of t as encoding/json encodes it.
func (s *schemas) schema(t types.Type) (*node, error) {
	if named, ok := t.(*types.Named); ok {
		switch path := named.Obj().Pkg(); {
		case path != nil && path.Path() == "time" && named.Obj().Name() == "Time":
			return obj().set("type", "string").set("format", "date-time"), nil
		case path != nil && path.Path() == "time" && named.Obj().Name() == "Duration":
			return obj().set("type", "integer").set("description", "nanoseconds"), nil
		case path != nil && path.Path() == "encoding/json" && named.Obj().Name() == "RawMessage":
			return obj(), nil
		}
		if _, ok := named.Underlying().(*types.Struct); ok {
			return s.ref(named)
		}
	}
	switch u := t.Underlying().(type) {
	case *types.Basic:
		switch {
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
		return obj().set("oneOf", []any{inner, obj().set("type", "null")}), nil
	case *types.Slice:
		if b, ok := u.Elem().Underlying().(*types.Basic); ok && b.Kind() == types.Byte {
			return obj().set("type", "string").set("contentEncoding", "base64"), nil
		}
		items, err := s.schema(u.Elem())
		if err != nil {
			return nil, err
		}
		return obj().set("type", "array").set("items", items), nil
	case *types.Array:
		items, err := s.schema(u.Elem())
		if err != nil {
			return nil, err
		}
		return obj().set("type", "array").set("items", items).set("minItems", u.Len()).set("maxItems", u.Len()), nil
	case *types.Map:
		if k, ok := u.Key().Underlying().(*types.Basic); !ok || k.Info()&(types.IsString|types.IsInteger) == 0 {
			return nil, fmt.Errorf("map key %s cannot be a JSON object key", u.Key())
		}
		vals, err := s.schema(u.Elem())
		if err != nil {
			return nil, err
		}
		return obj().set("type", "object").set("additionalProperties", vals), nil
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
