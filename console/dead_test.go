package console

import (
	"html"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
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
	link := html.EscapeString(s.base + "/dead?" + url.Values{"q": {c.Queue}, "reason": {c.Reason}}.Encode())
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
