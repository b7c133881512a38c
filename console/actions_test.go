package console

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/outbox"
)

func (s *site) countDead(f outbox.DeadLetterFilter) int64 {
	s.t.Helper()
	n, err := s.ob.CountDeadLetters(s.t.Context(), f)
	if err != nil {
		s.t.Fatal(err)
	}
	return n
}

func TestActionsAreOffUnlessEnabled(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{})
	s.fixture()
	for _, p := range []string{s.base + "/dead", s.base + "/dead/-1", s.base + "/row?q=orders&timer=remind-7"} {
		body := s.page(p)
		for _, id := range []string{"replay-filter", "replay-selected", "delete-filter", "replay-one", "delete-one", "cancel-timer"} {
			if strings.Contains(body, `id="`+id+`"`) {
				t.Errorf("%s of a read-only console shows #%s", p, id)
			}
		}
	}
	for _, p := range []string{"/dead/replay", "/dead/delete", "/timer/cancel"} {
		code, body := s.post(s.base+p, url.Values{"scope": {"filter"}, "step": {"confirm"}, "q": {"orders"}, "timer": {"remind-7"}})
		if code != http.StatusForbidden || !strings.Contains(errorText(body), "actions are turned off") {
			t.Errorf("POST %s = %d %q, want 403", p, code, errorText(body))
		}
	}
	if n := s.countDead(outbox.DeadLetterFilter{}); n != 3 {
		t.Errorf("the dead-letter table holds %d rows, want the 3 it had", n)
	}
	if _, ok, _ := s.ob.RowByTimer(t.Context(), "orders", "remind-7"); !ok {
		t.Error("the timer was cancelled")
	}
}

func TestActionsRefuseFormsFromElsewhere(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{Actions: true})
	s.fixture()
	s.page(s.base + "/dead") // the cookie
	form := url.Values{"scope": {"filter"}, "step": {"confirm"}}
	for name, c := range map[string]struct {
		token  string
		header [2]string
	}{
		"no token":       {"", [2]string{}},
		"another token":  {strings.Repeat("A", 43), [2]string{}},
		"another site":   {"page", [2]string{"Sec-Fetch-Site", "cross-site"}},
		"another origin": {"page", [2]string{"Origin", "https://evil.example"}},
	} {
		f := url.Values{}
		for k, v := range form {
			f[k] = v
		}
		tok := c.token
		if tok == "page" {
			tok = csrfRE.FindStringSubmatch(s.page(s.base + "/dead"))[1]
		}
		f.Set("csrf", tok)
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.srv.URL+s.base+"/dead/delete", strings.NewReader(f.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if c.header[0] != "" {
			req.Header.Set(c.header[0], c.header[1])
		}
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		code, body := read(t, resp)
		if code != http.StatusForbidden {
			t.Errorf("%s: %d %q, want 403", name, code, errorText(body))
		}
	}
	if n := s.countDead(outbox.DeadLetterFilter{}); n != 3 {
		t.Errorf("the dead-letter table holds %d rows, want the 3 it had", n)
	}
}

func TestReplayCountsThenDryRunsThenReplays(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{Actions: true, User: func(*http.Request) string { return "alice" }})
	s.fixture()
	filter := url.Values{"scope": {"filter"}, "q": {"orders"}}

	step := func(name, want string) string {
		t.Helper()
		f := url.Values{"step": {name}}
		for k, v := range filter {
			f[k] = v
		}
		code, body := s.post(s.base+"/dead/replay", f)
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Fatalf("step %s: %d, %q; want %q", name, code, errorText(body), want)
		}
		return body
	}
	count := step("count", `<p id="count" class="message">The dead letters of queue &#34;orders&#34;: 2 rows.</p>`)
	if !strings.Contains(count, `id="dry-run"`) || !strings.Contains(count, `name="step" value="dry-run"`) {
		t.Error("the count step offers no dry run")
	}
	dry := step("dry-run", `<p id="dry-result" class="message">Dry run: 2 rows would go back to the outbox, 0 rows would stay`)
	if !strings.Contains(dry, `id="confirm"`) {
		t.Error("the dry run offers no confirmation")
	}
	if n := s.countDead(outbox.DeadLetterFilter{Queue: "orders"}); n != 2 {
		t.Fatalf("after the dry run %d dead letters of orders, want 2", n)
	}
	if strings.Contains(s.log.String(), "console action") {
		t.Error("a count or a dry run was logged as an action")
	}
	step("confirm", `<p id="result" class="message">Replayed 2 dead letters; 0 rows stayed`)
	if n := s.countDead(outbox.DeadLetterFilter{}); n != 1 {
		t.Errorf("after the replay %d dead letters, want the 1 of mail", n)
	}
	log := s.log.String()
	for _, want := range []string{`"msg":"console action"`, `"who":"alice"`, `"action":"replay dead letters"`, `"replayed":2`,
		`"target":"the dead letters of queue \"orders\""`, `"outbox":"` + s.d.Schema + `.outbox"`} {
		if !strings.Contains(log, want) {
			t.Errorf("the action log lacks %s:\n%s", want, log)
		}
	}
}

func TestDeleteSelectionAndCancelTimer(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{Actions: true})
	s.fixture()
	sel := url.Values{"scope": {"selection"}, "id": {"-1", "-3"}, "step": {"confirm"}}
	if code, body := s.post(s.base+"/dead/delete", sel); code != 200 || !strings.Contains(body, "Deleted 2 dead letters.") {
		t.Errorf("delete: %d %q", code, errorText(body))
	}
	if n := s.countDead(outbox.DeadLetterFilter{}); n != 1 {
		t.Errorf("%d dead letters left, want 1", n)
	}
	if code, body := s.post(s.base+"/dead/delete", url.Values{"scope": {"selection"}, "step": {"confirm"}}); code != http.StatusBadRequest {
		t.Errorf("an empty selection: %d %q, want 400", code, errorText(body))
	}
	timer := url.Values{"q": {"orders"}, "timer": {"remind-7"}}
	if code, body := s.post(s.base+"/timer/cancel", timer); code != 200 || !strings.Contains(body, "scheduled, due") {
		t.Errorf("cancel count step: %d %q", code, errorText(body))
	}
	timer.Set("step", "confirm")
	if code, body := s.post(s.base+"/timer/cancel", timer); code != 200 || !strings.Contains(body, "Cancelled timer") {
		t.Errorf("cancel: %d %q", code, errorText(body))
	}
	if _, ok, _ := s.ob.RowByTimer(t.Context(), "orders", "remind-7"); ok {
		t.Error("the timer's row is still in the outbox")
	}
	if code, body := s.post(s.base+"/timer/cancel", timer); code != 200 || !strings.Contains(body, "Nothing to cancel") {
		t.Errorf("cancel again: %d %q", code, errorText(body))
	}
	if code, _ := s.post(s.base+"/dead/replay", url.Values{"scope": {"filter"}, "step": {"later"}}); code != http.StatusBadRequest {
		t.Errorf("an unknown step: %d, want 400", code)
	}
}
