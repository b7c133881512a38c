package console

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/outbox"
)

// serve sends req straight to the site's handler, so that it can carry
// any Host, and returns the status and the body.
func (s *site) serve(req *http.Request) (int, string) {
	s.t.Helper()
	rec := httptest.NewRecorder()
	s.h.ServeHTTP(rec, req)
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b)
}

// getHost reads path from the site's handler with host as the request's
// Host.
func (s *site) getHost(host, path string) (int, string) {
	s.t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.Host = host
	req.RemoteAddr = "127.0.0.1:40000"
	return s.serve(req)
}

// The payload of dead letter -3 of the site's fixture: a page that shows
// it has been read.
const fixturePayload = "payment service down"

// A console without a login answers loopback names only: a page that got
// the browser to resolve its own name to 127.0.0.1 (DNS rebinding) is
// refused, reads as well as actions.
func TestHostsOtherThanLoopbackAreRefused(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{Actions: true})
	s.fixture()
	page := s.base + "/dead/-3"
	for _, host := range []string{
		"localhost", "localhost:8080", "LOCALHOST:8080", "console.localhost", "a.b.localhost:1",
		"127.0.0.1", "127.0.0.1:8080", "127.1.2.3:80", "127.255.255.255",
		"[::1]", "[::1]:8080", "[0:0:0:0:0:0:0:1]:8080",
	} {
		if code, body := s.getHost(host, page); code != http.StatusOK || !strings.Contains(body, fixturePayload) {
			t.Errorf("Host %q: %d, want 200 with the payload: %s", host, code, errorText(body))
		}
	}
	for _, host := range []string{
		"rebind.test", "rebind.test:8080", "localhost.rebind.test", "127.0.0.1.nip.io:8080", "localhost.",
		".localhost", "localhostx", "xlocalhost", "10.0.0.1:8080", "0.0.0.0:8080", "128.0.0.1", "[::2]:8080",
		"::1", "[::1", "[::1]x", "localhost:80:80", "localhost:http", "", "127.1", "2130706433", "[::ffff:7f00:1]:8080x",
	} {
		code, body := s.getHost(host, page)
		if code != http.StatusMisdirectedRequest || strings.Contains(body, fixturePayload) {
			t.Errorf("Host %q: %d, want 421 without the payload: %s", host, code, body)
		}
		if code == http.StatusMisdirectedRequest && !strings.Contains(body, "answers only to") {
			t.Errorf("Host %q: the refusal does not say which hosts it answers: %s", host, body)
		}
	}
	// An action, with the page's own token, from the rebound name.
	tok := csrfRE.FindStringSubmatch(s.page(s.base + "/dead"))[1]
	form := url.Values{"scope": {"filter"}, "step": {"confirm"}, "csrf": {tok}}
	req := httptest.NewRequest(http.MethodPost, s.base+"/dead/delete", strings.NewReader(form.Encode()))
	req.Host = "rebind.test:8080"
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://rebind.test:8080")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	req.AddCookie(&http.Cookie{Name: csrfCookie, Value: tok})
	if code, body := s.serve(req); code != http.StatusMisdirectedRequest {
		t.Errorf("a delete from a rebound name: %d, want 421: %s", code, errorText(body))
	}
	if n := s.countDead(outbox.DeadLetterFilter{}); n != 3 {
		t.Errorf("the dead-letter table holds %d rows, want the 3 it had", n)
	}
}

