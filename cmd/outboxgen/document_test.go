package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
)

// Keys a YAML reader would take for a boolean, null or number, or could
// not read bare, are quoted; characters a YAML stream cannot hold raw are
// escaped, in JSON alike.
func TestYAMLQuotesWhatAReaderWouldMisread(t *testing.T) {
	t.Parallel()
	for k, want := range map[string]string{
		"name": "name", "created_by": "created_by", "a.b-c": "a.b-c", "Pair-int": "Pair-int",
		"true": `"true"`, "False": `"False"`, "null": `"null"`, "y": `"y"`, "on": `"on"`, "1": `"1"`,
		"-": `"-"`, ".inf": `".inf"`, "": `""`, "$ref": `"$ref"`, "a b": `"a b"`,
	} {
		if got := yamlKey(k); got != want {
			t.Errorf("yamlKey(%q) = %s, want %s", k, got, want)
		}
	}
	for s, want := range map[string]string{
		"plain": `"plain"`, "é": `"é"`, "a\x7fb": `"a\u007fb"`, "\u0085": `"\u0085"`, "\u009f": `"\u009f"`,
		"\ufffe": `"\ufffe"`, "\u2028": `"\u2028"`, "\t<": `"\t\u003c"`,
	} {
		if got := quote(s); got != want {
			t.Errorf("quote(%q) = %s, want %s", s, got, want)
		}
	}
}

// YAML limits a plain key to 1024 characters; a longer one (a json tag
// name of many characters JSON escapes, say) is written as an explicit
// key, at any depth and as the first key of a list item.
func TestYAMLWritesLongKeysExplicitly(t *testing.T) {
	t.Parallel()
	long, escaped := strings.Repeat("k", 1100), strings.Repeat("&", 200) // 1,202 characters quoted
	doc := obj().set(long, "v").set("list", []any{obj().set(escaped, obj().set("n", 1))})
	var b strings.Builder
	writeYAML(&b, doc, "")
	var got any
	if err := yaml.Unmarshal([]byte(b.String()), &got); err != nil {
		t.Fatalf("invalid YAML: %v\n%s", err, b.String())
	}
	want := map[string]any{long: "v", "list": []any{map[string]any{escaped: map[string]any{"n": 1}}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("YAML reads back differently (-want +got):\n%s", diff)
	}
	if !strings.Contains(b.String(), "? ") {
		t.Errorf("no explicit key in\n%s", b.String())
	}
}
