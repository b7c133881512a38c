package dbx

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
)

// LastErrorMaxRunes caps the error text stored with a row (last_error of
// the outbox and its dead-letter table).
const LastErrorMaxRunes = 2048

// ErrorText returns err's text in a form the database always stores:
// valid UTF-8, no NUL, at most LastErrorMaxRunes characters. An Error
// method that panics (a typed nil pointer, say) gives a text naming the
// type instead of a crash.
func ErrorText(err error) (text string) {
	if err == nil {
		return ""
	}
	defer func() {
		if p := recover(); p != nil {
			text = StorableText(fmt.Sprintf("error of type %T whose Error method panicked: %v", err, p))
		}
	}()
	return StorableText(err.Error())
}

// StorableText makes s storable as PostgreSQL text: invalid UTF-8 and NUL
// (which text cannot hold) become U+FFFD, and s is cut to
// LastErrorMaxRunes characters.
func StorableText(s string) string {
	if len(s) <= LastErrorMaxRunes && utf8.ValidString(s) && !strings.Contains(s, "\x00") {
		return s
	}
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	n := 0
	for i := range s {
		if n == LastErrorMaxRunes {
			return s[:i]
		}
		n++
	}
	return s
}

// SQLState returns err's SQLSTATE, or "" when it has none.
func SQLState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}