// postWith submits form to path of the site's server with the cookie
// jar's cookies and the headers given.
func (s *site) postWith(path string, form url.Values, header map[string]string) (int, string) {
	s.t.Helper()
	req, err := http.NewRequestWithContext(s.t.Context(), http.MethodPost, s.srv.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	return read(s.t, resp)
}

// An action's form is refused unless the browser's headers, when it
// sends them, say it came from the console's own origin: an opaque
// origin (a sandboxed frame, a redirect from elsewhere) is refused too.
func TestActionsRefuseOtherAndOpaqueOrigins(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{Actions: true})
	s.fixture()
	own := s.srv.URL // http://127.0.0.1:port
	for name, h := range map[string]map[string]string{
		"Origin null":                      {"Origin": "null"},
		"Origin null, same-origin":         {"Origin": "null", "Sec-Fetch-Site": "same-origin"},
		"another port":                     {"Origin": "http://127.0.0.1:1"},
		"another name":                     {"Origin": "http://localhost" + strings.TrimPrefix(own, "http://127.0.0.1")},
		"another origin, said same-origin": {"Origin": "http://evil.example", "Sec-Fetch-Site": "same-origin"},
		"same-site":                        {"Sec-Fetch-Site": "same-site"},
		"cross-site":                       {"Sec-Fetch-Site": "cross-site"},
		"not a URL":                        {"Origin": "%zz"},
	} {
		tok := csrfRE.FindStringSubmatch(s.page(s.base + "/dead"))[1]
		code, body := s.postWith(s.base+"/dead/delete", url.Values{"scope": {"filter"}, "step": {"confirm"}, "csrf": {tok}}, h)
		if code != http.StatusForbidden {
			t.Errorf("%s: %d %q, want 403", name, code, errorText(body))
		}
	}
	if n := s.countDead(outbox.DeadLetterFilter{}); n != 3 {
		t.Fatalf("the dead-letter table holds %d rows, want the 3 it had", n)
	}
	// The console's own origin, as a browser says it.
	tok := csrfRE.FindStringSubmatch(s.page(s.base + "/dead"))[1]
	sel := url.Values{"scope": {"selection"}, "id": {"-1"}, "step": {"confirm"}, "csrf": {tok}}
	if code, body := s.postWith(s.base+"/dead/delete", sel, map[string]string{"Origin": own, "Sec-Fetch-Site": "same-origin"}); code != http.StatusOK {
		t.Errorf("from the console's own origin: %d %q, want 200", code, errorText(body))
	}
}

// A token is one this console made: a cookie of the right length that a
// page on another port planted (cookies do not keep to a port) is
// neither accepted nor repeated in the console's forms.
func TestAPlantedTokenIsRefused(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{Actions: true})
	s.fixture()
	u, err := url.Parse(s.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, planted := range []string{strings.Repeat("A", 43), strings.Repeat("A", 64), strings.Repeat("x", 32)} {
		s.client.Jar.SetCookies(u, []*http.Cookie{{Name: csrfCookie, Value: planted, Path: "/"}})
		code, body := s.postWith(s.base+"/dead/delete", url.Values{"scope": {"filter"}, "step": {"confirm"}, "csrf": {planted}}, nil)
		if code != http.StatusForbidden {
			t.Errorf("planted token %q: %d %q, want 403", planted, code, errorText(body))
		}
		if tok := csrfRE.FindStringSubmatch(s.page(s.base + "/dead"))[1]; tok == planted {
			t.Errorf("the page's form repeats the planted token %q", planted)
		}
	}
	if n := s.countDead(outbox.DeadLetterFilter{}); n != 3 {
		t.Errorf("the dead-letter table holds %d rows, want the 3 it had", n)
	}
}

// A token is bound to the console that made it: one from another console
// (another process, another secret) is refused.
func TestATokenOfAnotherConsoleIsRefused(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{Actions: true})
	s.fixture()
	code, body := s.postOthersToken(Config{Pool: s.d.Pool, Actions: true, Logger: quietLogger()})
	if code != http.StatusForbidden || !strings.Contains(errorText(body), "reload the page") {
		t.Errorf("another console's token: %d %q, want 403", code, errorText(body))
	}
	if n := s.countDead(outbox.DeadLetterFilter{}); n != 3 {
		t.Errorf("the dead-letter table holds %d rows, want the 3 it had", n)
	}
}

// Replicas given one Config.TokenKey accept each other's forms; a key
// too short to be a secret is refused at New.
func TestConsolesSharingATokenKeyAcceptEachOthersTokens(t *testing.T) {
	t.Parallel()
	key := []byte("a secret of thirty-two bytes, ok")
	s := newSite(t, Config{Actions: true, TokenKey: key})
	s.fixture()
	code, body := s.postOthersToken(Config{Pool: s.d.Pool, Actions: true, Logger: quietLogger(), TokenKey: key})
	if code != http.StatusOK {
		t.Errorf("a replica's token: %d %q, want 200", code, errorText(body))
	}
	if n := s.countDead(outbox.DeadLetterFilter{}); n != 0 {
		t.Errorf("the dead-letter table holds %d rows, want none after the delete", n)
	}
	_, err := New(Config{Pool: s.d.Pool, TokenKey: key[:TokenKeyMinSize-1]})
	if err == nil || !strings.Contains(err.Error(), "Config.TokenKey") {
		t.Errorf("New with a %d-byte TokenKey: %v, want an error naming Config.TokenKey", TokenKeyMinSize-1, err)
	}
}

