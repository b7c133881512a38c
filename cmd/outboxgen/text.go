package main

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Names, keys, headers and error texts come from the database, where any
// client may have written them: they can hold tabs and newlines that break
// a table, and escape sequences a terminal would obey. What the commands
// print is shown as it is only when it is printable; anything else is
// quoted as a Go string, escapes visible.

// cell is s for one cell of a table: as it is when it is non-empty,
// printable UTF-8 (spaces allowed), else quoted.
func cell(s string) string {
	if s == "" || !printable(s, "") {
		return strconv.Quote(s)
	}
	return s
}

// block is s for a block of text of its own (a payload, an error): as it
// is when it is printable UTF-8, where newlines and tabs are allowed, else
// quoted.
func block(s string) string {
	if !printable(s, "\n\t") {
		return strconv.Quote(s)
	}
	return s
}

// printable reports whether s is valid UTF-8 whose every character is
// printable or in allowed.
func printable(s, allowed string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool {
		return !unicode.IsPrint(r) && !strings.ContainsRune(allowed, r)
	})
}

// shellQuote is s as one word for a POSIX shell, single-quoted, when it
// is printable UTF-8; else quoted as a Go string, escapes visible (a
// command line to read, not to paste).
func shellQuote(s string) string {
	if !printable(s, "") {
		return strconv.Quote(s)
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
