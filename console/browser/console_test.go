package browser_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/console"
	"github.com/outboxgen/outboxgen/outbox"
	"github.com/outboxgen/outboxgen/outbox/outboxtest"
)

// serveConsole serves the console on f's pool until the test ends.
func serveConsole(t *testing.T, f *outboxtest.Fixture, actions bool) *httptest.Server {
	t.Helper()
	h, err := console.New(console.Config{Pool: f.Pool, Actions: actions, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// outboxPath is the console's path of f's outbox, without a trailing slash.
func outboxPath(f *outboxtest.Fixture) string {
	return "/o/" + url.PathEscape(f.Schema) + "/" + url.PathEscape(f.Outbox.Table())
}

// cssString quotes s for a CSS attribute selector.
func cssString(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\a `).Replace(s) + `"`
}

// TestOperatorReplaysADeadLetter walks the operator's path: from the
// overview to the outbox, its queue and its dead letters, filters them,
// opens one and replays it in three steps, and checks that the running
// subscriber handled it.
func TestOperatorReplaysADeadLetter(t *testing.T) {
	chromiumPath(t)
	t.Parallel()
	f := newOutbox(t)
	ob := f.Outbox

	// Orders and invoices; the subscriber rejects the ones marked reject
	// (reason rejected) and fails the ones marked fail, which it never
	// retries (reason retry_exhausted).
	type row struct {
		queue, payload string
		id             int64
	}
	rows := []*row{
		{queue: "orders", payload: `{"order":"o-1","note":"ok"}`},
		{queue: "orders", payload: `{"order":"o-2","note":"reject"}`},
		{queue: "orders", payload: `{"order":"o-3","note":"ok"}`},
		{queue: "orders", payload: `{"order":"o-4","note":"fail"}`},
		{queue: "invoices", payload: `{"invoice":"i-1","note":"ok"}`},
		{queue: "invoices", payload: `{"invoice":"i-2","note":"reject"}`},
	}
	for _, r := range rows {
		r.id = publish(t, f, jsonBytes{}, r.queue, []byte(r.payload), nil)
	}
	rejected, failed := rows[1], rows[3]
	c := &consumer{verdict: func(m *outbox.Message[[]byte]) error {
		switch {
		case bytes.Contains(m.Payload, []byte(`"reject"`)):
			return outbox.Reject(fmt.Errorf("message %d: unknown customer", m.ID))
		case bytes.Contains(m.Payload, []byte(`"fail"`)):
			return fmt.Errorf("message %d: payment service unavailable", m.ID)
		}
		return nil
	}}
	subscribe(t, ob, []string{"orders", "invoices"}, c)
	waitDeadLetters(t, ob, 3)
	for _, r := range []*row{rows[0], rows[2], rows[4]} {
		eventually(t, "the subscriber handles "+r.payload, 30*time.Second, func(context.Context) (bool, error) {
			return c.accepted(r.payload), nil
		})
	}
	// From now on the subscriber, still running, accepts everything: a
	// replayed row is handled.
	c.acceptAll.Store(true)

	srv := serveConsole(t, f, true)
	p := newPage(t, srv.URL)
	base := outboxPath(f)
	name := f.Schema + "." + ob.Table()

	// The overview lists the outbox with its schema version.
	p.open("/")
	p.do("waiting for the outbox list", chromedp.WaitVisible(chromedp.CSS("table#outboxes")))
	outboxRow := "table#outboxes tr.outbox[data-outbox=" + cssString(name) + "]"
	if !p.has(outboxRow) {
		t.Fatalf("the overview does not list %s; it says: %s", name, p.text("main"))
	}
	if got, want := strings.TrimSpace(p.text(outboxRow+" td.version")), strconv.FormatInt(ob.LatestSchemaVersion(), 10); got != want {
		t.Errorf("overview: version of %s = %q, want %q", name, got, want)
	}
	p.shot("01-overview.png")

	// The outbox page: a row per queue with its dead letters.
	p.click(outboxRow + " a.outbox-link")
	if got, want := p.path(), base+"/"; got != want {
		t.Errorf("outbox link led to %s, want %s", got, want)
	}
	p.do("waiting for the queues", chromedp.WaitVisible(chromedp.CSS("table#queues tr.queue")))
	for queue, want := range map[string]string{"orders": "2", "invoices": "1"} {
		sel := "table#queues tr.queue[data-queue=" + cssString(queue) + "] td.dead"
		if got := strings.TrimSpace(p.text(sel)); got != want {
			t.Errorf("outbox page: dead letters of %s = %q, want %s", queue, got, want)
		}
	}
	// The page reloads its live region every 5 s; the chart needs two
	// samples of the depths, so it appears with the first reload.
	if got := p.attr("body", "data-refresh"); got != "5" {
		t.Errorf("outbox page: body[data-refresh] = %q, want 5", got)
	}
	p.do("waiting for the chart to fill in with the page's refresh",
		chromedp.WaitVisible(chromedp.CSS("#live svg.chart")))
	p.shot("02-outbox.png")

	// The queue page.
	p.click(`table#queues tr.queue[data-queue="orders"] a.queue-link`)
	if got, want := p.path(), base+"/queue?q=orders"; got != want {
		t.Errorf("queue link led to %s, want %s", got, want)
	}
	p.do("waiting for the depth", chromedp.WaitVisible(chromedp.CSS("dl#depth")))
	for class, want := range map[string]string{"ready": "0", "scheduled": "0", "leased": "0", "dead": "2"} {
		if got := strings.TrimSpace(p.text("dl#depth dd." + class)); got != want {
			t.Errorf("queue page: %s = %q, want %s", class, got, want)
		}
	}
	if !p.has("svg.chart") {
		t.Errorf("queue page: no svg.chart")
	}
	p.shot("03-queue.png")

	// The queue's dead letters, then only its rejected ones.
	p.click("a#queue-dead")
	p.do("waiting for the dead letters", chromedp.WaitVisible(chromedp.CSS("table#dead")))
	if diff := cmp.Diff(sorted(rejected.id, failed.id), p.deadIDs()); diff != "" {
		t.Errorf("dead letters of orders (-want +got):\n%s", diff)
	}
	p.do("filtering by queue and reason",
		chromedp.SetValue(chromedp.CSS(`form#dead-filter input[name="q"]`), "orders"),
		chromedp.SetValue(chromedp.CSS(`form#dead-filter select[name="reason"]`), outbox.ReasonRejected),
	)
	p.click("form#dead-filter button#filter")
	if q := p.query(); q.Get("q") != "orders" || q.Get("reason") != outbox.ReasonRejected {
		t.Errorf("filter led to %s, want q=orders and reason=rejected", p.path())
	}
	if diff := cmp.Diff(sorted(rejected.id), p.deadIDs()); diff != "" {
		t.Errorf("rejected dead letters of orders (-want +got):\n%s", diff)
	}
	p.shot("04-dead-letters.png")

	// One dead letter: its payload, reason and error.
	p.click("table#dead tr.dead[data-id=" + cssString(id(rejected.id)) + "] a.dead-link")
	if got, want := p.path(), base+"/dead/"+id(rejected.id); got != want {
		t.Errorf("dead letter link led to %s, want %s", got, want)
	}
	if got := compactJSON(t, p.text("pre#payload")); got != rejected.payload {
		t.Errorf("dead letter payload = %s, want %s", got, rejected.payload)
	}
	if got := strings.TrimSpace(p.text("dl#meta dd.reason")); got != outbox.ReasonRejected {
		t.Errorf("dead letter reason = %q, want %q", got, outbox.ReasonRejected)
	}
	if got, want := p.text("pre#last-error"), fmt.Sprintf("message %d: unknown customer", rejected.id); !strings.Contains(got, want) {
		t.Errorf("dead letter error = %q, want it to hold %q", got, want)
	}
	if got := p.text("table#headers"); !strings.Contains(got, outbox.ContentTypeJSON) {
		t.Errorf("dead letter headers = %q, want the content type %s among them", got, outbox.ContentTypeJSON)
	}
	p.shot("05-dead-letter.png")

	// Replay it: count, dry run, confirm.
	one := regexp.MustCompile(`\b1 (row|dead letter)\b`)
	p.click("button#replay-one")
	if got := p.text("p#count"); !one.MatchString(got) {
		t.Errorf("replay count = %q, want it to count 1 row", got)
	}
	p.shot("06-replay-count.png")
	p.click("button#dry-run")
	if got := p.text("p#dry-result"); !one.MatchString(got) {
		t.Errorf("replay dry run = %q, want it to name 1 row", got)
	}
	if n := countDeadLetters(t, ob, outbox.DeadLetterFilter{}); n != 3 {
		t.Errorf("after the dry run: %d dead letters, want 3 (a dry run changes nothing)", n)
	}
	p.shot("07-replay-dry-run.png")
	p.click("button#confirm")
	if got := p.text("p#result"); !strings.Contains(got, "Replayed 1 dead letter") {
		t.Errorf("replay result = %q, want it to say Replayed 1 dead letter", got)
	}
	p.shot("08-replay-done.png")

	// The row left the dead-letter table, the others stayed, and the
	// running subscriber handled it.
	if n := countDeadLetters(t, ob, outbox.DeadLetterFilter{Queue: "orders", Reason: outbox.ReasonRejected}); n != 0 {
		t.Errorf("after the replay: %d rejected dead letters of orders, want 0", n)
	}
	var left []int64
	for _, d := range deadLetters(t, ob, outbox.DeadLetterFilter{}) {
		left = append(left, d.ID)
	}
	if diff := cmp.Diff(sorted(failed.id, rows[5].id), sorted(left...)); diff != "" {
		t.Errorf("dead letters after the replay (-want +got):\n%s", diff)
	}
	eventually(t, "the subscriber handles the replayed row", 30*time.Second, func(context.Context) (bool, error) {
		return c.accepted(rejected.payload), nil
	})
	p.open(base + "/dead?q=orders")
	if diff := cmp.Diff(sorted(failed.id), p.deadIDs()); diff != "" {
		t.Errorf("dead letters of orders after the replay (-want +got):\n%s", diff)
	}
	p.shot("09-dead-letters-after.png")
}

// id formats a row id as the console's pages show it.
func id(n int64) string { return strconv.FormatInt(n, 10) }

// deadIDs returns the data-id of each row of table#dead, in increasing
// order (the page lists the newest first).
func (p *page) deadIDs() []int64 {
	p.t.Helper()
	var ids []int64
	for _, s := range eval[[]string](p, `[...document.querySelectorAll('table#dead tr.dead')].map(r => r.dataset.id)`) {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			p.t.Errorf("table#dead: data-id %q: %v", s, err)
		}
		ids = append(ids, n)
	}
	slices.Sort(ids)
	return ids
}

// sorted returns ids in increasing order.
func sorted(ids ...int64) []int64 { return slices.Sorted(slices.Values(ids)) }

// query returns the current page's query parameters.
func (p *page) query() url.Values {
	p.t.Helper()
	u, err := url.Parse(p.location())
	if err != nil {
		p.t.Fatal(err)
	}
	return u.Query()
}

// compactJSON returns s with JSON's insignificant white space removed, or
// s itself when it is not JSON.
func compactJSON(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(strings.TrimSpace(s))); err != nil {
		return s
	}
	return b.String()
}

// TestUserDataIsEscaped plants markup and javascript: URLs in every
// user-controlled field (queue names, payloads, headers, ordering keys,
// timer ids, a handler's error), some in live rows and some in dead
// letters, opens every page that shows them and checks that none of it
// ran or reached the DOM as markup, that it shows as text, and that the
// links built from it lead to console pages.
func TestUserDataIsEscaped(t *testing.T) {
	chromiumPath(t)
	t.Parallel()
	f := newOutbox(t)
	ob := f.Outbox
	planted := []string{xssScript, xssImg, xssURL}
	all := strings.Join(planted, " ")
	headers := map[string]string{"x-script": xssScript, "x-img": xssImg, "x-link": xssURL, xssScript: xssURL}
	// A JSON payload whose strings hold the planted markup, unescaped (as
	// encoding/json would not write it).
	jsonPayload := `{"script":"` + xssScript + `","img":"\"><img src=x onerror=\"window.__xss=1\">","link":"` + xssURL + `"}`

	type live struct {
		queue, key, timer string
		id                int64
	}
	var lives []live
	dead := map[string]int64{} // queue -> id of its row that the subscriber dead-letters
	for _, q := range planted {
		// A row the subscriber rejects with the planted strings as its
		// error; its key is free again once it is dead-lettered.
		dead[q] = publish(t, f, jsonBytes{}, q, []byte(jsonPayload),
			&outbox.PublishOpts{Headers: headers, OrderingKey: q + " (dead)", CorrelationID: q})
		// A row due in an hour, holding its timer, and one behind it with
		// the same key: the key is held (its head is scheduled).
		l := live{queue: q, key: q, timer: q}
		l.id = publish(t, f, outbox.BytesCodec{}, q, []byte(all),
			&outbox.PublishOpts{Headers: headers, OrderingKey: l.key, TimerID: l.timer, Delay: time.Hour})
		publish(t, f, outbox.BytesCodec{}, q, []byte(all), &outbox.PublishOpts{Headers: headers, OrderingKey: l.key})
		lives = append(lives, l)
	}
	c := &consumer{verdict: func(*outbox.Message[[]byte]) error { return outbox.Reject(errors.New(all)) }}
	subscribe(t, ob, planted, c)
	waitDeadLetters(t, ob, int64(len(planted)))

	srv := serveConsole(t, f, true)
	p := newPage(t, srv.URL)
	base := outboxPath(f)
	shot := 0
	seen := map[string]bool{}
	// check checks that nothing planted ran or became markup on the
	// current page and that it shows each of want as text, and saves a
	// screenshot.
	check := func(name string, want ...string) {
		t.Helper()
		p.requireNoInjection(name)
		body := eval[string](p, `document.body.textContent`)
		for _, w := range want {
			if !strings.Contains(body, w) {
				t.Errorf("%s (%s) does not show %q as text", name, p.path(), w)
			}
		}
		shot++
		p.shot(fmt.Sprintf("%02d-%s.png", shot, name))
	}
	// visit opens path, checks it and follows the links on it built from
	// planted data.
	visit := func(name, path string, want ...string) {
		t.Helper()
		p.open(path)
		check(name, want...)
		p.followPlantedLinks(name, path, seen)
	}
	// quoted is s as the action pages quote it.
	quoted := strconv.Quote

	visit("overview", "/")
	visit("outbox", base+"/", planted...)
	// The page's script replaces its live region with a fresh copy every
	// 5 s; with the second sample of the depths the chart appears, its
	// legend naming the queues.
	p.do("waiting for the outbox page's refresh", chromedp.WaitVisible(chromedp.CSS("#live svg.chart")))
	p.requireNoInjection("outbox after a refresh")
	legend := p.text("#live figcaption")
	for _, q := range planted {
		if !strings.Contains(legend, q) {
			t.Errorf("outbox page after a refresh: the chart's legend %q does not name queue %q", legend, q)
		}
	}
	shot++
	p.shot(fmt.Sprintf("%02d-outbox-refreshed.png", shot))
	for i, q := range planted {
		visit(fmt.Sprintf("queue-%d", i+1), base+"/queue?q="+url.QueryEscape(q), q)
		if got := eval[string](p, `document.title`); !strings.Contains(got, q) {
			t.Errorf("queue page of %q: title %q does not name it", q, got)
		}
		visit(fmt.Sprintf("keys-%d", i+1), base+"/keys?q="+url.QueryEscape(q), q)
		if got := eval[[]string](p, `[...document.querySelectorAll('table#keys tr.key')].map(r => r.dataset.key)`); !cmp.Equal(got, []string{q}) {
			t.Errorf("keys of queue %q: data-key %q, want [%q]", q, got, q)
		}
	}
	visit("dead-letters", base+"/dead", append(planted, all)...)
	for i, q := range planted {
		visit(fmt.Sprintf("dead-letters-%d", i+1), base+"/dead?q="+url.QueryEscape(q), q)
		visit(fmt.Sprintf("dead-letter-%d", i+1), base+"/dead/"+id(dead[q]), q, all, xssScript, xssImg, xssURL)
		if got := p.text("pre#payload"); compactJSON(t, got) != jsonPayload && got != jsonPayload {
			t.Errorf("dead letter %d: payload %q, want %q", dead[q], got, jsonPayload)
		}
		if got := p.text("pre#last-error"); !strings.Contains(got, all) {
			t.Errorf("dead letter %d: last error %q, want it to hold %q", dead[q], got, all)
		}
	}
	for i, l := range lives {
		visit(fmt.Sprintf("row-%d", i+1), base+"/row?id="+id(l.id), l.queue, l.key, all)
		visit(fmt.Sprintf("row-timer-%d", i+1), base+"/row?q="+url.QueryEscape(l.queue)+"&timer="+url.QueryEscape(l.timer), l.queue, l.timer, all)
		if !p.has("dl#row") {
			t.Errorf("row lookup by queue %q and timer %q found nothing", l.queue, l.timer)
		}
	}
	visit("health", base+"/health")

	// The pages of the actions' first two steps (count, dry run; no
	// confirmation) name what they act on: the dead letters of a planted
	// queue, a planted timer of a planted queue.
	for i, q := range planted {
		p.open(base + "/dead?q=" + url.QueryEscape(q))
		p.click("button#replay-filter")
		check(fmt.Sprintf("replay-count-%d", i+1), quoted(q))
		p.click("button#dry-run")
		check(fmt.Sprintf("replay-dry-run-%d", i+1))
		l := lives[i]
		p.open(base + "/row?q=" + url.QueryEscape(l.queue) + "&timer=" + url.QueryEscape(l.timer))
		p.click("button#cancel-timer")
		check(fmt.Sprintf("cancel-count-%d", i+1), quoted(l.timer), quoted(l.queue))
		p.click("button#dry-run")
		check(fmt.Sprintf("cancel-dry-run-%d", i+1), quoted(l.timer), quoted(l.queue))
	}
	if n := countDeadLetters(t, ob, outbox.DeadLetterFilter{}); n != int64(len(planted)) {
		t.Errorf("after the dry runs: %d dead letters, want %d", n, len(planted))
	}

	// Planted strings the database does not hold, sent in the URL, come
	// back in the pages: an unknown outbox (404), an unknown queue, a
	// lookup of an unknown timer (its form shows what was asked).
	for i, s := range planted {
		path := "/o/" + url.PathEscape(s) + "/outbox/"
		if status := p.openStatus(path); status != http.StatusNotFound {
			t.Errorf("GET %s: status %d, want 404", path, status)
		}
		check(fmt.Sprintf("no-outbox-%d", i+1), s)
		visit(fmt.Sprintf("no-queue-%d", i+1), base+"/queue?q="+url.QueryEscape(s+" (none)"), s+" (none)")
		visit(fmt.Sprintf("no-timer-%d", i+1), base+"/row?q="+url.QueryEscape(s)+"&timer="+url.QueryEscape(s+" (none)"))
		if !p.has("p#not-found") {
			t.Errorf("row lookup of timer %q found a row", s+" (none)")
		}
		if got := eval[[]string](p, `[...document.querySelectorAll('form#row-lookup input')].map(i => i.value)`); !slices.Contains(got, s+" (none)") {
			t.Errorf("row lookup of timer %q: the form holds %q, not the timer asked for", s+" (none)", got)
		}
	}

	// Had markup got through, the pages' Content-Security-Policy would
	// still keep it from running: an inline handler and an inline script
	// added to a page do not run.
	p.open(base + "/dead/" + id(dead[xssScript]))
	if got := p.tryInlineScript(); got.Ran || len(got.Violated) < 2 {
		t.Errorf("dead letter page: inline script ran %v, violated %q; want it blocked twice by script-src", got.Ran, got.Violated)
	}

	// The links built from planted data: each queue's, from the outbox
	// page, the dead letters' pages and the queue pages, at least.
	if len(seen) < 2*len(planted) {
		t.Errorf("followed %d links built from planted data, want at least %d: %v", len(seen), 2*len(planted), slices.Sorted(maps.Keys(seen)))
	}
	t.Logf("followed %d links built from planted data", len(seen))
}

// followPlantedLinks clicks, one by one, the links of the page at path
// whose URL or text holds planted data and that seen does not hold yet,
// and checks that each leads to a console page on which nothing planted
// ran either. It leaves the tab on path again.
func (p *page) followPlantedLinks(name, path string, seen map[string]bool) {
	p.t.Helper()
	type link struct {
		Href string `json:"href"`
		Text string `json:"text"`
	}
	links := eval[[]link](p, `[...document.querySelectorAll('a[href]')].map(a => ({href: a.href, text: a.textContent}))`)
	away := false
	for i, l := range links {
		decoded, err := url.QueryUnescape(l.Href)
		if err != nil {
			decoded = l.Href
		}
		if !strings.Contains(decoded, "__xss") && !strings.Contains(l.Text, "__xss") {
			continue
		}
		if u, err := url.Parse(l.Href); err != nil || (u.Scheme != "http" && u.Scheme != "https") || !strings.HasPrefix(l.Href, p.base+"/") {
			p.t.Errorf("%s: link %q (text %q) does not lead to a console page", name, l.Href, l.Text)
			continue
		}
		if seen[l.Href] {
			continue
		}
		seen[l.Href] = true
		if away {
			p.open(path)
		}
		away = true
		p.follow(fmt.Sprintf("%s: following link %q", name, l.Href),
			chromedp.Click(chromedp.JSPath(fmt.Sprintf(`document.querySelectorAll('a[href]')[%d]`, i))))
		if loc := p.location(); !strings.HasPrefix(loc, p.base+"/") {
			p.t.Errorf("%s: link %q led to %s", name, l.Href, loc)
		}
		p.requireNoInjection(name + " -> " + l.Href)
	}
	if away {
		p.open(path)
	}
}

// TestReadOnlyConsole checks a console without actions: no action
// controls on its pages, and a POST of any step of a replay or a delete
// is refused and changes nothing, even with the page's token; the same
// POST to a console with actions is accepted, so the refusal is the
// setting's.
func TestReadOnlyConsole(t *testing.T) {
	chromiumPath(t)
	t.Parallel()
	f := newOutbox(t)
	ob := f.Outbox
	payload := `{"order":"o-1"}`
	rowID := publish(t, f, jsonBytes{}, "orders", []byte(payload), nil)
	subscribe(t, ob, []string{"orders"}, &consumer{verdict: func(*outbox.Message[[]byte]) error {
		return outbox.Reject(errors.New("unknown customer"))
	}})
	waitDeadLetters(t, ob, 1)

	srv := serveConsole(t, f, false)
	p := newPage(t, srv.URL)
	base := outboxPath(f)
	controls := "button#replay-filter, button#replay-selected, button#delete-filter, button#delete-selected, " +
		"button#replay-one, button#delete-one, button#cancel-timer, input.select, input#select-all"
	// A form that posts and can be submitted: one with a submit control.
	postForms := `[...document.forms].filter(f => f.method === 'post' &&
		f.querySelector('button:not([type=button]):not([type=reset]), input[type=submit], input[type=image]')).map(f => f.outerHTML.slice(0, 300))`

	p.open(base + "/dead")
	if diff := cmp.Diff(sorted(rowID), p.deadIDs()); diff != "" {
		t.Errorf("dead letters (-want +got):\n%s", diff)
	}
	if n := p.count(controls); n != 0 {
		t.Errorf("dead letters page without actions: %d action controls, want none", n)
	}
	if forms := eval[[]string](p, postForms); len(forms) > 0 {
		t.Errorf("dead letters page without actions has forms that post: %q", forms)
	}
	if got := p.text("footer"); !strings.Contains(got, "read-only") {
		t.Errorf("footer = %q, want it to say read-only", got)
	}
	p.shot("01-dead-letters.png")

	p.open(base + "/dead/" + id(rowID))
	if got := compactJSON(t, p.text("pre#payload")); got != payload {
		t.Errorf("payload = %s, want %s", got, payload)
	}
	if n := p.count(controls); n != 0 {
		t.Errorf("dead letter page without actions: %d action controls, want none", n)
	}
	if forms := eval[[]string](p, postForms); len(forms) > 0 {
		t.Errorf("dead letter page without actions has forms that post: %q", forms)
	}
	p.shot("02-dead-letter.png")

	// Every step of a replay and of a delete of the dead letter, posted
	// from the console's page (its cookie, and its token when the page
	// holds one) and from outside it.
	p.open(base + "/dead")
	token := eval[string](p, `(document.querySelector('input[name=csrf]') || {value: ''}).value`)
	noRedirect := &http.Client{
		Timeout:       stepTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	post := func(action, step string) (fromPage, fromOutside int) {
		t.Helper()
		form := url.Values{"scope": {"selection"}, "id": {id(rowID)}, "step": {step}, "csrf": {token}}
		fromPage = eval[int](p, fmt.Sprintf(`fetch(%s, {method: 'POST', body: new URLSearchParams(%s), redirect: 'manual'}).then(r => r.status)`,
			jsString(base+"/dead/"+action), jsString(form.Encode())), chromedp.EvalAwaitPromise)
		resp, err := noRedirect.PostForm(p.base+base+"/dead/"+action, form)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return fromPage, resp.StatusCode
	}
	for _, action := range []string{"replay", "delete"} {
		for _, step := range []string{"count", "dry-run", "confirm"} {
			fromPage, fromOutside := post(action, step)
			if fromPage < 400 || fromOutside < 400 {
				t.Errorf("POST %s/dead/%s step %s without actions: status %d from the page, %d from outside; want both refused",
					base, action, step, fromPage, fromOutside)
			}
		}
	}
	if n := countDeadLetters(t, ob, outbox.DeadLetterFilter{}); n != 1 {
		t.Errorf("after the refused POSTs: %d dead letters, want 1", n)
	}
	if c := p.location(); !strings.HasPrefix(c, srv.URL) {
		t.Fatalf("tab left the console: %s", c)
	}

	// The same first step, posted from a page of a console with actions,
	// is accepted (it only counts).
	withActions := serveConsole(t, f, true)
	p.base = withActions.URL
	p.open(base + "/dead")
	token = eval[string](p, `document.querySelector('form#dead-select input[name=csrf]').value`)
	if fromPage, _ := post("replay", "count"); fromPage != http.StatusOK {
		t.Errorf("POST %s/dead/replay step count with actions, from the page: status %d, want 200", base, fromPage)
	}
	if n := countDeadLetters(t, ob, outbox.DeadLetterFilter{}); n != 1 {
		t.Errorf("after counting: %d dead letters, want 1", n)
	}
}

// An operator pauses a queue from its page, giving a reason, through the
// count, the dry run and the confirmation; the queues page and the queue
// page then show it paused, its new row waits, and the resume, from the
// same page, lets the running subscriber handle it.
func TestOperatorPausesAndResumesAQueue(t *testing.T) {
	chromiumPath(t)
	t.Parallel()
	f := newOutbox(t)
	c := &consumer{}
	subscribe(t, f.Outbox, []string{"orders"}, c)
	publish(t, f, jsonBytes{}, "orders", []byte(`{"order":"before"}`), nil)
	eventually(t, "the subscriber handles the first row", 30*time.Second, func(context.Context) (bool, error) {
		return c.accepted(`{"order":"before"}`), nil
	})

	srv := serveConsole(t, f, true)
	p := newPage(t, srv.URL)
	base := outboxPath(f)
	p.open(base + "/queue?q=orders")
	p.do("typing the reason", chromedp.SendKeys(chromedp.CSS("#pause-reason"), "payments API down"))
	p.click("button#pause")
	if got := p.text("p#count"); !strings.Contains(got, `queue "orders" runs`) {
		t.Errorf("pause count = %q", got)
	}
	p.click("button#dry-run")
	if got := p.text("p#dry-result"); !strings.Contains(got, "no subscriber of it claims its rows") {
		t.Errorf("pause dry run = %q", got)
	}
	if ps, err := f.Outbox.PausedQueues(t.Context()); err != nil || len(ps) != 0 {
		t.Fatalf("paused by the dry run: %+v, %v", ps, err)
	}
	p.click("button#confirm")
	if got := p.text("p#result"); !strings.Contains(got, `queue "orders" is paused since`) {
		t.Errorf("pause result = %q", got)
	}
	p.shot("pause-done.png")

	publish(t, f, jsonBytes{}, "orders", []byte(`{"order":"while paused"}`), nil)
	p.open(base + "/")
	if got := p.text(`table#queues tr.queue[data-queue="orders"] span.paused`); got != "paused" {
		t.Errorf("the queues page marks orders %q, want paused", got)
	}
	p.open(base + "/queue?q=orders")
	if got := p.text("p#paused"); !strings.Contains(got, "payments API down") {
		t.Errorf("the queue page's pause = %q, want it to give the reason", got)
	}
	if got := strings.TrimSpace(p.text("dl#depth dd.ready")); got != "1" || c.accepted(`{"order":"while paused"}`) {
		t.Errorf("while paused: ready %q, handled %v; want the row waiting", got, c.accepted(`{"order":"while paused"}`))
	}
	p.shot("paused-queue.png")

	p.click("button#resume")
	p.click("button#dry-run")
	p.click("button#confirm")
	if got := p.text("p#result"); !strings.Contains(got, `Resumed the queue "orders"`) {
		t.Errorf("resume result = %q", got)
	}
	eventually(t, "the subscriber handles the row after the resume", 30*time.Second, func(context.Context) (bool, error) {
		return c.accepted(`{"order":"while paused"}`), nil
	})
}

// colorScheme emulates the browser's prefers-color-scheme.
func colorScheme(scheme string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}}})
		return err
	})
}

