// Command testreport runs go test in one or more module directories at
// once, prints what go test prints (each package's result line, and the
// output of the tests that fail), and ends with the slowest tests and
// their times, so that a test that makes the suite slow is seen the day
// it lands. make test runs it.
//
//	go run ./internal/testreport [-dir DIR[=PKG,...]]... [-slowest N] [-json FILE] [-v] -- GO-TEST-FLAGS...
//
// Each -dir (default ".") is a module whose go test runs with
// GO-TEST-FLAGS and -json on its packages: those listed after "=", in
// that order, else ./... (go test starts packages in the order it is
// given them, so the slowest listed first end soonest). The modules' go
// tests run concurrently, and each
// package's report is printed whole when it ends, so that concurrent
// packages never interleave. -json FILE also writes every event of every
// module to FILE; -v prints every line of output as it comes, as go
// test -v does. The exit status is 1 when any go test fails.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// dirs is the repeatable -dir flag.
type dirs []string

func (d *dirs) String() string     { return strings.Join(*d, ",") }
func (d *dirs) Set(v string) error { *d = append(*d, v); return nil }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("testreport", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var modules dirs
	fs.Var(&modules, "dir", "a module directory whose tests run, and =PKG,... its packages in order (repeatable; default .)")
	slowest := fs.Int("slowest", 10, "how many of the slowest tests to list at the end")
	jsonPath := fs.String("json", "", "also write go test's JSON events to this file")
	verbose := fs.Bool("v", false, "print every line of output as it comes")
	goCmd := fs.String("go", "go", "the go command")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *slowest < 0 {
		fmt.Fprintln(stderr, "testreport: -slowest must not be negative")
		return 2
	}
	if len(modules) == 0 {
		modules = dirs{"."}
	}

	out := &printer{w: stdout, verbose: *verbose}
	if *jsonPath != "" {
		f, err := os.Create(*jsonPath)
		if err != nil {
			fmt.Fprintf(stderr, "testreport: %v\n", err)
			return 2
		}
		defer f.Close()
		out.raw = f
	}

	// The modules' go commands write their errors at once.
	stderr = &lockedWriter{w: stderr}
	start := time.Now()
	results := make([]error, len(modules))
	moduleDirs := make([]string, len(modules))
	var wg sync.WaitGroup
	for i, m := range modules {
		dir, pkgs, ok := strings.Cut(m, "=")
		moduleDirs[i] = dir
		args := append([]string(nil), fs.Args()...)
		if ok {
			args = append(args, strings.Split(pkgs, ",")...)
		} else {
			args = append(args, "./...")
		}
		wg.Go(func() {
			results[i] = runModule(*goCmd, dir, args, out, stderr)
		})
	}
	wg.Wait()

	code := 0
	for i, err := range results {
		if err != nil {
			fmt.Fprintf(stdout, "FAIL: go test in %s: %v\n", moduleDirs[i], err)
			code = 1
		}
	}
	out.summary(*slowest, time.Since(start))
	return code
}

// runModule runs go test -json with args in dir and feeds its events to
// out. It returns an error when go test fails.
func runModule(goCmd, dir string, args []string, out *printer, stderr io.Writer) error {
	cmd := exec.Command(goCmd, append([]string{"test", "-json"}, args...)...)
	cmd.Dir = dir
	cmd.Stderr = stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	sc := bufio.NewScanner(pipe)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		out.line(dir, sc.Bytes())
	}
	scanErr := sc.Err()
	if scanErr != nil {
		// Keep go test from blocking on a pipe nobody reads.
		_, _ = io.Copy(io.Discard, pipe)
	}
	err = cmd.Wait()
	out.flushModule(dir)
	return errors.Join(err, scanErr)
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// event is one of go test -json's events (cmd/test2json).
type event struct {
	Time       time.Time
	Action     string
	Package    string
	ImportPath string
	Test       string
	Elapsed    float64
	Output     string
}

// pkgState is what has been seen of one package's run.
type pkgState struct {
	module string
	// lines is the package's report so far: its own output and the
	// output of its failed tests, in order.
	lines []string
	// tests holds each running test's output until it ends.
	tests map[string][]string
}

