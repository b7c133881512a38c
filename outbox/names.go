package outbox

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// maxIdentifierBytes is PostgreSQL's NAMEDATALEN-1: longer identifiers are
// silently truncated, which would make two outboxes share an index or a
// channel. Every derived name is checked against it.
const maxIdentifierBytes = 63

// defaultTable is the table name the SQL files are written for; derived
// names keep its suffix (outbox_dlq -> orders_dlq).
const defaultTable = "outbox"

// naming derives every identifier of one outbox from its schema and table.
type naming struct {
	schema string
	table  string
}

// checkIdentifier enforces the rule for Config.Schema and Config.Table:
// lower-case letters, digits and underscores, not starting with a digit.
// Such names mean the same quoted or unquoted, so an operator typing them
// into psql, and goose (which writes its version table name unquoted), see
// the same object the library does.
func checkIdentifier(field, v string) error {
	if v == "" {
		return &ConfigError{Field: field, Value: v, Rule: "must not be empty"}
	}
	if err := checkIdentifierBytes(field, v); err != nil {
		return err
	}
	for i, r := range v {
		ok := r == '_' || (r >= 'a' && r <= 'z') || (i > 0 && r >= '0' && r <= '9')
		if !ok {
			return &ConfigError{Field: field, Value: v,
				Rule: "must be lower-case letters, digits and underscores, not starting with a digit"}
		}
	}
	if strings.HasPrefix(v, "pg_") {
		return &ConfigError{Field: field, Value: v, Rule: `must not start with "pg_" (reserved by PostgreSQL)`}
	}
	return nil
}

// checkIdentifierBytes refuses v, a name that is quoted wherever it is
// used, when PostgreSQL would truncate it.
func checkIdentifierBytes(field, v string) error {
	if len(v) > maxIdentifierBytes {
		return &ConfigError{Field: field, Value: v,
			Rule: fmt.Sprintf("is %d bytes; PostgreSQL identifiers are at most %d", len(v), maxIdentifierBytes)}
	}
	return nil
}

// reservedWords are PostgreSQL's reserved key words and those that cannot
// name a schema (pg_get_keywords() categories R and T, PostgreSQL 15).
// A schema so named cannot be written unquoted, and goose writes it so.
var reservedWords = []string{
	"all", "analyse", "analyze", "and", "any", "array", "as", "asc", "asymmetric",
	"authorization", "binary", "both", "case", "cast", "check", "collate", "collation",
	"column", "concurrently", "constraint", "create", "cross", "current_catalog",
	"current_date", "current_role", "current_schema", "current_time", "current_timestamp",
	"current_user", "default", "deferrable", "desc", "distinct", "do", "else", "end",
	"except", "false", "fetch", "for", "foreign", "freeze", "from", "full", "grant",
	"group", "having", "ilike", "in", "initially", "inner", "intersect", "into", "is",
	"isnull", "join", "lateral", "leading", "left", "like", "limit", "localtime",
	"localtimestamp", "natural", "not", "notnull", "null", "offset", "on", "only", "or",
	"order", "outer", "overlaps", "placing", "primary", "references", "returning",
	"right", "select", "session_user", "similar", "some", "symmetric", "system_user",
	"table", "tablesample", "then", "to", "trailing", "true", "union", "unique", "user",
	"using", "variadic", "verbose", "when", "where", "window", "with",
}

func newNaming(schema, table string) (naming, error) {
	if err := checkIdentifier("Config.Schema", schema); err != nil {
		return naming{}, err
	}
	if slices.Contains(reservedWords, schema) {
		return naming{}, &ConfigError{Field: "Config.Schema", Value: schema, Rule: "must not be an SQL reserved word"}
	}
	if err := checkIdentifier("Config.Table", table); err != nil {
		return naming{}, err
	}
	return naming{schema: schema, table: table}, nil
}

// derive maps a name written for the default table to this outbox's name.
func (n naming) derive(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, defaultTable)
	if !ok {
		return "", false
	}
	return n.table + rest, true
}

// channel is the LISTEN/NOTIFY channel: outbox_<table> in schema public,
// outbox_<schema>.<table> elsewhere. The dot cannot occur in a valid schema
// or table name, so two outboxes never share a channel.
func (n naming) channel() string {
	if n.schema == "public" {
		return "outbox_" + n.table
	}
	return "outbox_" + n.schema + "." + n.table
}

// scheduledChannel carries the queue names of rows due later. The colon
// cannot occur in a schema or table name, so no outbox's due channel is
// another's scheduled channel (outbox foo's and outbox foo_scheduled's, say).
func (n naming) scheduledChannel() string { return n.channel() + scheduledSuffix }

// handoffChannel carries the queue names of ordering-key hand-overs the
// deleting transaction recorded instead of completing.
func (n naming) handoffChannel() string { return n.channel() + handoffSuffix }

const handoffSuffix = ":handoff"

// probeChannel carries the NOTIFY probes of Health and of subscribers'
// LISTEN connections.
func (n naming) probeChannel() string { return n.channel() + ":probe" }

// scheduledSuffix turns a due channel into its scheduled channel; the
// migrations write it after the channel marker.
const scheduledSuffix = ":scheduled"

// versionTable is goose's version table, one per outbox so two outboxes in
// one database keep separate migration histories. goose uses the name
// verbatim (schema-qualified), which the identifier rules above make safe.
func (n naming) versionTable() string {
	return n.table + "_goose_version"
}

// lockID is the advisory lock goose holds while migrating this outbox:
// concurrent migrations of one outbox serialise, different outboxes do not.
func (n naming) lockID() int64 {
	h := fnv.New64a()
	h.Write([]byte("outboxgen:" + n.schema + "." + n.table))
	return int64(h.Sum64() >> 1)
}

func (n naming) qualified(name string) string {
	return pgx.Identifier{n.schema, name}.Sanitize()
}
