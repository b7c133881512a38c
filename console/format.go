package console

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/outboxgen/outboxgen/outbox"
)

// payloadView is a payload as the console shows it.
type payloadView struct {
	// Kind is "json", "text" or "binary".
	Kind string
	// Text is the payload formatted for its kind: indented JSON, the
	// text, or a hex dump. The template escapes it.
	Text string
	// Size is the payload's length in bytes, and Cut whether Text shows
	// only its first maxPayloadShown bytes.
	Size int
	Cut  bool
}

// maxPayloadShown is how much of a payload a page shows.
const maxPayloadShown = 64 << 10

// formatPayload shows p as indented JSON when it is JSON, as text when it
// is printable UTF-8, and otherwise as a hex dump.
func formatPayload(p []byte) payloadView {
	v := payloadView{Size: len(p)}
	if json.Valid(p) && len(p) > 0 {
		var b bytes.Buffer
		if err := json.Indent(&b, p, "", "  "); err == nil && b.Len() <= maxPayloadShown {
			v.Kind, v.Text = "json", b.String()
			return v
		}
	}
	shown := p
	if len(shown) > maxPayloadShown {
		shown, v.Cut = shown[:maxPayloadShown], true
	}
	if printable(shown) {
		v.Kind, v.Text = "text", string(shown)
		return v
	}
	v.Kind, v.Text = "binary", hex.Dump(shown)
	return v
}

// printable reports whether b is UTF-8 text without control characters
// other than whitespace (a cut may split the last character).
func printable(b []byte) bool {
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 {
			return len(b) < utf8.UTFMax && !utf8.FullRune(b)
		}
		if unicode.IsControl(r) && !unicode.IsSpace(r) {
			return false
		}
		b = b[n:]
	}
	return true
}

// preview is the start of a payload's text on one line, for lists: it
// reads at most the bytes n characters can take, however long the payload.
func preview(p []byte, n int) string { return previewOf(p, len(p), n) }

// previewBytes is how many bytes of a payload a list's preview of n
// characters reads.
func previewBytes(n int) int { return n * utf8.UTFMax }

// previewOf is preview for a payload of size bytes of which p holds the
// start (a list reads only that much of it).
func previewOf(p []byte, size, n int) string {
	head := p[:min(len(p), previewBytes(n))]
	if !printable(head) {
		return fmt.Sprintf("(%d bytes of binary)", size)
	}
	s := clip(strings.Join(strings.Fields(string(head)), " "), n)
	if len(head) < size && !strings.HasSuffix(s, "…") {
		s += "…"
	}
	return s
}

// clip cuts s to at most n runes, marking a cut with an ellipsis.
func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "…"
}

// num formats n with thousands separators.
func num(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// count formats a count that stops at limit: at the limit it is a lower
// bound.
func count(n, limit int64) string {
	if limit > 0 && n >= limit {
		return "≥ " + num(n)
	}
	return num(n)
}

// dur formats d for people: "850 ms", "12.4 s", "3 m 20 s", "2 h 5 m",
// "4 d 3 h".
func dur(d time.Duration) string {
	neg := d < 0
	if neg {
		d = -d
	}
	var s string
	switch {
	case d < 10*time.Millisecond:
		s = fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		s = fmt.Sprintf("%d ms", d.Milliseconds())
	case d < time.Minute:
		s = fmt.Sprintf("%.1f s", d.Seconds())
	case d < time.Hour:
		s = fmt.Sprintf("%d m %d s", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		s = fmt.Sprintf("%d h %d m", int(d.Hours()), int(d.Minutes())%60)
	default:
		s = fmt.Sprintf("%d d %d h", int(d.Hours())/24, int(d.Hours())%24)
	}
	if neg {
		return "−" + s
	}
	return s
}

// stamp formats t in UTC to the second, or "—" when it is zero.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}

// estimated is what a count capped at limit shows of its estimate (field
// of e, see outbox.DepthEstimate): " ≈ N (estimated)", or nothing when
// the count is under the cap or there is no estimate.
func estimated(n, limit int64, e *outbox.DepthEstimate, field string) string {
	if e == nil || limit <= 0 || n < limit {
		return ""
	}
	v := map[string]int64{"ready": e.Ready, "scheduled": e.Scheduled, "leased": e.Leased, "expired": e.Expired, "blocked": e.Blocked}[field]
	return " ≈ " + num(max(v, n)) + " (estimated)"
}