// timing is one finished top-level test.
type timing struct {
	pkg, test string
	elapsed   float64
	failed    bool
}

// printer turns events into go test's plain output.
type printer struct {
	mu      sync.Mutex
	w       io.Writer
	raw     io.Writer
	verbose bool
	pkgs    map[string]*pkgState
	timings []timing
}

func (p *printer) line(module string, b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.raw != nil {
		_, _ = p.raw.Write(append(append([]byte(nil), b...), '\n'))
	}
	var e event
	if err := json.Unmarshal(b, &e); err != nil || e.Action == "" {
		// Not an event: go test printed it itself.
		fmt.Fprintln(p.w, string(b))
		return
	}
	if p.verbose && e.Output != "" {
		fmt.Fprint(p.w, e.Output)
	}
	switch e.Action {
	case "build-output":
		if !p.verbose {
			fmt.Fprint(p.w, e.Output)
		}
		return
	case "build-fail", "start":
		return
	}
	if e.Package == "" {
		return
	}
	if p.pkgs == nil {
		p.pkgs = map[string]*pkgState{}
	}
	st := p.pkgs[e.Package]
	if st == nil {
		st = &pkgState{module: module, tests: map[string][]string{}}
		p.pkgs[e.Package] = st
	}
	if e.Test != "" {
		p.testEvent(e, st)
		return
	}
	switch e.Action {
	case "output":
		if e.Output != "PASS\n" {
			st.lines = append(st.lines, e.Output)
		}
	case "pass", "fail", "skip":
		p.flush(e.Package, st)
	}
}

func (p *printer) testEvent(e event, st *pkgState) {
	switch e.Action {
	case "output":
		// go test without -v prints no progress lines.
		if !strings.HasPrefix(e.Output, "=== ") {
			st.tests[e.Test] = append(st.tests[e.Test], e.Output)
		}
	case "pass", "fail", "skip":
		if e.Action == "fail" {
			st.lines = append(st.lines, st.tests[e.Test]...)
		}
		delete(st.tests, e.Test)
		if e.Action != "skip" && !strings.Contains(e.Test, "/") {
			p.timings = append(p.timings, timing{pkg: e.Package, test: e.Test, elapsed: e.Elapsed, failed: e.Action == "fail"})
		}
	}
}

// flush prints a package's report once it has ended.
func (p *printer) flush(pkg string, st *pkgState) {
	if !p.verbose {
		// Tests still running when the package ended (a panic, a
		// timeout) tell what happened.
		names := make([]string, 0, len(st.tests))
		for name := range st.tests {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			fmt.Fprint(p.w, strings.Join(st.tests[name], ""))
		}
		fmt.Fprint(p.w, strings.Join(st.lines, ""))
	}
	delete(p.pkgs, pkg)
}

// flushModule prints what is left of a module's packages when its go test
// has ended without ending them (killed, or a broken stream).
func (p *printer) flushModule(module string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pkg, st := range p.pkgs {
		if st.module == module {
			p.flush(pkg, st)
		}
	}
}

// summary prints the n slowest tests and the total time.
func (p *printer) summary(n int, total time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sort.SliceStable(p.timings, func(i, j int) bool { return p.timings[i].elapsed > p.timings[j].elapsed })
	if n > len(p.timings) {
		n = len(p.timings)
	}
	if n > 0 {
		fmt.Fprintf(p.w, "\nThe %d slowest tests:\n", n)
		for _, t := range p.timings[:n] {
			mark := ""
			if t.failed {
				mark = "  (failed)"
			}
			fmt.Fprintf(p.w, "%8.2fs  %s  %s%s\n", t.elapsed, shortPkg(t.pkg), t.test, mark)
		}
	}
	fmt.Fprintf(p.w, "%d tests in %s\n", len(p.timings), total.Round(100*time.Millisecond))
}

// shortPkg drops the module path's host and owner, which every package of
// the repository shares.
func shortPkg(pkg string) string {
	const prefix = "github.com/outboxgen/outboxgen"
	if rest, ok := strings.CutPrefix(pkg, prefix+"/"); ok {
		return rest
	}
	if pkg == prefix {
		return "."
	}
	return filepath.ToSlash(pkg)
}
