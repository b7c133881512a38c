package console

import (
	"bytes"
	"context"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// site is a console over a migrated outbox in a fresh schema.
type site struct {
	t      *testing.T
	d      *pgtest.DB
	ob     *outbox.Outbox
	h      http.Handler // the console, as mounted
	srv    *httptest.Server
	client *http.Client
	base   string // the outbox's pages
	log    *syncBuffer
	c      *Console
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newSite(t *testing.T, cfg Config) *site {
	t.Helper()
	d := pgtest.New(t)
	ob, err := outbox.New(d.Pool, &outbox.Config{Schema: d.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	s := &site{t: t, d: d, ob: ob, log: &syncBuffer{}}
	cfg.Pool = d.Pool
	cfg.Logger = slog.New(slog.NewJSONHandler(s.log, nil))
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.c = c
	var h http.Handler = c
	if cfg.Path != "" {
		mux := http.NewServeMux()
		mux.Handle(cfg.Path+"/", http.StripPrefix(cfg.Path, c))
		h = mux
	}
	s.h = h
	s.srv = httptest.NewServer(h)
	t.Cleanup(s.srv.Close)
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	s.client = &http.Client{Jar: jar}
	s.base = cfg.Path + "/o/" + d.Schema + "/outbox"
	return s
}

// quietLogger discards what it is given.
func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// exec runs fixture SQL in the site's schema.
func (s *site) exec(sql string, args ...any) {
	s.t.Helper()
	if _, err := s.d.Pool.Exec(s.t.Context(), sql, args...); err != nil {
		s.t.Fatalf("exec %q: %v", sql, err)
	}
}

// get fetches path and returns the status and the body.
func (s *site) get(path string) (int, string) {
	s.t.Helper()
	resp, err := s.client.Get(s.srv.URL + path)
	if err != nil {
		s.t.Fatal(err)
	}
	return read(s.t, resp)
}

func read(t *testing.T, resp *http.Response) (int, string) {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// page fetches path and fails the test unless it is 200.
func (s *site) page(path string) string {
	s.t.Helper()
	code, body := s.get(path)
	if code != http.StatusOK {
		s.t.Fatalf("GET %s = %d:\n%s", path, code, errorText(body))
	}
	return body
}

var errorRE = regexp.MustCompile(`id="error" class="error">([^<]*)<`)

func errorText(body string) string {
	if m := errorRE.FindStringSubmatch(body); m != nil {
		return html.UnescapeString(m[1])
	}
	return body
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// post submits an action's form with the page's token.
func (s *site) post(path string, form url.Values) (int, string) {
	s.t.Helper()
	if form.Get("csrf") == "" {
		m := csrfRE.FindStringSubmatch(s.page(s.base + "/dead"))
		if m == nil {
			s.t.Fatal("the dead-letter page carries no token")
		}
		form.Set("csrf", m[1])
	}
	resp, err := s.client.PostForm(s.srv.URL+path, form)
	if err != nil {
		s.t.Fatal(err)
	}
	return read(s.t, resp)
}

// fixture holds rows in every state: queue "orders" with a ready row, a
// scheduled row, a key whose leased head holds two rows back and a
// timer; queue "mail" with an expired lease; and three dead letters.
func (s *site) fixture() {
	s.t.Helper()
	s.exec(`INSERT INTO outbox (queue, payload, headers) VALUES ('orders', '{"n":1}', '{"content-type":"application/json"}')`)
	s.exec(`INSERT INTO outbox (queue, payload, next_attempt_at, timer_id) VALUES ('orders', 'later', now() + interval '1 hour', 'remind-7')`)
	s.exec(`INSERT INTO outbox (queue, payload, ordering_key, acquired_token, acquired_at, lease_expires_at)
		VALUES ('orders', 'head', 'customer-9', gen_random_uuid(), now(), now() + interval '1 minute')`)
	s.exec(`INSERT INTO outbox (queue, payload, ordering_key, blocked) VALUES ('orders', 'next', 'customer-9', true), ('orders', 'last', 'customer-9', true)`)
	s.exec(`INSERT INTO outbox (queue, payload, acquired_token, acquired_at, lease_expires_at)
		VALUES ('mail', 'stuck', gen_random_uuid(), now() - interval '2 minutes', now() - interval '1 minute')`)
	s.exec(`INSERT INTO outbox_dlq (id, queue, payload, headers, deliveries_count, attempts_count, created_at, failed_at, failure_reason, last_error) VALUES
		(-3, 'orders', '{"order":3,"items":[1,2]}', '{"content-type":"application/json"}', 5, 5, now() - interval '3 hours', now() - interval '2 hours', 'retry_exhausted', 'payment service down'),
		(-2, 'orders', '\x00ff10', NULL, 1, 0, now() - interval '1 hour', now() - interval '30 minutes', 'decode_error', 'cannot decode'),
		(-1, 'mail', 'plain text body', '{"to":"ops"}', 1, 1, now(), now(), 'rejected', 'bad address')`)
}

func TestPagesShowTheOutbox(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{})
	s.fixture()

	overview := s.page("/")
	if !strings.Contains(overview, `data-outbox="`+s.d.Schema+`.outbox"`) || !strings.Contains(overview, `href="`+s.base+`/"`) {
		t.Errorf("the overview does not list and link the outbox:\n%s", overview)
	}
	queues := s.page(s.base + "/")
	for _, want := range []string{
		`<tr class="queue" data-queue="mail">`, `<tr class="queue" data-queue="orders">`,
		`<td class="ready num">1</td>`, `<td class="scheduled num">1</td>`, `<td class="leased num">1</td>`,
		`<td class="blocked num">2</td>`, `<td class="expired num warn">1</td>`, `<td class="dead num warn">2</td>`,
		`data-refresh="5"`, `<div id="live">`, `Each count stops at 5,000`,
	} {
		if !strings.Contains(queues, want) {
			t.Errorf("the outbox page lacks %s", want)
		}
	}
	queue := s.page(s.base + "/queue?q=orders")
	for _, want := range []string{`<dd class="blocked">2</dd>`, `<tr class="key" data-key="customer-9">`, `state-leased`,
		`<td class="waiting num">2</td>`, `href="` + s.base + `/dead?q=orders"`} {
		if !strings.Contains(queue, want) {
			t.Errorf("the queue page lacks %s", want)
		}
	}
	if keys := s.page(s.base + "/keys"); !strings.Contains(keys, `data-key="customer-9"`) {
		t.Error("the keys page does not list the held key")
	}
	if keys := s.page(s.base + "/keys?q=mail"); !strings.Contains(keys, `id="no-keys"`) {
		t.Error("the keys page of a queue without keys lists some")
	}

	ids := func(body string) []string {
		var out []string
		for _, m := range regexp.MustCompile(`<tr class="dead" data-id="(-?\d+)">`).FindAllStringSubmatch(body, -1) {
			out = append(out, m[1])
		}
		return out
	}
	for _, c := range []struct {
		query string
		want  []string
	}{
		{"", []string{"-1", "-2", "-3"}},
		{"?q=orders", []string{"-2", "-3"}},
		{"?reason=decode_error", []string{"-2"}},
		{"?older=1h", []string{"-3"}},
		{"?q=orders&before=-2", []string{"-3"}},
	} {
		if diff := cmp.Diff(c.want, ids(s.page(s.base+"/dead"+c.query))); diff != "" {
			t.Errorf("dead letters %s (-want +got):\n%s", c.query, diff)
		}
	}

	one := s.page(s.base + "/dead/-3")
	for _, want := range []string{"payment service down", `<pre id="payload" class="payload json">{
  &#34;order&#34;: 3,`, `<dd class="attempts">5</dd>`, `<dd class="reason">retry_exhausted</dd>`, "content-type"} {
		if !strings.Contains(one, want) {
			t.Errorf("the dead letter's page lacks %q", want)
		}
	}
	if bin := s.page(s.base + "/dead/-2"); !strings.Contains(bin, `class="payload binary">00000000  00 ff 10`) {
		t.Error("a binary payload is not shown as a hex dump")
	}
	if text := s.page(s.base + "/dead/-1"); !strings.Contains(text, `class="payload text">plain text body</pre>`) {
		t.Error("a text payload is not shown as text")
	}

	row := s.page(s.base + "/row?q=orders&timer=remind-7")
	if !strings.Contains(row, `<dd class="state state-scheduled">scheduled</dd>`) || !strings.Contains(row, `<dd class="timer mono">remind-7</dd>`) {
		t.Errorf("the timer's row is not shown:\n%s", row)
	}
	if dead := s.page(s.base + "/row?id=-1"); !strings.Contains(dead, `id="row-dead" href="`+s.base+`/dead/-1"`) {
		t.Error("looking up a dead-lettered id does not link its dead letter")
	}
	if none := s.page(s.base + "/row?id=999999"); !strings.Contains(none, `id="not-found"`) {
		t.Error("looking up a missing id does not say so")
	}
	if h := s.page(s.base + "/health"); !strings.Contains(h, `<dl id="health">`) || !strings.Contains(h, "heard in") {
		t.Errorf("the health page:\n%s", h)
	}
}

func TestPagesRefuseBadInputAndUnknownOutboxes(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{})
	for path, want := range map[string]int{
		"/o/" + s.d.Schema + "/nothing/":                           http.StatusNotFound,
		"/o/nowhere/outbox/dead":                                   http.StatusNotFound,
		s.base + "/dead?older=yesterday":                           http.StatusBadRequest,
		s.base + "/dead?reason=bored":                              http.StatusBadRequest,
		s.base + "/dead?before=x":                                  http.StatusBadRequest,
		s.base + "/dead/abc":                                       http.StatusBadRequest,
		s.base + "/dead/42":                                        http.StatusNotFound,
		s.base + "/row?id=1e3":                                     http.StatusBadRequest,
		s.base + "/row?q=orders&timer=" + strings.Repeat("x", 300): http.StatusBadRequest,
		s.base + "/queue":                                          http.StatusBadRequest,
		"/no/such/page":                                            http.StatusNotFound,
	} {
		code, body := s.get(path)
		if code != want {
			t.Errorf("GET %s = %d, want %d: %s", path, code, want, errorText(body))
		}
		if !strings.Contains(body, `id="error"`) {
			t.Errorf("GET %s does not explain its error", path)
		}
	}
}

// hostile are strings a publisher could put anywhere, meant to run
// script in an operator's browser.
var hostile = []string{
	`<script>window.__xss=1</script>`,
	`"><img src=x onerror="window.__xss=1">`,
	`javascript:window.__xss=1`,
	`'><svg onload=window.__xss=1>`,
}

func TestPagesEscapeWhatTheDatabaseHolds(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{Actions: true})
	for i, h := range hostile {
		q := "q" + h
		s.exec(`INSERT INTO outbox (queue, payload, headers, ordering_key, timer_id, last_error, attempts_count, next_attempt_at)
			VALUES ($1, convert_to($2, 'UTF8'), jsonb_build_object($2::text, $2::text), $2, $2, $2, 1, now() + interval '1 hour')`, q, h)
		s.exec(`INSERT INTO outbox (queue, payload, ordering_key, blocked) VALUES ($1, 'x', $2, true)`, q, h)
		s.exec(`INSERT INTO outbox_dlq (id, queue, payload, headers, ordering_key, timer_id, deliveries_count, attempts_count, created_at, failure_reason, last_error)
			VALUES ($3, $1, convert_to($2, 'UTF8'), jsonb_build_object($2::text, $2::text), $2, $2, 1, 1, now(), 'rejected', $2)`, q, h, -1-i)
		s.exec(`INSERT INTO outbox_dlq (id, queue, payload, headers, deliveries_count, attempts_count, created_at, failure_reason)
			VALUES ($3, $1, convert_to(json_build_object('k', $2::text)::text, 'UTF8'), '[1]', 1, 1, now(), 'decode_error')`, q, h, -100-i)
	}
	raw := regexp.MustCompile(`(?i)<script>window|<img src=x|<svg onload|href="javascript:|src="javascript:`)
	check := func(p, shown string) {
		t.Helper()
		body := s.page(p)
		if m := raw.FindString(body); m != "" {
			t.Errorf("%s renders %q unescaped", p, m)
		}
		if shown != "" && !strings.Contains(body, html.EscapeString(shown)) {
			t.Errorf("%s does not show %q, escaped", p, shown)
		}
	}
	for _, p := range []string{"/", s.base + "/", s.base + "/keys", s.base + "/dead"} {
		check(p, "")
	}
	for i, h := range hostile {
		q := url.QueryEscape("q" + h)
		for _, p := range []string{s.base + "/queue?q=" + q, s.base + "/keys?q=" + q, s.base + "/dead?q=" + q,
			fmt.Sprintf("%s/dead/%d", s.base, -1-i), fmt.Sprintf("%s/dead/%d", s.base, -100-i),
			s.base + "/row?q=" + q + "&timer=" + url.QueryEscape(h)} {
			check(p, h)
		}
	}
	resp, err := s.client.Get(s.srv.URL + s.base + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
		t.Errorf("Content-Security-Policy %q does not forbid inline script", csp)
	}
	for h, want := range map[string]string{"X-Frame-Options": "DENY", "Referrer-Policy": "same-origin",
		"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"} {
		if got := resp.Header.Get(h); got != want {
			t.Errorf("%s: %q, want %q", h, got, want)
		}
	}
}

// testPool is a pool of the test database.
func testPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return pgtest.New(t).Pool
}

func TestPagesGiveUpAfterTheTimeout(t *testing.T) {
	t.Parallel()
	// The timeout is long enough for the first page to load on a busy
	// machine under the race detector, and short enough to wait out.
	const timeout = 2 * time.Second
	s := newSite(t, Config{Timeout: timeout})
	s.fixture()
	s.page(s.base + "/") // the outbox is known
	tx, err := s.d.Pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(t.Context(), "LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	code, body := s.get(s.base + "/")
	if took := time.Since(start); code != http.StatusInternalServerError || took < timeout-50*time.Millisecond || took > timeout+10*time.Second {
		t.Errorf("a page behind a lock: %d after %v: %s", code, took, errorText(body))
	}
	if !strings.Contains(body, `id="error"`) {
		t.Error("the page does not say why it failed")
	}
}
