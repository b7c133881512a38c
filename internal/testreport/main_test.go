package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// module writes a module of its own with the given test file into a
// temporary directory and returns the directory.
func module(t *testing.T, name, tests string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"go.mod":          "module example.com/" + name + "\n\ngo 1.26\n",
		name + "_test.go": tests,
	}
	for file, text := range files {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const passing = `package passing

import (
	"testing"
	"time"
)

func TestQuick(t *testing.T) { t.Log("quick-log") }

func TestSlow(t *testing.T) {
	t.Parallel()
	time.Sleep(300 * time.Millisecond)
	t.Log("slow-log")
}
`

const failing = `package failing

import "testing"

func TestFine(t *testing.T) { t.Log("fine-log") }

func TestBroken(t *testing.T) {
	t.Parallel()
	t.Run("part", func(t *testing.T) { t.Error("the part broke") })
}
`

// Two modules at once: the failing test's output is printed, the passing
// tests' is not, each package ends with go test's own result line, the
// slowest tests come last, slowest first, and the run fails.
func TestReportPrintsFailuresAndTheSlowestTests(t *testing.T) {
	t.Parallel()
	pass, fail := module(t, "passing", passing), module(t, "failing", failing)
	raw := filepath.Join(t.TempDir(), "events.json")
	var stdout, stderr bytes.Buffer
	code := run([]string{"-dir", pass, "-dir", fail, "-json", raw, "-slowest", "10", "--", "-count=1"}, &stdout, &stderr)
	out := stdout.String()
	if code != 1 {
		t.Errorf("exit status %d, want 1\n%s%s", code, out, stderr.String())
	}
	for _, want := range []string{"the part broke", "--- FAIL: TestBroken/part", "--- FAIL: TestBroken", "FAIL\texample.com/failing", "ok  \texample.com/passing", "The 4 slowest tests:"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, unwanted := range []string{"quick-log", "slow-log", "fine-log", "=== RUN"} {
		if strings.Contains(out, unwanted) {
			t.Errorf("output has %q of a passing test:\n%s", unwanted, out)
		}
	}
	_, list, _ := strings.Cut(out, "The 4 slowest tests:\n")
	var got []string
	for _, m := range regexp.MustCompile(`(?m)^ +[0-9.]+s  (\S+)  (\S+)(  \(failed\))?$`).FindAllStringSubmatch(list, -1) {
		got = append(got, m[1]+" "+m[2]+m[3])
	}
	// All four top-level tests (of ten asked for), slowest first; the
	// failed one is marked.
	if len(got) != 4 || got[0] != "example.com/passing TestSlow" || !slices.Contains(got, "example.com/failing TestBroken  (failed)") {
		t.Errorf("slowest tests: %q, want all 4, example.com/passing TestSlow first, TestBroken marked failed\n%s", got, out)
	}
	events, err := os.ReadFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(events, []byte(`"Test":"TestQuick"`)) || !bytes.Contains(events, []byte(`"Test":"TestBroken/part"`)) {
		t.Errorf("the -json file lacks the events of both modules:\n%s", events)
	}
}

// A passing run exits 0; -v prints the passing tests' output too.
func TestReportOfAPassingRun(t *testing.T) {
	t.Parallel()
	dir := module(t, "passing", passing)
	for _, verbose := range []bool{false, true} {
		args := []string{"-dir", dir, "-slowest", "1"}
		if verbose {
			args = append(args, "-v")
		}
		var stdout, stderr bytes.Buffer
		code := run(append(args, "--", "-count=1"), &stdout, &stderr)
		if code != 0 {
			t.Fatalf("verbose %v: exit status %d\n%s%s", verbose, code, stdout.String(), stderr.String())
		}
		got := map[string]bool{}
		for _, s := range []string{"quick-log", "slow-log", "ok  \texample.com/passing", "The 1 slowest tests:"} {
			got[s] = strings.Contains(stdout.String(), s)
		}
		want := map[string]bool{"quick-log": verbose, "slow-log": verbose, "ok  \texample.com/passing": true, "The 1 slowest tests:": true}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("verbose %v: what the output holds (-want +got):\n%s\n%s", verbose, diff, stdout.String())
		}
	}
}

// A module that does not build fails the run and says why.
func TestReportOfABuildFailure(t *testing.T) {
	t.Parallel()
	dir := module(t, "broken", "package broken\n\nfunc TestX(t *testing.T) { undefined() }\n")
	var stdout, stderr bytes.Buffer
	code := run([]string{"-dir", dir, "--", "-count=1"}, &stdout, &stderr)
	all := stdout.String() + stderr.String()
	if code != 1 {
		t.Errorf("exit status %d, want 1\n%s", code, all)
	}
	if !strings.Contains(all, "undefined") {
		t.Errorf("the output does not say what failed to build:\n%s", all)
	}
}

func TestReportRefusesBadFlags(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-slowest", "-1"}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "-slowest") {
		t.Errorf("-slowest -1: exit status %d, stderr %q; want 2 and a message naming -slowest", code, stderr.String())
	}
}

// A module's packages listed after "=" run in that order: go test starts
// them as it is given them.
func TestReportRunsTheListedPackagesFirst(t *testing.T) {
	t.Parallel()
	dir := module(t, "ordered", "package ordered\n\nimport \"testing\"\n\nfunc TestA(t *testing.T) {}\n")
	sub := filepath.Join(dir, "zlast")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sub, "z_test.go"), []byte("package zlast\n\nimport \"testing\"\n\nfunc TestZ(t *testing.T) {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	raw := filepath.Join(t.TempDir(), "events.json")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-dir", dir + "=./zlast,./...", "-json", raw, "--", "-count=1", "-p=1"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit status %d\n%s%s", code, stdout.String(), stderr.String())
	}
	events, err := os.ReadFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	var started []string
	for _, m := range regexp.MustCompile(`"Action":"start","Package":"([^"]+)"`).FindAllSubmatch(events, -1) {
		started = append(started, string(m[1]))
	}
	if diff := cmp.Diff([]string{"example.com/ordered/zlast", "example.com/ordered"}, started); diff != "" {
		t.Errorf("packages started (-want +got):\n%s", diff)
	}
}
