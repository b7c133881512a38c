package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgen/outboxgen/db"
)

// errCaptured ends a generated query call whose text was captured.
var errCaptured = errors.New("captured")

// captureDBTX records the SQL text of a generated query instead of running
// it.
type captureDBTX struct{ sql string }

func (c *captureDBTX) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	c.sql = sql
	return pgconn.CommandTag{}, errCaptured
}

func (c *captureDBTX) Query(_ context.Context, sql string, _ ...any) (pgx.Rows, error) {
	c.sql = sql
	return nil, errCaptured
}

func (c *captureDBTX) QueryRow(_ context.Context, sql string, _ ...any) pgx.Row {
	c.sql = sql
	return errRow{}
}

func (c *captureDBTX) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, errCaptured
}

type errRow struct{}

func (errRow) Scan(...any) error { return errCaptured }

// librarySQL returns the text the library sends for the generated query
// that call makes, rendered for the outbox table of schema: the
// /*outbox:table*/ and /*outbox:name*/ markers the library replaces with
// the schema-qualified and bare names of its objects.
func librarySQL(schema string, call func(q *db.Queries)) (string, error) {
	var c captureDBTX
	call(db.New(&c))
	if c.sql == "" {
		return "", errors.New("the query sent no SQL")
	}
	return renderSQL(c.sql, schema)
}

var markerRE = regexp.MustCompile(`/\*outbox:([a-z]+)\*/(outbox[A-Za-z0-9_]*)`)

// renderSQL renders the markers of sql for the default table name
// (outbox) in schema. It refuses markers other than table and name.
func renderSQL(sql, schema string) (string, error) {
	var bad error
	out := markerRE.ReplaceAllStringFunc(sql, func(m string) string {
		sub := markerRE.FindStringSubmatch(m)
		switch sub[1] {
		case "table":
			return pgx.Identifier{schema, sub[2]}.Sanitize()
		case "name":
			return pgx.Identifier{sub[2]}.Sanitize()
		}
		bad = fmt.Errorf("cannot render marker %s", m)
		return m
	})
	if bad == nil && strings.Contains(out, "/*outbox:") {
		bad = fmt.Errorf("unrendered marker in %q", out)
	}
	return out, bad
}
