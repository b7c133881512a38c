package browser_test

import (
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// The strings the XSS tests plant in user data: each runs script, or
// sets window.__xss, when a page renders it unescaped or follows it.
const (
	xssScript = `<script>window.__xss=1</script>`
	xssImg    = `"><img src=x onerror="window.__xss=1">`
	xssURL    = `javascript:window.__xss=1`
)

// injectionProbe evaluates, in a page, to the signs that planted markup
// ran or reached the DOM as markup: window.__xss set, an img[src=x], a
// script element naming __xss, an event handler attribute naming __xss,
// a link or form whose URL is javascript:. An empty list means none.
const injectionProbe = `(() => {
	const found = [];
	const cut = (el) => el.outerHTML.slice(0, 300);
	if (typeof window.__xss !== 'undefined') found.push('window.__xss is ' + String(window.__xss));
	for (const img of document.querySelectorAll('img')) {
		if (img.getAttribute('src') === 'x') found.push('img[src=x]: ' + cut(img));
	}
	for (const s of document.querySelectorAll('script')) {
		if (s.textContent.includes('__xss') || (s.getAttribute('src') || '').includes('__xss')) found.push('script: ' + cut(s));
	}
	for (const el of document.querySelectorAll('*')) {
		for (const a of el.attributes) {
			if (a.name.startsWith('on') && a.value.includes('__xss')) found.push(a.name + ' handler: ' + cut(el));
		}
	}
	for (const a of document.querySelectorAll('a[href], area[href]')) {
		if (a.protocol === 'javascript:') found.push('javascript: link: ' + cut(a));
	}
	for (const el of document.querySelectorAll('[src], [action], [formaction], [data]')) {
		for (const n of ['src', 'action', 'formaction', 'data']) {
			const v = el.getAttribute(n);
			if (v !== null && /^[\s\x00-\x1f]*javascript:/i.test(v)) found.push('javascript: ' + n + ': ' + cut(el));
		}
	}
	return found;
})()`

// injections returns the signs of injected markup on p's current page.
func (p *page) injections() []string {
	p.t.Helper()
	return eval[[]string](p, injectionProbe)
}

// requireNoInjection fails the test when the current page shows a sign of
// injected markup; where names the page.
func (p *page) requireNoInjection(where string) {
	p.t.Helper()
	if found := p.injections(); len(found) > 0 {
		p.t.Errorf("%s (%s): planted markup reached the DOM or ran:\n\t%s", where, p.location(), strings.Join(found, "\n\t"))
	}
}

// inlineProbe adds an inline event handler and an inline script to the
// page, as an injection that got past the escaping would, and evaluates
// to whether either ran and which Content-Security-Policy directives
// they violated.
const inlineProbe = `new Promise(resolve => {
	const violated = [];
	const done = () => resolve({ran: typeof window.__inline !== 'undefined', violated: violated});
	document.addEventListener('securitypolicyviolation', e => {
		violated.push(e.violatedDirective);
		if (violated.length === 2) done();
	});
	document.body.insertAdjacentHTML('beforeend', '<img id="inline-probe" src="x" onerror="window.__inline=1">');
	const s = document.createElement('script');
	s.textContent = 'window.__inline = 2';
	document.body.appendChild(s);
	if (typeof window.__inline !== 'undefined') done(); // the script ran at once
	setTimeout(done, 3000);
})`

// inlineScript is what inlineProbe found.
type inlineScript struct {
	Ran      bool     `json:"ran"`
	Violated []string `json:"violated"`
}

// tryInlineScript runs inlineProbe on the current page. It leaves an
// img[src=x] in the page: run it last on a page.
func (p *page) tryInlineScript() inlineScript {
	p.t.Helper()
	return eval[inlineScript](p, inlineProbe, chromedp.EvalAwaitPromise)
}

// TestInjectionProbe checks the browser harness: Chromium starts, loads a
// page and takes a screenshot, and the probe the XSS tests rely on finds
// each planted string on a page that renders it raw, and nothing on one
// that escapes it.
func TestInjectionProbe(t *testing.T) {
	chromiumPath(t)
	t.Parallel()
	planted := []string{xssScript, xssImg, xssURL}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		var b strings.Builder
		b.WriteString("<!doctype html><title>probe</title><body><h1>probe</h1>")
		for _, s := range planted {
			if r.URL.Path == "/raw" {
				fmt.Fprintf(&b, `<p><a href="%s">%s</a></p><div title="%s">x</div>`, s, s, s)
			} else {
				fmt.Fprintf(&b, `<p><a href="/next?v=%s">%s</a></p><div title="%s">x</div>`,
					html.EscapeString(s), html.EscapeString(s), html.EscapeString(s))
			}
		}
		b.WriteString("</body>")
		_, _ = w.Write([]byte(b.String()))
	}))
	t.Cleanup(srv.Close)

	p := newPage(t, srv.URL)
	p.open("/escaped")
	p.shot("01-escaped.png")
	if got := p.text("h1"); got != "probe" {
		t.Errorf("h1 = %q, want probe", got)
	}
	if found := p.injections(); len(found) > 0 {
		t.Errorf("escaped page: the probe found injections:\n\t%s", strings.Join(found, "\n\t"))
	}
	body := p.text("body")
	for _, s := range planted {
		if !strings.Contains(body, s) {
			t.Errorf("escaped page does not show %q as text; body:\n%s", s, body)
		}
	}

	// Without a Content-Security-Policy, inline script runs.
	if got := p.tryInlineScript(); !got.Ran || len(got.Violated) > 0 {
		t.Errorf("page without a Content-Security-Policy: inline script ran %v, violated %q; want it to run", got.Ran, got.Violated)
	}

	p.open("/raw")
	p.shot("02-raw.png")
	found := p.injections()
	for _, want := range []string{"window.__xss is 1", "img[src=x]", "script: <script>window.__xss=1</script>", "onerror handler", "javascript: link"} {
		if !strings.Contains(strings.Join(found, "\n"), want) {
			t.Errorf("raw page: the probe missed %q; it found:\n\t%s", want, strings.Join(found, "\n\t"))
		}
	}
}
