package console

import (
	"html"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/outbox"
)

var previewRE = regexp.MustCompile(`<td class="preview mono">([^<]*)</td>`)

// The dead-letter list shows the start of each payload and, for binary,
// its whole size, though it reads only that start.
func TestDeadListPreviewsLargePayloads(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{})
	s.exec(`INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason) VALUES
		(1, 'orders', convert_to(repeat('ab ', 1000000), 'UTF8'), 1, 1, now(), 'rejected'),
		(2, 'orders', '\x00'::bytea || convert_to(repeat('x', 2000000), 'UTF8'), 1, 1, now(), 'rejected')`)
	var got []string
	for _, m := range previewRE.FindAllStringSubmatch(s.page(s.base+"/dead"), -1) {
		got = append(got, m[1])
	}
	want := []string{"(2000001 bytes of binary)", strings.TrimSpace(strings.Repeat("ab ", 27)) + "…"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("previews (-want +got):\n%s", diff)
	}
}

// The first page of the dead letters groups the newest by why they
// failed, with links to each group's rows and its newest dead letter;
// the next pages do not.
func TestDeadLettersPageShowsWhyTheyFailed(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{})
	s.fixture()
	body := s.page(s.base + "/dead")
	if !strings.Contains(body, `<table id="causes">`) || !strings.Contains(body, "Among the newest 3 dead letters") {
		t.Fatalf("the dead letters page shows no causes:\n%s", body)
	}
	causes, _, err := s.ob.DeadLetterCauses(t.Context(), nil)
	if err != nil || len(causes) == 0 {
		t.Fatalf("DeadLetterCauses: %v, %v", causes, err)
	}
	c := causes[0]
	link := strings.ReplaceAll(html.EscapeString(s.base+"/dead?"+url.Values{"q": {c.Queue}, "reason": {c.Reason}, "cause": {c.Cause}}.Encode()), "+", "&#43;")
	if !strings.Contains(body, `<a href="`+link+`"`) || !strings.Contains(body, html.EscapeString(c.Cause)) {
		t.Errorf("the largest cause %+v is not on the page with its link %s:\n%s", c, link, body)
	}
	// A search within the sample's last errors keeps the groups whose
	// errors hold it, and the page's other filters.
	needle := c.Cause[:min(len(c.Cause), 6)]
	body = s.page(s.base + "/dead?" + url.Values{"q": {c.Queue}, "error": {needle}}.Encode())
	if !strings.Contains(body, `<input type="hidden" name="q" value="`+html.EscapeString(c.Queue)+`">`) ||
		!strings.Contains(body, "those whose last error holds the search") || !strings.Contains(body, html.EscapeString(c.Cause)) {
		t.Errorf("a search for %q:\n%s", needle, body)
	}
	if body := s.page(s.base + "/dead?error=no-such-error-anywhere"); strings.Contains(body, `<table id="causes">`) ||
		!strings.Contains(body, `id="cause-search"`) {
		t.Errorf("a search that matches nothing still lists causes, or loses its form")
	}
	if body := s.page(s.base + "/dead?before=2"); strings.Contains(body, `<table id="causes">`) {
		t.Errorf("a next page shows the causes again")
	}
}

var (
	causeFormRE = regexp.MustCompile(`(?s)<form class="replay-cause" method="post" action="[^"]*">(.*?)</form>`)
	inputRE     = regexp.MustCompile(`<input type="hidden" name="(\w+)" value="([^"]*)">`)
)

// A cause's group links every dead letter of its cause (not only the
// sample's), and "Replay all…" beside it replays exactly those, through
// the count, the dry run and the confirmation.
func TestReplayACauseFromTheDeadLettersPage(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{Actions: true})
	s.exec(`INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason, last_error)
		SELECT i, 'orders', '\x00', 1, 1, now(), 'retry_exhausted',
		       CASE WHEN i <= 3 THEN format('order %s timed out', 100 + i) ELSE format('sku %s missing', i) END
		FROM generate_series(1, 5) AS i`)
	s.exec(`INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason)
		VALUES (6, 'orders', '\x00', 1, 1, now(), 'retry_exhausted')`)
	body := s.page(s.base + "/dead")
	var form url.Values
	for _, m := range causeFormRE.FindAllStringSubmatch(body, -1) {
		f := url.Values{}
		for _, in := range inputRE.FindAllStringSubmatch(m[1], -1) {
			f.Set(in[1], html.UnescapeString(in[2]))
		}
		if f.Get("cause") == "order # timed out" {
			form = f
		}
	}
	if form == nil {
		t.Fatalf("no replay form for the cause %q:\n%s", "order # timed out", body)
	}
	// Its rows, and no other.
	rows := s.page(s.base + "/dead?" + url.Values{"q": {"orders"}, "reason": {"retry_exhausted"}, "cause": {"order # timed out"}}.Encode())
	var ids []string
	for _, m := range regexp.MustCompile(`<tr class="dead" data-id="(\d+)">`).FindAllStringSubmatch(rows, -1) {
		ids = append(ids, m[1])
	}
	if diff := cmp.Diff([]string{"3", "2", "1"}, ids); diff != "" {
		t.Errorf("the cause's rows (-want +got):\n%s", diff)
	}
	// The empty cause is the dead letters without a last error, not every
	// cause.
	uncaused := s.page(s.base + "/dead?q=orders&reason=retry_exhausted&cause=")
	if m := regexp.MustCompile(`<tr class="dead" data-id="(\d+)">`).FindAllStringSubmatch(uncaused, -1); len(m) != 1 || m[0][1] != "6" ||
		!strings.Contains(uncaused, "Cause: no last error") {
		t.Errorf("the dead letters without a last error: %v", m)
	}
	for _, st := range []struct{ step, want string }{
		{"", `The dead letters of queue &#34;orders&#34;, reason retry_exhausted, cause &#34;order # timed out&#34;: 3 rows.`},
		{"dry-run", "Dry run: 3 rows would go back to the outbox"},
		{"confirm", "Replayed 3 dead letters"},
	} {
		if st.step != "" {
			form.Set("step", st.step)
		}
		code, body := s.post(s.base+"/dead/replay", form)
		if code != 200 || !strings.Contains(body, st.want) {
			t.Fatalf("step %q: %d %q; want %q", st.step, code, errorText(body), st.want)
		}
		if m := regexp.MustCompile(`name="upto" value="([^"]+)"`).FindStringSubmatch(body); m != nil {
			form.Set("upto", m[1])
			form.Set("expect", regexp.MustCompile(`name="expect" value="([^"]+)"`).FindStringSubmatch(body)[1])
		}
	}
	if n := s.countDead(outbox.DeadLetterFilter{}); n != 3 {
		t.Errorf("after replaying the cause, %d dead letters; want the other causes' 3", n)
	}
}