// postOthersToken renders the dead-letter page with a console of cfg,
// takes its cookie and token, and posts the deletion of every dead letter
// to s with them, returning the status and body.
func (s *site) postOthersToken(cfg Config) (int, string) {
	s.t.Helper()
	other, err := New(cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodGet, s.base+"/dead", nil)
	req.Host = "127.0.0.1"
	rec := httptest.NewRecorder()
	other.ServeHTTP(rec, req)
	m := csrfRE.FindStringSubmatch(rec.Body.String())
	if rec.Code != http.StatusOK || m == nil {
		s.t.Fatalf("the other console's page: %d, no token", rec.Code)
	}
	u, _ := url.Parse(s.srv.URL)
	s.client.Jar.SetCookies(u, rec.Result().Cookies())
	return s.postWith(s.base+"/dead/delete", url.Values{"scope": {"filter"}, "step": {"confirm"}, "csrf": {m[1]}}, nil)
}

// logRecords returns the site's log records with message msg.
func (s *site) logRecords(msg string) []map[string]any {
	s.t.Helper()
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(s.log.String()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			s.t.Fatalf("a log line is not JSON: %q: %v", line, err)
		}
		if rec["msg"] == msg {
			delete(rec, "time")
			out = append(out, rec)
		}
	}
	return out
}

// The action log says who acted (the login, else that nobody logged in
// on loopback), through which Host and from which Origin, and the ids a
// selection named, at most maxLoggedIDs of them and their count.
func TestTheActionLogSaysWhoFromWhereAndWhichIDs(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{Actions: true})
	s.fixture()
	host := strings.TrimPrefix(s.srv.URL, "http://")
	own := map[string]string{"Origin": s.srv.URL, "Sec-Fetch-Site": "same-origin"}
	tok := csrfRE.FindStringSubmatch(s.page(s.base + "/dead"))[1]
	sel := url.Values{"scope": {"selection"}, "id": {"-3", "-1"}, "step": {"confirm"}, "csrf": {tok}}
	if code, body := s.postWith(s.base+"/dead/delete", sel, own); code != http.StatusOK {
		t.Fatalf("delete: %d %q", code, errorText(body))
	}
	many := url.Values{"scope": {"selection"}, "step": {"confirm"}, "csrf": {tok}}
	var manyIDs []any
	for i := range 30 {
		many.Add("id", strconv.Itoa(1000+i))
		if i < maxLoggedIDs {
			manyIDs = append(manyIDs, float64(1000+i))
		}
	}
	if code, body := s.postWith(s.base+"/dead/replay", many, nil); code != http.StatusOK {
		t.Fatalf("replay: %d %q", code, errorText(body))
	}
	got := s.logRecords("console action")
	for _, r := range got {
		if remote, _ := r["remote"].(string); !strings.HasPrefix(remote, "127.0.0.1:") {
			t.Errorf("the action log's remote address is %q, want the client's", remote)
		}
		delete(r, "remote") // the client's port varies
	}
	want := []map[string]any{
		{"level": "INFO", "msg": "console action", "who": "unauthenticated loopback", "host": host, "origin": s.srv.URL,
			"action": "delete dead letters", "outbox": s.d.Schema + ".outbox", "target": "the 2 selected dead letters",
			"ids": []any{-3.0, -1.0}, "ids_count": 2.0, "deleted": 2.0, "matched": 2.0, "up_to_id": -1.0},
		{"level": "INFO", "msg": "console action", "who": "unauthenticated loopback", "host": host, "origin": "",
			"action": "replay dead letters", "outbox": s.d.Schema + ".outbox", "target": "the 30 selected dead letters",
			"ids": manyIDs, "ids_count": 30.0, "replayed": 0.0, "skipped": 0.0, "timer_ids_dropped": 0.0, "matched": 0.0},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the action log (-want +got):\n%s", diff)
	}
}

