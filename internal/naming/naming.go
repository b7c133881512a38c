// Package naming derives the identifiers of one outbox (its tables,
// indexes, functions and NOTIFY channels) from its schema and table, and
// renders the reviewed SQL (the migrations, and the generated queries in
// db) for them. It imports only pgx and db.
package naming

import (
	"context"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path"
	"regexp"
	"strings"
	"sync"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgen/outboxgen/db"
)

// MaxIdentifierBytes is PostgreSQL's NAMEDATALEN-1: longer identifiers are
// silently truncated, which would make two outboxes share an index or a
// channel. Every derived name is checked against it.
const MaxIdentifierBytes = 63

// DefaultTable is the table name the SQL files are written for; derived
// names keep its suffix (outbox_dlq -> orders_dlq).
const DefaultTable = "outbox"

// Names derives every identifier of one outbox from its schema and table,
// which package outbox has validated.
type Names struct {
	Schema string
	Table  string
}

// Derive maps a name written for the default table to this outbox's name.
func (n Names) Derive(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, DefaultTable)
	if !ok {
		return "", false
	}
	return n.Table + rest, true
}

// Channel is the LISTEN/NOTIFY channel: outbox_<table> in schema public,
// outbox_<schema>.<table> elsewhere. The dot cannot occur in a valid schema
// or table name, so two outboxes never share a channel.
func (n Names) Channel() string {
	if n.Schema == "public" {
		return "outbox_" + n.Table
	}
	return "outbox_" + n.Schema + "." + n.Table
}

// ScheduledChannel carries the queue names of rows due later. The colon
// cannot occur in a schema or table name, so no outbox's due channel is
// another's scheduled channel (outbox foo's and outbox foo_scheduled's, say).
func (n Names) ScheduledChannel() string { return n.Channel() + ScheduledSuffix }

// HandoffChannel carries the queue names of ordering-key hand-overs the
// deleting transaction recorded instead of completing.
func (n Names) HandoffChannel() string { return n.Channel() + HandoffSuffix }

// HandoffSuffix turns a due channel into its hand-over channel.
const HandoffSuffix = ":handoff"

// ProbeChannel carries the NOTIFY probes of Health and of subscribers'
// LISTEN connections.
func (n Names) ProbeChannel() string { return n.Channel() + ":probe" }

// ScheduledSuffix turns a due channel into its scheduled channel; the
// migrations write it after the channel marker.
const ScheduledSuffix = ":scheduled"

// VersionTable is goose's version table, one per outbox so two outboxes in
// one database keep separate migration histories. goose uses the name
// verbatim (schema-qualified), which the identifier rules above make safe.
func (n Names) VersionTable() string {
	return n.Table + "_goose_version"
}

// LockID is the advisory lock goose holds while migrating this outbox:
// concurrent migrations of one outbox serialise, different outboxes do not.
func (n Names) LockID() int64 {
	h := fnv.New64a()
	h.Write([]byte("outboxgen:" + n.Schema + "." + n.Table))
	return int64(h.Sum64() >> 1)
}

func (n Names) Qualified(name string) string {
	return pgx.Identifier{n.Schema, name}.Sanitize()
}

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
var Marker = regexp.MustCompile(`/\*outbox:([a-z]+)\*/('[^']*'|"[^"]*"|[A-Za-z_][A-Za-z0-9_]*)`)

