package outboxgen

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var updateReadme = flag.Bool("update", false, "rewrite the Go blocks of README.md and docs/*.md from the regions they quote")

// quote is the line before each Go block of a page: the file and the
// region it quotes.
var quote = regexp.MustCompile(`^<!-- quotes (\S+) region (\S+) -->$`)

// TestDocsQuoteCompiledCode keeps the Go blocks of README.md and of
// the pages in docs/ compiling: each one is preceded by a "<!-- quotes FILE region NAME -->" line and
// must equal that region of FILE (the lines between "// readme:begin NAME"
// and "// readme:end", blank lines at either end trimmed, indented with
// four spaces a tab, as the pages are). The files are Go files that make
// test and make verify compile. go test . -update rewrites the blocks.
func TestDocsQuoteCompiledCode(t *testing.T) {
	t.Parallel()
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := 0
	for _, page := range append([]string{"README.md"}, pages...) {
		blocks += checkQuotes(t, page)
	}
	if blocks == 0 {
		t.Fatal("no Go block in README.md nor docs/")
	}
}

// checkQuotes checks (or with -update rewrites) the Go blocks of page and
// returns their number. Paths in the quote lines are relative to the
// module's root.
func checkQuotes(t *testing.T, page string) int {
	t.Helper()
	text, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(text), "\n")
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
			t.Fatalf("%s:%d: the Go block never ends", page, i+1)
		}
		got := lines[i+1 : end]
		var m []string
		if i > 0 {
			m = quote.FindStringSubmatch(lines[i-1])
		}
		if m == nil {
			t.Errorf("%s:%d: a Go block without a <!-- quotes FILE region NAME --> line before it", page, i+1)
			out = append(out, got...)
		} else if want, err := region(m[1], m[2]); err != nil {
			t.Errorf("%s:%d: %v", page, i+1, err)
			out = append(out, got...)
		} else {
			if diff := cmp.Diff(want, got); diff != "" && !*updateReadme {
				t.Errorf("%s:%d: the block differs from %s region %s (-region +page; go test . -update rewrites it):\n%s", page, i+1, m[1], m[2], diff)
			}
			out = append(out, want...)
		}
		i = end - 1
	}
	if *updateReadme {
		if err := os.WriteFile(page, []byte(strings.Join(out, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return blocks
}

// region returns the region name of the Go file path as the pages show
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

// firstScreen is how many lines of README.md a newcomer reads before
// scrolling: the commands to run and test the project must be there.
const firstScreen = 40

// TestReadmeFirstScreenGivesTheRunAndTestCommands keeps the two commands
// a newcomer needs, make demo and make test, in a shell block within the
// README's first screen, beside what they need (PostgreSQL), and keeps
// CI running the same test command the README gives.
func TestReadmeFirstScreenGivesTheRunAndTestCommands(t *testing.T) {
	t.Parallel()
	text, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(text), "\n")
	if len(lines) > firstScreen {
		lines = lines[:firstScreen]
	}
	var commands []string
	inShell, needs := false, false
	for _, l := range lines {
		switch {
		case l == "```sh":
			inShell = true
		case l == "```":
			inShell = false
		case inShell:
			if cmd, _, _ := strings.Cut(l, "#"); strings.TrimSpace(cmd) != "" {
				commands = append(commands, strings.TrimSpace(cmd))
			}
		case strings.Contains(l, "PostgreSQL"):
			needs = true
		}
	}
	if diff := cmp.Diff([]string{"make demo", "make test"}, commands); diff != "" {
		t.Errorf("the shell commands in README.md's first %d lines (-want +got):\n%s", firstScreen, diff)
	}
	if !needs {
		t.Errorf("README.md's first %d lines do not say that the commands need PostgreSQL", firstScreen)
	}
	ci, err := os.ReadFile(".ci/run")
	if err != nil {
		t.Fatal(err)
	}
	// A line that runs make test, itself or as a timed step.
	if !regexp.MustCompile(`(?m)^\s*(step [a-z-]+ )?make test$`).Match(ci) {
		t.Error(".ci/run does not run make test, the test command README.md gives")
	}
}
