package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
)

// FuzzDocumentWriters checks the writers of the AsyncAPI document on
// arbitrary keys and strings (property names come from json tags, queue
// names from annotations): writeJSON writes JSON that reads back as the
// document, and writeYAML writes YAML that a YAML reader takes for the
// same document.
func FuzzDocumentWriters(f *testing.F) {
	for _, s := range [][2]string{
		{"name", "orders.created"}, {"$ref", "#/components/schemas/A"}, {"true", "false"}, {"null", "~"},
		{"1", "1"}, {"-", "- x"}, {".inf", ".nan"}, {"yes", "no"}, {"Y", "on"}, {"a: b", "a: b"}, {"#", "# c"},
		{"", ""}, {"é", "\u2028\u2029"}, {"x\x7fy", "\u0085\u009f"}, {"\ufeff", "\ufffe"}, {"\xff", "\x00"},
		{strings.Repeat("&", 200), "k"}, {strings.Repeat("k", 1100), "v"}, {"key with space", "'single'"}, {"<&>", `"\`}, {"0x1F", "0o17"}, {"_", "-1"}, {"a.b-c_d", "&anchor"}, {"<<", "*alias"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, key, value string) {
		doc := obj().
			set(key, value).
			set("list", []any{value, obj().set(key, obj()), []any{}, []string{key, value}, obj().set(key, []any{obj().set(value, 1)})}).
			set("nested", obj().set(key, obj().set("n", int64(-3)).set("b", true).set("e", []any{})))
		var j strings.Builder
		writeJSON(&j, doc, "")
		var fromJSON any
		if err := json.Unmarshal([]byte(j.String()), &fromJSON); err != nil {
			t.Fatalf("writeJSON wrote invalid JSON: %v\n%s", err, j.String())
		}
		want := toPlain(doc)
		if diff := cmp.Diff(want, fromJSON); diff != "" {
			t.Fatalf("JSON reads back differently (-document +read):\n%s\n%s", diff, j.String())
		}
		var y strings.Builder
		writeYAML(&y, doc, "")
		var fromYAML any
		if err := yaml.Unmarshal([]byte(y.String()), &fromYAML); err != nil {
			t.Fatalf("writeYAML wrote invalid YAML: %v\n%s", err, y.String())
		}
		got, err := normaliseYAML(fromYAML)
		if err != nil {
			t.Fatalf("YAML: %v\n%s", err, y.String())
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("YAML reads back differently (-document +read):\n%s\n%s", diff, y.String())
		}
	})
}

// toPlain turns a document into the values encoding/json decodes,
// strings made valid UTF-8 as encoding/json writes them.
func toPlain(v any) any {
	switch v := v.(type) {
	case *node:
		m := map[string]any{}
		for _, k := range v.keys {
			m[validUTF8(k)] = toPlain(v.vals[k])
		}
		return m
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = toPlain(e)
		}
		return out
	case []string:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = validUTF8(e)
		}
		return out
	case string:
		return validUTF8(v)
	case int64:
		return float64(v)
	case int:
		return float64(v)
	}
	return v
}

// validUTF8 replaces each invalid byte of s with U+FFFD, as
// encoding/json does.
func validUTF8(s string) string {
	var b strings.Builder
	for _, r := range s {
		b.WriteRune(r)
	}
	return b.String()
}

// normaliseYAML turns what the YAML reader decoded into the values
// encoding/json decodes, failing on keys that are not strings.
func normaliseYAML(v any) (any, error) {
	switch v := v.(type) {
	case map[string]any:
		m := map[string]any{}
		for k, e := range v {
			n, err := normaliseYAML(e)
			if err != nil {
				return nil, err
			}
			m[k] = n
		}
		return m, nil
	case map[any]any:
		for k := range v {
			if _, ok := k.(string); !ok {
				return nil, fmt.Errorf("key %#v (%T) is not a string", k, k)
			}
		}
		return nil, fmt.Errorf("mapping with keys of several kinds: %v", v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			n, err := normaliseYAML(e)
			if err != nil {
				return nil, err
			}
			out[i] = n
		}
		return out, nil
	case int:
		return float64(v), nil
	}
	return v, nil
}