// Every refused request is logged, with who sent it, its Host and its
// Origin, and why.
func TestRefusedRequestsAreLogged(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{Actions: true})
	s.fixture()
	host := strings.TrimPrefix(s.srv.URL, "http://")
	s.getHost("rebind.test:8080", s.base+"/dead/-3")
	tok := csrfRE.FindStringSubmatch(s.page(s.base + "/dead"))[1]
	form := url.Values{"scope": {"filter"}, "step": {"confirm"}, "csrf": {tok}}
	s.postWith(s.base+"/dead/delete", form, map[string]string{"Origin": "null"})
	s.postWith(s.base+"/dead/delete", url.Values{"scope": {"filter"}, "step": {"confirm"}, "csrf": {strings.Repeat("A", 43)}}, nil)
	got := s.logRecords("console request refused")
	var reasons []string
	for _, r := range got {
		if r["level"] != "WARN" || r["who"] != "unauthenticated loopback" || r["remote"] == nil || r["err"] == nil {
			t.Errorf("a refusal's record lacks its attribution: %v", r)
		}
		reasons = append(reasons, r["reason"].(string)+" "+r["host"].(string)+" "+r["origin"].(string)+" "+r["method"].(string))
	}
	want := []string{
		"host rebind.test:8080  GET",
		"origin " + host + " null POST",
		"token " + host + "  POST",
	}
	if diff := cmp.Diff(want, reasons); diff != "" {
		t.Errorf("the refusals logged (-want +got):\n%s", diff)
	}
}

// Config.AllowedHosts adds names to the loopback ones, case-insensitive,
// with any port; "*" answers any host.
func TestAllowedHostsAreAnsweredToo(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{AllowedHosts: []string{"Console.Example.com", "10.0.0.5", "[fd00::5]"}})
	s.fixture()
	page := s.base + "/dead/-3"
	for host, want := range map[string]int{
		"console.example.com": 200, "console.example.com:443": 200, "CONSOLE.EXAMPLE.COM:8080": 200,
		"10.0.0.5:8080": 200, "[fd00::5]:8080": 200, "localhost:8080": 200, "127.0.0.1:8080": 200,
		"other.example.com": 421, "www.console.example.com": 421, "example.com": 421, "10.0.0.6": 421,
	} {
		if code, body := s.getHost(host, page); code != want {
			t.Errorf("Host %q: %d, want %d: %s", host, code, want, errorText(body))
		}
	}
	anyHost := newSite(t, Config{AllowedHosts: []string{AnyHost}})
	anyHost.fixture()
	for _, host := range []string{"rebind.test:8080", "console.example.com", "10.0.0.1"} {
		if code, body := anyHost.getHost(host, page); code != 200 {
			t.Errorf("AllowedHosts *: Host %q: %d, want 200: %s", host, code, errorText(body))
		}
	}
}

// Behind a login a console may answer any host (a rebinding page has no
// login), but an action must still come from its own origin with its own
// token, and the log names the login.
func TestWithALoginTheOriginAndTokenRulesStillApply(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{Actions: true, AllowedHosts: []string{AnyHost}})
	s.fixture()
	h := BasicAuth("ops", "pw", s.h)
	send := func(host string, form url.Values, header map[string]string, cookie string) (int, string) {
		t.Helper()
		req := httptest.NewRequest(http.MethodPost, s.base+"/dead/delete", strings.NewReader(form.Encode()))
		req.Host = host
		req.SetBasicAuth("ops", "pw")
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range header {
			req.Header.Set(k, v)
		}
		if cookie != "" {
			req.AddCookie(&http.Cookie{Name: csrfCookie, Value: cookie})
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	page := httptest.NewRequest(http.MethodGet, s.base+"/dead", nil)
	page.Host = "console.example.com"
	page.SetBasicAuth("ops", "pw")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, page)
	tok := csrfRE.FindStringSubmatch(rec.Body.String())[1]
	form := url.Values{"scope": {"selection"}, "id": {"-1"}, "step": {"confirm"}, "csrf": {tok}}
	for name, c := range map[string]struct {
		header map[string]string
		cookie string
	}{
		"Origin null":    {map[string]string{"Origin": "null"}, tok},
		"another origin": {map[string]string{"Origin": "https://evil.example"}, tok},
		"cross-site":     {map[string]string{"Sec-Fetch-Site": "cross-site"}, tok},
		"no cookie":      {nil, ""},
	} {
		if code, body := send("console.example.com", form, c.header, c.cookie); code != http.StatusForbidden {
			t.Errorf("%s: %d %q, want 403", name, code, errorText(body))
		}
	}
	own := map[string]string{"Origin": "https://console.example.com", "Sec-Fetch-Site": "same-origin"}
	if code, body := send("console.example.com", form, own, tok); code != http.StatusOK {
		t.Errorf("from its own origin: %d %q, want 200", code, errorText(body))
	}
	got := s.logRecords("console action")
	if len(got) != 1 || got[0]["who"] != "ops" || got[0]["host"] != "console.example.com" || got[0]["origin"] != "https://console.example.com" {
		t.Errorf("the action log: %v, want one record of ops through console.example.com", got)
	}
}
