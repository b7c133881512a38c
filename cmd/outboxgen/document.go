package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// writeJSON renders v (a *node, []any, []string, string, int, int64 or
// bool) as indented JSON with keys in node order.
func writeJSON(b *strings.Builder, v any, indent string) {
	switch v := v.(type) {
	case *node:
		if len(v.keys) == 0 {
			b.WriteString("{}")
			return
		}
		b.WriteString("{\n")
		for i, k := range v.keys {
			b.WriteString(indent + "  " + quote(k) + ": ")
			writeJSON(b, v.vals[k], indent+"  ")
			if i < len(v.keys)-1 {
				b.WriteString(",")
			}
			b.WriteString("\n")
		}
		b.WriteString(indent + "}")
	case []any:
		b.WriteString("[\n")
		for i, e := range v {
			b.WriteString(indent + "  ")
			writeJSON(b, e, indent+"  ")
			if i < len(v)-1 {
				b.WriteString(",")
			}
			b.WriteString("\n")
		}
		b.WriteString(indent + "]")
	case []string:
		items := make([]any, len(v))
		for i, s := range v {
			items[i] = s
		}
		writeJSON(b, items, indent)
	default:
		b.WriteString(scalar(v))
	}
}

// yamlMaxImplicitKey is the longest key, in characters, written as a plain
// "key: value": YAML limits such keys to 1024 characters, so longer ones
// are written as an explicit "? key" with ": value" on the next line.
const yamlMaxImplicitKey = 1000

// writeYAML renders v as block YAML with keys in node order.
func writeYAML(b *strings.Builder, v any, indent string) {
	switch v := v.(type) {
	case *node:
		for _, k := range v.keys {
			val := v.vals[k]
			if key := yamlKey(k); utf8.RuneCountInString(key) <= yamlMaxImplicitKey {
				b.WriteString(indent + key + ":")
			} else {
				b.WriteString(indent + "? " + key + "\n" + indent + ":")
			}
			writeYAMLValue(b, val, indent)
		}
	case []any:
		for _, e := range v {
			b.WriteString(indent + "-")
			if n, ok := e.(*node); ok && len(n.keys) > 0 {
				// The first key shares the dash's line.
				var inner strings.Builder
				writeYAML(&inner, n, indent+"  ")
				b.WriteString(" " + strings.TrimPrefix(inner.String(), indent+"  "))
				continue
			}
			writeYAMLValue(b, e, indent)
		}
	}
}

func writeYAMLValue(b *strings.Builder, val any, indent string) {
	switch val := val.(type) {
	case *node:
		if len(val.keys) == 0 {
			b.WriteString(" {}\n")
			return
		}
		b.WriteString("\n")
		writeYAML(b, val, indent+"  ")
	case []any:
		if len(val) == 0 {
			b.WriteString(" []\n")
			return
		}
		b.WriteString("\n")
		writeYAML(b, val, indent+"  ")
	case []string:
		items := make([]any, len(val))
		for i, s := range val {
			items[i] = s
		}
		writeYAMLValue(b, items, indent)
	default:
		b.WriteString(" " + scalar(val) + "\n")
	}
}

// scalar renders a scalar in a form both JSON and YAML read alike.
func scalar(v any) string {
	switch v := v.(type) {
	case string:
		return quote(v)
	case int:
		return strconv.Itoa(v)
	case int64:
		return strconv.FormatInt(v, 10)
	case bool:
		return strconv.FormatBool(v)
	}
	return quote(fmt.Sprint(v))
}

// quote writes s as a JSON string, which YAML reads alike once the
// characters a YAML stream cannot hold raw (DEL, C1 controls, U+FFFE and
// U+FFFF, and NEL, which YAML 1.1 readers take for a line break) are
// escaped too.
func quote(s string) string {
	b, _ := json.Marshal(s)
	q := string(b)
	if !strings.ContainsFunc(q, yamlUnprintable) {
		return q
	}
	var out strings.Builder
	for _, r := range q {
		if yamlUnprintable(r) {
			fmt.Fprintf(&out, `\u%04x`, r)
		} else {
			out.WriteRune(r)
		}
	}
	return out.String()
}

// yamlUnprintable reports the characters outside YAML's c-printable set,
// and NEL.
func yamlUnprintable(r rune) bool {
	return !(r == '\t' || r == '\n' || r == '\r' || r >= 0x20 && r <= 0x7e ||
		r >= 0xa0 && r <= 0xd7ff || r >= 0xe000 && r <= 0xfffd || r >= 0x10000 && r <= 0x10ffff)
}

// yamlKey leaves plain keys bare and quotes the rest: keys with other
// characters ($ref, say), keys that do not start with a letter or an
// underscore (1, -, .inf), and words a YAML reader takes for a boolean or
// null (true, No, null, y).
func yamlKey(k string) string {
	if k == "" || !(k[0] == '_' || k[0] >= 'a' && k[0] <= 'z' || k[0] >= 'A' && k[0] <= 'Z') {
		return quote(k)
	}
	for _, r := range k {
		if !(r == '_' || r == '-' || r == '.' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return quote(k)
		}
	}
	switch strings.ToLower(k) {
	case "true", "false", "yes", "no", "on", "off", "y", "n", "null":
		return quote(k)
	}
	return k
}