// Render rewrites every marker in sql and reports the identifiers it
// produced, so callers can check their length.
func (n Names) Render(sql string) (string, []string, error) {
	var (
		idents []string
		bad    error
	)
	out := Marker.ReplaceAllStringFunc(sql, func(m string) string {
		sub := Marker.FindStringSubmatch(m)
		kind, tok := sub[1], sub[2]
		switch kind {
		case "schema":
			return pgx.Identifier{n.Schema}.Sanitize()
		case "channel", "listen":
			suffix, ok := strings.CutPrefix(strings.Trim(tok, `'"`), "outbox_"+DefaultTable)
			if !ok {
				bad = fmt.Errorf("outbox: marker %s: channel does not start with %q", m, "outbox_"+DefaultTable)
				return m
			}
			ch := n.Channel() + suffix
			idents = append(idents, ch)
			if kind == "listen" {
				return pgx.Identifier{ch}.Sanitize()
			}
			return QuoteLiteral(ch)
		case "table", "name", "literal":
			name, ok := n.Derive(strings.Trim(tok, "'"))
			if !ok {
				bad = fmt.Errorf("outbox: marker %s: name does not start with %q", m, DefaultTable)
				return m
			}
			idents = append(idents, name)
			switch kind {
			case "table":
				return n.Qualified(name)
			case "literal":
				return QuoteLiteral(n.Qualified(name))
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

// QuoteLiteral quotes s as an SQL string literal.
func QuoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Cache renders each generated query once per outbox. Queries are keyed
// by their text, which sqlc emits as package constants, so the cache holds
// one entry per statement.
type Cache struct {
	names Names
	m     sync.Map // original SQL -> rendered SQL
}

// NewCache returns an empty cache of n's statements.
func NewCache(n Names) *Cache { return &Cache{names: n} }

// Get returns sql rendered for the cache's outbox.
func (c *Cache) Get(sql string) (string, error) {
	if v, ok := c.m.Load(sql); ok {
		return v.(string), nil
	}
	out, _, err := c.names.Render(sql)
	if err != nil {
		return "", err
	}
	c.m.Store(sql, out)
	return out, nil
}

// Queries returns the constructor of the generated queries of outbox n
// on a connection, a transaction or a pool, whose statements share one
// Cache.
func Queries(n Names) func(db.DBTX) *db.Queries {
	cache := NewCache(n)
	return func(c db.DBTX) *db.Queries { return db.New(DBTX{Inner: c, Cache: cache}) }
}

// DBTX runs generated queries against the configured table: it renders
// their markers and maps COPY's table name.
type DBTX struct {
	Inner db.DBTX
	Cache *Cache
}

var _ db.DBTX = DBTX{}

// Exec runs sql, rendered.
func (d DBTX) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	s, err := d.Cache.Get(sql)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return d.Inner.Exec(ctx, s, args...)
}

// Query runs sql, rendered.
func (d DBTX) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	s, err := d.Cache.Get(sql)
	if err != nil {
		return nil, err
	}
	return d.Inner.Query(ctx, s, args...)
}

// QueryRow runs sql, rendered.
func (d DBTX) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	s, err := d.Cache.Get(sql)
	if err != nil {
		return errRow{err}
	}
	return d.Inner.QueryRow(ctx, s, args...)
}

// CopyFrom copies into the outbox's table that table names.
func (d DBTX) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if len(table) != 1 {
		return 0, fmt.Errorf("outbox: COPY into %v: want an unqualified table name", table)
	}
	name, ok := d.Cache.names.Derive(table[0])
	if !ok {
		return 0, fmt.Errorf("outbox: COPY into %q: name does not start with %q", table[0], DefaultTable)
	}
	return d.Inner.CopyFrom(ctx, pgx.Identifier{d.Cache.names.Schema, name}, cols, src)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// RenderMigrations renders every .sql file of dir in fsys (the shipped
// migrations) for n, keyed by base name, and returns the identifiers the
// rendering produced, so the caller can check their length. An error
// names the step that failed: "list migrations", "read migration" or
// "render <file>".
func (n Names) RenderMigrations(fsys fs.FS, dir string) (fstest.MapFS, []string, error) {
	files, err := fs.Glob(fsys, path.Join(dir, "*.sql"))
	if err != nil {
		return nil, nil, fmt.Errorf("list migrations: %w", err)
	}
	out := make(fstest.MapFS, len(files))
	var idents []string
	for _, f := range files {
		src, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, nil, fmt.Errorf("read migration: %w", err)
		}
		text, names, err := n.Render(string(src))
		if err != nil {
			return nil, nil, fmt.Errorf("render %s: %w", f, err)
		}
		idents = append(idents, names...)
		out[path.Base(f)] = &fstest.MapFile{Data: []byte(text), Mode: 0o444}
	}
	return out, idents, nil
}
