package outbox

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgen/outboxgen/db"
)

// The SQL files are written for table outbox in schema public. Every
// identifier that depends on the configuration is preceded by a marker that
// sqlc keeps verbatim in the generated query text:
//
//	/*outbox:table*/outbox_dlq   schema-qualified derived name ("s"."t_dlq")
//	/*outbox:name*/outbox_pkey   unqualified derived name ("t_pkey")
//	/*outbox:schema*/public      the schema ("s")
//	/*outbox:literal*/'outbox_x' the schema-qualified derived name as a
//	                             string literal ('"s"."t_x"'), for functions
//	                             that take a relation by name (nextval)
//	/*outbox:channel*/'outbox_outbox[_suffix]'  the NOTIFY channel (plus
//	                             suffix) as a string literal
//	/*outbox:listen*/outbox_outbox[_suffix]     the same channel as an
//	                             identifier, for LISTEN (double-quoted when
//	                             the suffix needs it: "outbox_outbox:scheduled")
//
// Rendering replaces each marker and the token after it with the quoted
// name for one outbox. Names come only from validated configuration and are
// quoted, never concatenated raw.
var markerRE = regexp.MustCompile(`/\*outbox:([a-z]+)\*/('[^']*'|"[^"]*"|[A-Za-z_][A-Za-z0-9_]*)`)

// render rewrites every marker in sql and reports the identifiers it
// produced, so callers can check their length.
func (n naming) render(sql string) (string, []string, error) {
	var (
		idents []string
		bad    error
	)
	out := markerRE.ReplaceAllStringFunc(sql, func(m string) string {
		sub := markerRE.FindStringSubmatch(m)
		kind, tok := sub[1], sub[2]
		switch kind {
		case "schema":
			return pgx.Identifier{n.schema}.Sanitize()
		case "channel", "listen":
			suffix, ok := strings.CutPrefix(strings.Trim(tok, `'"`), "outbox_"+defaultTable)
			if !ok {
				bad = fmt.Errorf("outbox: marker %s: channel does not start with %q", m, "outbox_"+defaultTable)
				return m
			}
			ch := n.channel() + suffix
			idents = append(idents, ch)
			if kind == "listen" {
				return pgx.Identifier{ch}.Sanitize()
			}
			return quoteLiteral(ch)
		case "table", "name", "literal":
			name, ok := n.derive(strings.Trim(tok, "'"))
			if !ok {
				bad = fmt.Errorf("outbox: marker %s: name does not start with %q", m, defaultTable)
				return m
			}
			idents = append(idents, name)
			switch kind {
			case "table":
				return n.qualified(name)
			case "literal":
				return quoteLiteral(n.qualified(name))
			}
			return pgx.Identifier{name}.Sanitize()
		default:
			bad = fmt.Errorf("outbox: unknown marker %s", m)
			return m
		}
	})
	if bad != nil {
		return "", nil, bad
	}
	return out, idents, nil
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// sqlCache renders each generated query once per outbox. Queries are keyed
// by their text, which sqlc emits as package constants, so the cache holds
// one entry per statement.
type sqlCache struct {
	naming naming
	m      sync.Map // original SQL -> rendered SQL
}

func (c *sqlCache) get(sql string) (string, error) {
	if v, ok := c.m.Load(sql); ok {
		return v.(string), nil
	}
	out, _, err := c.naming.render(sql)
	if err != nil {
		return "", err
	}
	c.m.Store(sql, out)
	return out, nil
}

// renderedDBTX runs generated queries against the configured table: it
// renders their markers and maps COPY's table name.
type renderedDBTX struct {
	inner db.DBTX
	cache *sqlCache
}

var _ db.DBTX = renderedDBTX{}

func (d renderedDBTX) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	s, err := d.cache.get(sql)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return d.inner.Exec(ctx, s, args...)
}

func (d renderedDBTX) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	s, err := d.cache.get(sql)
	if err != nil {
		return nil, err
	}
	return d.inner.Query(ctx, s, args...)
}

func (d renderedDBTX) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	s, err := d.cache.get(sql)
	if err != nil {
		return errRow{err}
	}
	return d.inner.QueryRow(ctx, s, args...)
}

func (d renderedDBTX) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if len(table) != 1 {
		return 0, fmt.Errorf("outbox: COPY into %v: want an unqualified table name", table)
	}
	name, ok := d.cache.naming.derive(table[0])
	if !ok {
		return 0, fmt.Errorf("outbox: COPY into %q: name does not start with %q", table[0], defaultTable)
	}
	return d.inner.CopyFrom(ctx, pgx.Identifier{d.cache.naming.schema, name}, cols, src)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
