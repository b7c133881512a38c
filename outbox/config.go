package outbox

// Defaults of [Config].
const (
	// SchemaDefault is the schema of the outbox tables when Config.Schema is empty.
	SchemaDefault = "public"
	// TableDefault is the outbox table's name when Config.Table is empty.
	TableDefault = "outbox"
)

// Config says where an outbox lives. The zero value (or a nil *Config)
// means table outbox in schema public.
//
// Names are validated by [New]: lower-case letters, digits and underscores,
// not starting with a digit or "pg_", and short enough that every name
// derived from them fits PostgreSQL's 63-byte identifier limit:
//
//	<Table>                 the outbox table
//	<Table>_dlq             the dead-letter table
//	<Table>_pending_idx ... indexes and constraints of both tables
//	<Table>_notify          the NOTIFY trigger function (and _notify_trg)
//	<Table>_goose_version   the migration version table
//	outbox_<Table>          the NOTIFY channel in schema public,
//	outbox_<Schema>.<Table> the NOTIFY channel in any other schema,
//	<channel>:scheduled     the channel for rows due later
type Config struct {
	// Schema holds the outbox's tables, function and migration history.
	// [Outbox.Migrate] creates it when it does not exist. It must not be an
	// SQL reserved word. Default: SchemaDefault ("public").
	Schema string

	// Table names the outbox table; derived names extend it with a suffix.
	// Default: TableDefault ("outbox").
	Table string
}

// withDefaults returns a copy of c with every empty field set to its default.
func (c *Config) withDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Schema == "" {
		out.Schema = SchemaDefault
	}
	if out.Table == "" {
		out.Table = TableDefault
	}
	return out
}
