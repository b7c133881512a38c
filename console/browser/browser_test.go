package browser_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Environment variables the browser tests read.
const (
	// envChromium names the Chromium binary; default chromiumDefault.
	envChromium = "CHROMIUM"
	// envRequire turns a missing Chromium into a failure (CI).
	envRequire = "OUTBOX_REQUIRE_BROWSER"
	// envScreenshots is the directory the screenshots go to; default a
	// temporary directory of the test.
	envScreenshots = "CONSOLE_SCREENSHOTS"
)

// chromiumDefault is where Debian's package chromium installs the browser.
const chromiumDefault = "/usr/bin/chromium"

// Timeouts bounding each browser step, so that a hung browser fails the
// test instead of hanging it. A step is a page load at most, which takes
// over 30 s only on a machine whose every core is busy.
const (
	startTimeout = time.Minute
	stepTimeout  = time.Minute
	closeTimeout = 10 * time.Second
)

// chromiumPath returns the Chromium binary, or skips t when there is none
// (fails it when $OUTBOX_REQUIRE_BROWSER is set).
func chromiumPath(t *testing.T) string {
	t.Helper()
	path, from := os.Getenv(envChromium), "$"+envChromium
	if path == "" {
		path, from = chromiumDefault, chromiumDefault
	}
	if _, err := os.Stat(path); err != nil {
		msg := fmt.Sprintf("no Chromium at %s (%v): install the Debian package chromium "+
			"(apt-get install chromium) or set $%s to a Chromium binary", from, err, envChromium)
		if os.Getenv(envRequire) != "" {
			t.Fatalf("%s; $%s is set, so the browser tests must run", msg, envRequire)
		}
		t.Skip(msg)
	}
	return path
}

// page is a Chromium tab of a test: a headless browser of its own, closed
// when the test ends. Every method bounds what it does with stepTimeout
// and fails the test on an error.
type page struct {
	t    *testing.T
	ctx  context.Context
	base string // the server's URL, without a trailing slash
	dir  string // where screenshots go
}

// newPage starts Chromium in a fresh profile with a 1280x900 window and
// returns its tab, on the server at base; opts are more of Chromium's
// options.
func newPage(t *testing.T, base string, opts ...chromedp.ExecAllocatorOption) *page {
	t.Helper()
	path := chromiumPath(t)
	logs := &lineLog{t: t, prefix: "chromium: "}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append([]chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		// The machine's network may be closed: without these the browser
		// waits on connections of its own.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
		chromedp.CombinedOutput(logs),
	}, opts...)...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	// Cleanups run last first: the browser stops (and its profile
	// directory is left alone) before t.TempDir is removed, and the log
	// stops before the test ends.
	t.Cleanup(logs.stop)
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(ctx, closeTimeout)
		defer ccancel()
		_ = chromedp.Cancel(cctx)
		cancel()
		cancelAlloc() // kills the browser if it is still there, and waits
	})

	// The first action starts the browser and binds its life to the
	// context it runs with, so it runs without a deadline and is bounded
	// here: on timeout the allocator's cancellation kills the browser.
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(ctx) }()
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("starting %s: %v", path, err)
		}
	case <-time.After(startTimeout):
		cancelAlloc()
		t.Fatalf("starting %s: no answer within %v", path, startTimeout)
	}
	p := &page{t: t, ctx: ctx, base: strings.TrimSuffix(base, "/"), dir: screenshotDir(t)}
	p.logConsole()
	// Headless, the window's frame takes part of its height: the page
	// gets all of it.
	p.do("sizing the viewport", chromedp.EmulateViewport(1280, 900))
	return p
}

// logConsole logs the tab's console messages and uncaught exceptions
// (Content-Security-Policy reports among them) to the test's log.
func (p *page) logConsole() {
	ctx, cancel := context.WithCancel(p.ctx)
	done := make(chan struct{})
	msgs := chromedp.Console(ctx)
	go func() {
		defer close(done)
		for m, err := range msgs {
			if err != nil {
				return
			}
			p.t.Logf("browser console: %s", m)
		}
	}()
	p.t.Cleanup(func() { cancel(); <-done })
}

// screenshotDir is $CONSOLE_SCREENSHOTS/<test name>, or a temporary
// directory of the test.
func screenshotDir(t *testing.T) string {
	t.Helper()
	root := os.Getenv(envScreenshots)
	if root == "" {
		return t.TempDir()
	}
	dir := filepath.Join(root, regexp.MustCompile(`[^A-Za-z0-9_.-]+`).ReplaceAllString(t.Name(), "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("screenshots: %v", err)
	}
	return dir
}

// do runs actions on the tab within stepTimeout; what names them in the
// failure.
func (p *page) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, stepTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.t.Fatalf("%s: %v (at %s)", what, err, p.location())
	}
}

// run runs one action returning a value on p's tab within stepTimeout.
func run[T any](p *page, what string, a chromedp.Action[T]) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, stepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		p.t.Fatalf("%s: %v (at %s)", what, err, p.location())
	}
	return v
}

// eval evaluates a JavaScript expression in the tab.
func eval[T any](p *page, expr string, opts ...chromedp.EvaluateOption) T {
	p.t.Helper()
	return run(p, "evaluating "+expr, chromedp.Evaluate[T](expr, opts...))
}

// location is the tab's URL, for failure messages; it does not fail.
func (p *page) location() string {
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	defer cancel()
	loc, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil {
		return "unknown URL: " + err.Error()
	}
	return loc
}

