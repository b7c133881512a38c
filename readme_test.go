package outboxgen

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var updateReadme = flag.Bool("update", false, "rewrite README.md's Go blocks from the regions they quote")

// quote is the line before each Go block of the README: the file and the
// region it quotes.
var quote = regexp.MustCompile(`^<!-- quotes (\S+) region (\S+) -->$`)

// TestReadmeQuotesCompiledCode keeps the README's Go blocks compiling:
// each one is preceded by a "<!-- quotes FILE region NAME -->" line and
// must equal that region of FILE (the lines between "// readme:begin NAME"
// and "// readme:end", blank lines at either end trimmed, indented with
// four spaces a tab, as the README is). The files are Go files that make
// test and make verify compile. go test . -update rewrites the blocks.
func TestReadmeQuotesCompiledCode(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(readme), "\n")
	var out []string
	blocks := 0
	for i := 0; i < len(lines); i++ {
		out = append(out, lines[i])
		if lines[i] != "```go" {
			continue
		}
		blocks++
		end := i + 1
		for end < len(lines) && lines[end] != "```" {
			end++
		}
		if end == len(lines) {
			t.Fatalf("README.md:%d: the Go block never ends", i+1)
		}
		got := lines[i+1 : end]
		var m []string
		if i > 0 {
			m = quote.FindStringSubmatch(lines[i-1])
		}
		if m == nil {
			t.Errorf("README.md:%d: a Go block without a <!-- quotes FILE region NAME --> line before it", i+1)
			out = append(out, got...)
		} else if want, err := region(m[1], m[2]); err != nil {
			t.Errorf("README.md:%d: %v", i+1, err)
			out = append(out, got...)
		} else {
			if diff := cmp.Diff(want, got); diff != "" && !*updateReadme {
				t.Errorf("README.md:%d: the block differs from %s region %s (-region +README; go test . -update rewrites it):\n%s", i+1, m[1], m[2], diff)
			}
			out = append(out, want...)
		}
		i = end - 1
	}
	if blocks == 0 {
		t.Fatal("README.md has no Go block")
	}
	if *updateReadme {
		if err := os.WriteFile("README.md", []byte(strings.Join(out, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// region returns the region name of the Go file path as the README shows
// it.
func region(path, name string) ([]string, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	begin := []byte("// readme:begin " + name + "\n")
	at := bytes.Index(src, begin)
	if at < 0 {
		return nil, fmt.Errorf("%s has no region %s", path, name)
	}
	body := src[at+len(begin):]
	stop := bytes.Index(body, []byte("// readme:end\n"))
	if stop < 0 {
		return nil, fmt.Errorf("%s: region %s never ends", path, name)
	}
	lines := strings.Split(string(body[:stop]), "\n")
	for i := range lines {
		lines[i] = strings.TrimRight(lines[i], " \t")
	}
	for len(lines) > 0 && lines[0] == "" {
		lines = lines[1:]
	}
	for len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) == 0 {
		return nil, fmt.Errorf("%s: region %s is empty", path, name)
	}
	indent := -1
	for _, l := range lines {
		if l == "" {
			continue
		}
		if n := len(l) - len(strings.TrimLeft(l, "\t")); indent < 0 || n < indent {
			indent = n
		}
	}
	for i, l := range lines {
		if l == "" {
			continue
		}
		l = l[indent:]
		tabs := len(l) - len(strings.TrimLeft(l, "\t"))
		lines[i] = strings.Repeat("    ", tabs) + l[tabs:]
	}
	return lines, nil
}
