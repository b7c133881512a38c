package main

import "testing"

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