// open navigates to path on the server and fails unless it answers 200.
func (p *page) open(path string) {
	p.t.Helper()
	if status := p.openStatus(path); status != 200 {
		p.t.Fatalf("opening %s: status %d", path, status)
	}
}

// openStatus navigates to path on the server and returns the status of
// the answer.
func (p *page) openStatus(path string) int {
	p.t.Helper()
	return int(run(p, "opening "+path, chromedp.NavigateResponse(p.base+path)).Status)
}

// follow runs actions that navigate (a click on a link or a submit
// button), waits for the new page and fails unless it answers 200.
func (p *page) follow(what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	if err := p.tryFollow(actions...); err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
}

// tryFollow is follow returning its error.
func (p *page) tryFollow(actions ...chromedp.Action[chromedp.Void]) error {
	return p.tryFollowWithin(stepTimeout, actions...)
}

// tryFollowWithin is tryFollow with a timeout of its own.
func (p *page) tryFollowWithin(timeout time.Duration, actions ...chromedp.Action[chromedp.Void]) error {
	ctx, cancel := context.WithTimeout(p.ctx, timeout)
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, actions...)
	if err != nil {
		return fmt.Errorf("%w (at %s)", err, p.location())
	}
	if resp.Status != 200 {
		return fmt.Errorf("status %d %s at %s", resp.Status, resp.StatusText, resp.URL)
	}
	return nil
}

// click clicks the element sel selects and waits for the page it leads
// to. A live page may replace the element between its lookup and the
// click: the node is gone then, or the click lands on the detached node
// and leads nowhere (no page comes within a third of stepTimeout, and
// the tab is where it was). The click is tried again, up to three times.
// When no response came but the tab moved on, the click led there.
func (p *page) click(sel string) {
	p.t.Helper()
	for try := 1; ; try++ {
		before := p.location()
		err := p.tryFollowWithin(stepTimeout/3, chromedp.Click(chromedp.CSS(sel)))
		if err == nil {
			return
		}
		lost := errors.Is(err, context.DeadlineExceeded)
		if lost && p.location() != before {
			return
		}
		if try == 3 || !(lost || strings.Contains(err.Error(), "Could not find node with given id")) {
			p.t.Fatalf("clicking %s: %v", sel, err)
		}
	}
}

// has reports whether the current page has an element sel selects; it
// does not wait.
func (p *page) has(sel string) bool {
	p.t.Helper()
	return p.count(sel) > 0
}

// count is how many elements sel selects on the current page; it does
// not wait.
func (p *page) count(sel string) int {
	p.t.Helper()
	return eval[int](p, fmt.Sprintf("document.querySelectorAll(%s).length", jsString(sel)))
}

// text returns the visible text of the first element sel selects, waiting
// for it to be shown. It finds and reads the element in one evaluation: a
// live page replaces its elements, and a node found by one call may be
// gone by the next.
func (p *page) text(sel string) string {
	p.t.Helper()
	expr := fmt.Sprintf(`(() => {
		const e = document.querySelector(%s);
		return e !== null && e.getClientRects().length > 0 ? e.innerText : null;
	})()`, jsString(sel))
	var text *string
	eventually(p.t, "reading "+sel, stepTimeout, func(context.Context) (bool, error) {
		text = eval[*string](p, expr)
		return text != nil, nil
	})
	return *text
}

// attr returns attribute name of the first element sel selects, waiting
// for it; it fails when the attribute is missing.
func (p *page) attr(sel, name string) string {
	p.t.Helper()
	r := run(p, "reading "+sel+"@"+name, chromedp.AttributeValue(chromedp.CSS(sel), name))
	if !r.Exists {
		p.t.Fatalf("%s has no attribute %s (at %s)", sel, name, p.location())
	}
	return r.Value
}

// path is the current page's path and query.
func (p *page) path() string {
	p.t.Helper()
	u, err := url.Parse(p.location())
	if err != nil {
		p.t.Fatal(err)
	}
	return u.RequestURI()
}

// shot saves a full-page PNG screenshot as name in the screenshot
// directory.
func (p *page) shot(name string) {
	p.t.Helper()
	png := run(p, "screenshot "+name, chromedp.FullScreenshot(100))
	file := filepath.Join(p.dir, name)
	if err := os.WriteFile(file, png, 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x2028 || r == 0x2029 || r == '<' || r == '>':
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// browserNoise matches the browser's output lines that say nothing about
// the test: a machine without D-Bus, and Debian's wrapper script
// comparing memory sizes.
var browserNoise = regexp.MustCompile(`dbus/|Failed to connect to the bus|: \[: [0-9]+: unexpected operator`)

// lineLog writes the browser's output to the test log line by line until
// stopped (a test's log must not be written after it ends).
type lineLog struct {
	t      *testing.T
	prefix string
	mu     sync.Mutex
	buf    []byte
	done   bool
}

var _ io.Writer = (*lineLog)(nil)

func (l *lineLog) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return len(b), nil
	}
	l.buf = append(l.buf, b...)
	for {
		i := strings.IndexByte(string(l.buf), '\n')
		if i < 0 {
			break
		}
		if line := string(l.buf[:i]); !browserNoise.MatchString(line) {
			l.t.Log(l.prefix + line)
		}
		l.buf = l.buf[i+1:]
	}
	return len(b), nil
}

func (l *lineLog) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.t.Log(l.prefix + string(l.buf))
	}
	l.done = true
}
