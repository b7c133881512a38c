package outbox

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
)

// lastErrorMaxRunes caps the error text stored with a row (last_error of
// the outbox and its dead-letter table).
const lastErrorMaxRunes = 2048

// errorText returns err's text in a form the database always stores:
// valid UTF-8, no NUL, at most lastErrorMaxRunes characters. An Error
// method that panics (a typed nil pointer, say) gives a text naming the
// type instead of a crash.
func errorText(err error) (text string) {
	if err == nil {
		return ""
	}
	defer func() {
		if p := recover(); p != nil {
			text = storableText(fmt.Sprintf("error of type %T whose Error method panicked: %v", err, p))
		}
	}()
	return storableText(err.Error())
}

// storableText makes s storable as PostgreSQL text: invalid UTF-8 and NUL
// (which text cannot hold) become U+FFFD, and s is cut to
// lastErrorMaxRunes characters.
func storableText(s string) string {
	if len(s) <= lastErrorMaxRunes && utf8.ValidString(s) && !strings.Contains(s, "\x00") {
		return s
	}
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	n := 0
	for i := range s {
		if n == lastErrorMaxRunes {
			return s[:i]
		}
		n++
	}
	return s
}

// sqlState returns err's SQLSTATE, or "" when it has none.
func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}