// A browser that prefers a dark color scheme gets the console dark: its
// page, tables and text; one that prefers light gets it light.
func TestTheConsoleFollowsTheBrowsersColorScheme(t *testing.T) {
	chromiumPath(t)
	t.Parallel()
	f := newOutbox(t)
	publish(t, f, jsonBytes{}, "orders", []byte(`{"order":"o-1"}`), nil)
	srv := serveConsole(t, f, false)
	p := newPage(t, srv.URL)
	colors := `(() => { const s = e => getComputedStyle(document.querySelector(e));
		return [s("body").backgroundColor, s("body").color, s("table#queues").backgroundColor]; })()`
	for _, c := range []struct {
		scheme string
		want   []string
	}{
		{"dark", []string{"rgb(14, 17, 22)", "rgb(230, 232, 236)", "rgb(22, 27, 34)"}},
		{"light", []string{"rgb(247, 248, 250)", "rgb(29, 35, 48)", "rgb(255, 255, 255)"}},
	} {
		p.do("emulating "+c.scheme, colorScheme(c.scheme))
		p.open(outboxPath(f) + "/")
		p.do("waiting for the queues", chromedp.WaitVisible(chromedp.CSS("table#queues")))
		if diff := cmp.Diff(c.want, eval[[]string](p, colors)); diff != "" {
			t.Errorf("%s: the page's background, text and table colors (-want +got):\n%s", c.scheme, diff)
		}
		p.shot("color-scheme-" + c.scheme + ".png")
	}
}
