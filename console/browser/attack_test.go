package browser_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"html"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/outboxgen/outboxgen/console"
	"github.com/outboxgen/outboxgen/outbox"
	"github.com/outboxgen/outboxgen/outbox/outboxtest"
)

// lockedBuffer is a log the console writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// attackScene is an outbox holding dead letters of a secret payload, and
// a console with actions on it, logging to log.
type attackScene struct {
	f    *outboxtest.Fixture
	srv  *httptest.Server
	port string
	log  *lockedBuffer
	dead []outbox.DeadLetter
}

// secretPayload is what the dead letters hold: a page that shows it has
// been read.
const secretPayload = `{"card":"4111-secret"}`

func newAttackScene(t *testing.T, allowed ...string) *attackScene {
	t.Helper()
	f := newOutbox(t)
	for range 2 {
		publish(t, f, jsonBytes{}, "orders", []byte(secretPayload), nil)
	}
	subscribe(t, f.Outbox, []string{"orders"}, &consumer{verdict: func(*outbox.Message[[]byte]) error {
		return outbox.Reject(errors.New("unknown customer"))
	}})
	waitDeadLetters(t, f.Outbox, 2)
	s := &attackScene{f: f, log: &lockedBuffer{}, dead: deadLetters(t, f.Outbox, outbox.DeadLetterFilter{})}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the console's log:\n%s", s.log.String())
		}
	})
	h, err := console.New(console.Config{Pool: f.Pool, Actions: true, AllowedHosts: allowed,
		Logger: slog.New(slog.NewJSONHandler(s.log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	s.srv = httptest.NewServer(h)
	t.Cleanup(s.srv.Close)
	u, err := url.Parse(s.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	s.port = u.Port()
	return s
}

// requireUntouched fails the test unless the dead letters are all still
// there.
func (s *attackScene) requireUntouched(t *testing.T) {
	t.Helper()
	if n := countDeadLetters(t, s.f.Outbox, outbox.DeadLetterFilter{}); n != int64(len(s.dead)) {
		t.Errorf("%d dead letters left, want the %d there were", n, len(s.dead))
	}
}

// requireRefusalLogged fails the test unless the console logged a
// refusal for reason.
func (s *attackScene) requireRefusalLogged(t *testing.T, reason string) {
	t.Helper()
	if log := s.log.String(); !strings.Contains(log, `"msg":"console request refused"`) || !strings.Contains(log, `"reason":"`+reason+`"`) {
		t.Errorf("the console logged no refusal for %s:\n%s", reason, log)
	}
}

// A page whose name the attacker's DNS pointed at 127.0.0.1 once the
// page had loaded (DNS rebinding) is, in the browser's eyes, the origin
// http://rebind.test:PORT, the console's port: its script's requests to
// the console are same-origin, carry Origin and Sec-Fetch-Site as the
// console's own pages' would, and it can read the answers. Chromium maps
// rebind.test to 127.0.0.1, and the attacker's script runs in the tab
// once it shows that origin. The console answers none of it: not the
// page, not a dead letter's payload, not a delete.
func TestARebindingPageCannotReadOrAct(t *testing.T) {
	chromiumPath(t)
	t.Parallel()
	s := newAttackScene(t)
	base := "http://rebind.test:" + s.port
	p := newPage(t, base, chromedp.Flag("host-resolver-rules", "MAP rebind.test 127.0.0.1"))
	dead := outboxPath(s.f) + "/dead"

	if status := p.openStatus("/"); status != http.StatusMisdirectedRequest {
		t.Errorf("GET %s/: status %d, want 421", base, status)
	}
	if got := p.text("body"); !strings.Contains(got, "answers only to loopback host names") {
		t.Errorf("the refusal does not say which hosts the console answers: %q", got)
	}
	p.shot("01-rebound-name-refused.png")

	type attack struct {
		ReadStatus   int  `json:"readStatus"`
		ReadPayload  bool `json:"readPayload"`
		ListStatus   int  `json:"listStatus"`
		Token        bool `json:"token"`
		DeleteStatus int  `json:"deleteStatus"`
	}
	script := fmt.Sprintf(`(async () => {
		const out = {};
		const one = await fetch(%[1]s + '/' + %[2]s);
		out.readStatus = one.status;
		out.readPayload = (await one.text()).includes('4111-secret');
		const list = await fetch(%[1]s);
		out.listStatus = list.status;
		const m = (await list.text()).match(/name="csrf" value="([^"]+)"/);
		out.token = m !== null;
		const del = await fetch(%[1]s + '/delete', {method: 'POST', redirect: 'manual',
			body: new URLSearchParams({scope: 'filter', step: 'confirm', csrf: m ? m[1] : 'x'.repeat(43)})});
		out.deleteStatus = del.status;
		return out;
	})()`, jsString(dead), jsString(fmt.Sprint(s.dead[0].ID)))
	got := eval[attack](p, script, chromedp.EvalAwaitPromise)
	want := attack{ReadStatus: 421, ListStatus: 421, DeleteStatus: 421}
	if got != want {
		t.Errorf("the rebinding page's script got %+v, want %+v", got, want)
	}
	s.requireUntouched(t)
	s.requireRefusalLogged(t, "host")

	// The same console, opened at its loopback address, answers.
	p.base = s.srv.URL
	p.open(dead + "/" + fmt.Sprint(s.dead[0].ID))
	if got := p.text("pre#payload"); !strings.Contains(got, "4111-secret") {
		t.Errorf("the console at %s does not show the payload: %q", s.srv.URL, got)
	}
}

// A page on another port of the console's name shares its cookies
// (cookies do not keep to a port): it plants a token of its own, then
// submits an action's form with it, from an ordinary page (its Origin is
// its own) and from a sandboxed one (Origin: null; over plain HTTP to a
// name that is not loopback Chromium sends no Sec-Fetch-Site). The
// console, reached as console.test (an allowed name, mapped to
// 127.0.0.1), refuses both, and deletes nothing.
func TestAPageOnAnotherPortCannotAct(t *testing.T) {
	chromiumPath(t)
	t.Parallel()
	s := newAttackScene(t, "console.test")
	consoleURL := "http://console.test:" + s.port
	p := newPage(t, consoleURL, chromedp.Flag("host-resolver-rules", "MAP console.test 127.0.0.1"))
	dead := outboxPath(s.f) + "/dead"

	// The operator has the console open: the browser holds its cookie.
	p.open(dead)

	planted := strings.Repeat("A", 43)
	form := fmt.Sprintf(`<!doctype html><title>cats</title>
<form method="post" action="%s">
<input type="hidden" name="scope" value="filter"><input type="hidden" name="step" value="confirm">
<input type="hidden" name="csrf" value="%s"><button id="go" type="submit">See the cats</button>
</form>`, html.EscapeString(consoleURL+dead+"/delete"), planted)
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "outboxgen_console_csrf", Value: planted, Path: "/"})
		if r.URL.Path == "/sandboxed" {
			w.Header().Set("Content-Security-Policy", "sandbox allow-forms allow-scripts")
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(form))
	}))
	t.Cleanup(evil.Close)
	evilURL, err := url.Parse(evil.URL)
	if err != nil {
		t.Fatal(err)
	}
	evilBase := "http://console.test:" + evilURL.Port()

	for _, page := range []string{"/plain", "/sandboxed"} {
		p.base = evilBase
		p.open(page)
		ctx, cancel := context.WithTimeout(p.ctx, stepTimeout)
		resp, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS("button#go")))
		cancel()
		if err != nil {
			t.Fatalf("%s: submitting the form: %v", page, err)
		}
		if resp.Status != http.StatusForbidden {
			t.Errorf("%s: the console answered the planted form with %d, want 403", page, resp.Status)
		}
		p.shot("refused" + strings.ReplaceAll(page, "/", "-") + ".png")
	}
	s.requireUntouched(t)
	s.requireRefusalLogged(t, "origin")

	// The operator's own page still acts: it gets a token of the console's
	// in place of the planted cookie.
	p.base = consoleURL
	p.open(dead)
	p.follow("deleting a dead letter from the console's page", chromedp.Click(chromedp.CSS("button#delete-filter")))
	p.follow("dry run", chromedp.Click(chromedp.CSS("button#dry-run")))
	p.follow("confirm", chromedp.Click(chromedp.CSS("button#confirm")))
	if n := countDeadLetters(t, s.f.Outbox, outbox.DeadLetterFilter{}); n != 0 {
		t.Errorf("after the operator's delete %d dead letters, want 0", n)
	}
}
