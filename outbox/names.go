package outbox

import (
	"fmt"
	"slices"
	"strings"

	"github.com/outboxgen/outboxgen/internal/naming"
)

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
	if len(v) > naming.MaxIdentifierBytes {
		return &ConfigError{Field: field, Value: v,
			Rule: fmt.Sprintf("is %d bytes; PostgreSQL identifiers are at most %d", len(v), naming.MaxIdentifierBytes)}
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

// newNaming validates schema and table and returns their names.
func newNaming(schema, table string) (naming.Names, error) {
	if err := checkIdentifier("Config.Schema", schema); err != nil {
		return naming.Names{}, err
	}
	if slices.Contains(reservedWords, schema) {
		return naming.Names{}, &ConfigError{Field: "Config.Schema", Value: schema, Rule: "must not be an SQL reserved word"}
	}
	if err := checkIdentifier("Config.Table", table); err != nil {
		return naming.Names{}, err
	}
	return naming.Names{Schema: schema, Table: table}, nil
}
