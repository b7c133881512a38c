package dbx

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// panickyError's Error method panics with its text.
type panickyError struct{ text string }

func (e panickyError) Error() string { panic(e.text) }

// FuzzStorableText checks the text stored as a row's last_error, whatever
// an error says: valid UTF-8 without NUL, at most LastErrorMaxRunes
// characters (so within the dead-letter table's 8,192-byte check), a
// prefix of the text with only invalid bytes and NUL replaced, unchanged
// when it is storable already, and unchanged by a second pass. An Error
// method that panics gives such a text too.
func FuzzStorableText(f *testing.F) {
	for _, s := range []string{
		"", "plain", "nul\x00byte", "bad \xff utf8", "\xed\xa0\x80", "\xf4\x90\x80\x80", "a\xc3", "\x00\x00",
		"\uFFFD", strings.Repeat("é", LastErrorMaxRunes+1), strings.Repeat("x", LastErrorMaxRunes) + "\xff",
		strings.Repeat("😀", LastErrorMaxRunes) + "\x00", strings.Repeat("\xff", 3*LastErrorMaxRunes),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := StorableText(s)
		checkStorable(t, s, got)
		if utf8.ValidString(s) && !strings.Contains(s, "\x00") && utf8.RuneCountInString(s) <= LastErrorMaxRunes && got != s {
			t.Fatalf("StorableText(%q) = %q; want it unchanged", s, got)
		}
		clean := strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
		if !strings.HasPrefix(clean, got) {
			t.Fatalf("StorableText(%q) = %q; want a prefix of %q", s, got, clean)
		}
		if utf8.RuneCountInString(clean) > LastErrorMaxRunes && utf8.RuneCountInString(got) != LastErrorMaxRunes {
			t.Fatalf("StorableText(%q) has %d characters; a long text is cut to %d", s, utf8.RuneCountInString(got), LastErrorMaxRunes)
		}
		if again := StorableText(got); again != got {
			t.Fatalf("storableText is not idempotent: %q, then %q", got, again)
		}
		if e := ErrorText(errors.New(s)); e != got {
			t.Fatalf("ErrorText(errors.New(%q)) = %q; want %q", s, e, got)
		}
		checkStorable(t, s, ErrorText(panickyError{s}))
	})
}

func checkStorable(t *testing.T, in, got string) {
	t.Helper()
	switch {
	case !utf8.ValidString(got):
		t.Fatalf("text of %q is %q: not valid UTF-8", in, got)
	case strings.Contains(got, "\x00"):
		t.Fatalf("text of %q is %q: holds NUL", in, got)
	case utf8.RuneCountInString(got) > LastErrorMaxRunes:
		t.Fatalf("text of %q has %d characters; at most %d", in, utf8.RuneCountInString(got), LastErrorMaxRunes)
	case len(got) > 4*LastErrorMaxRunes:
		t.Fatalf("text of %q is %d bytes; the dead-letter table holds %d", in, len(got), 4*LastErrorMaxRunes)
	}
}
