package console

import (
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
