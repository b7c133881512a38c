package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/outbox"
)

// names holds the -schema and -table flags, which fall back to
// $OUTBOX_SCHEMA and $OUTBOX_TABLE, then to the library's defaults.
type names struct {
	fs            *flag.FlagSet
	schema, table *string
}

func nameFlags(fs *flag.FlagSet) names {
	return names{
		fs:     fs,
		schema: fs.String("schema", "", "schema of the outbox tables (default $OUTBOX_SCHEMA, else "+outbox.SchemaDefault+")"),
		table:  fs.String("table", "", "name of the outbox table (default $OUTBOX_TABLE, else "+outbox.TableDefault+")"),
	}
}

// resolve returns the schema and table: a flag given on the command line
// wins over its environment variable, which wins over the default.
func (n names) resolve(getenv func(string) string) (schema, table string) {
	given := map[string]bool{}
	n.fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	pick := func(flagName string, v *string, env, def string) string {
		if given[flagName] {
			return *v
		}
		if e := getenv(env); e != "" {
			return e
		}
		return def
	}
	return pick("schema", n.schema, "OUTBOX_SCHEMA", outbox.SchemaDefault),
		pick("table", n.table, "OUTBOX_TABLE", outbox.TableDefault)
}

// conn holds the flags every database command shares.
type conn struct {
	names
	dsn *string
}

func connFlags(fs *flag.FlagSet) conn {
	return conn{
		dsn:   fs.String("dsn", "", "database connection string (default $DATABASE_URL, else PostgreSQL's client defaults: $PGHOST, $PGPORT, $PGDATABASE, $PGUSER, ...)"),
		names: nameFlags(fs),
	}
}

// pgEnv are the variables of PostgreSQL's client defaults that pgx reads,
// with the connection-string keyword each sets.
var pgEnv = [][2]string{
	{"PGHOST", "host"}, {"PGPORT", "port"}, {"PGDATABASE", "dbname"}, {"PGUSER", "user"},
	{"PGPASSWORD", "password"}, {"PGPASSFILE", "passfile"}, {"PGAPPNAME", "application_name"},
	{"PGCONNECT_TIMEOUT", "connect_timeout"}, {"PGSSLMODE", "sslmode"}, {"PGSSLKEY", "sslkey"},
	{"PGSSLCERT", "sslcert"}, {"PGSSLROOTCERT", "sslrootcert"}, {"PGSSLPASSWORD", "sslpassword"},
	{"PGTARGETSESSIONATTRS", "target_session_attrs"}, {"PGSERVICE", "service"},
	{"PGSERVICEFILE", "servicefile"}, {"PGOPTIONS", "options"},
}

// dsnOf returns the connection string the flags and environment give: -dsn,
// else $DATABASE_URL, else one built from the PG* variables (empty when
// none is set: pgx's, and libpq's, defaults), and where it came from.
func (c conn) dsnOf(getenv func(string) string) (dsn, source string) {
	if *c.dsn != "" {
		return *c.dsn, "-dsn"
	}
	if v := getenv("DATABASE_URL"); v != "" {
		return v, "DATABASE_URL"
	}
	var kv []string
	for _, e := range pgEnv {
		if v := getenv(e[0]); v != "" {
			kv = append(kv, e[1]+"='"+strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v)+"'")
		}
	}
	return strings.Join(kv, " "), pgDefaults
}

// pgDefaults names the source of a connection string built from
// PostgreSQL's client defaults.
const pgDefaults = "PostgreSQL's client defaults"

// target is what a database command looks at: an outbox in a database.
type target struct {
	ob   *outbox.Outbox
	pool *pgxpool.Pool
	// db names the database: user, host and port, database name.
	db string
	// source says where the connection string came from.
	source string
}

// where names the outbox and its database, for the first line of a
// command's output.
func (t *target) where() string {
	return fmt.Sprintf("outbox %s.%s in %s", t.ob.Schema(), t.ob.Table(), t.db)
}

// header prints where the command looks: as the first line of stdout, or,
// when stdout carries JSON, on stderr so that stdout stays one document.
func (t *target) header(stdout, stderr io.Writer, asJSON bool) {
	if asJSON {
		fmt.Fprintln(stderr, "outboxgen: "+t.where())
		return
	}
	fmt.Fprintln(stdout, t.where())
}

func (t *target) close() { t.pool.Close() }

// open connects, checks that the database answers, and returns the
// outbox the flags name; cmd prefixes errors.
func (c conn) open(ctx context.Context, cmd string, getenv func(string) string) (*target, error) {
	dsn, source := c.dsnOf(getenv)
	schema, table := c.resolve(getenv)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %s: %v", errUsage, cmd, source, err)
	}
	cc := cfg.ConnConfig
	t := &target{db: describeDB(cc.User, cc.Host, cc.Port, cc.Database), source: source}
	if source != "-dsn" {
		t.db += " (from " + source + ")"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", cmd, t.db, err)
	}
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema, Table: table})
	if err != nil {
		pool.Close()
		var ce *outbox.ConfigError
		if errors.As(err, &ce) {
			return nil, fmt.Errorf("%w: %s: %s", errUsage, cmd, libText(err))
		}
		return nil, err
	}
	t.ob, t.pool = ob, pool
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		where := t.db
		if source == pgDefaults {
			where = strings.TrimSuffix(where, ")") + "; set DATABASE_URL, pass -dsn, or set PGHOST, PGPORT, PGDATABASE and PGUSER)"
		}
		return nil, fmt.Errorf("%s: cannot reach %s: %w", cmd, where, err)
	}
	return t, nil
}

// describeDB names a database as user@host:port/dbname.
func describeDB(user, host string, port uint16, database string) string {
	return fmt.Sprintf("%s@%s/%s", user, net.JoinHostPort(host, strconv.Itoa(int(port))), database)
}

// openOutbox opens the outbox the flags name (open), prints where the
// command cmd looks (header) and fails when the outbox does not exist
// (requireOutbox); the caller closes the target.
func (c conn) openOutbox(ctx context.Context, cmd string, getenv func(string) string, stdout, stderr io.Writer, asJSON bool) (*target, error) {
	t, err := c.open(ctx, cmd, getenv)
	if err != nil {
		return nil, err
	}
	t.header(stdout, stderr, asJSON)
	if err := t.requireOutbox(ctx, cmd); err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

// requireOutbox fails when the outbox does not exist, naming the database
// and the outboxes that do exist there, so that an operator who forgot
// -schema or -table is not sent to create an empty one.
func (t *target) requireOutbox(ctx context.Context, cmd string) error {
	v, err := t.ob.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	if v > 0 {
		return nil
	}
	return t.missing(ctx, cmd)
}

// missing is the error of a command pointed at an outbox that does not
// exist.
func (t *target) missing(ctx context.Context, cmd string) error {
	msg := fmt.Sprintf("%s: no outbox %s.%s in %s", cmd, t.ob.Schema(), t.ob.Table(), t.db)
	return errors.New(msg + "; " + t.others(ctx))
}

// others lists the outboxes the database holds, naming the flags that
// select one, or says that there is none and how to create one.
func (t *target) others(ctx context.Context) string {
	all, err := t.ob.Outboxes(ctx)
	if err != nil {
		return fmt.Sprintf("listing the database's outboxes failed: %v", err)
	}
	// The likeliest meant first: those of the schema asked for, then
	// those of the table name asked for.
	rank := func(n outbox.OutboxName) int {
		switch {
		case n.Schema == t.ob.Schema():
			return 0
		case n.Table == t.ob.Table():
			return 1
		}
		return 2
	}
	slices.SortStableFunc(all, func(a, b outbox.OutboxName) int { return cmp.Compare(rank(a), rank(b)) })
	if len(all) == 0 {
		return fmt.Sprintf("the database holds no outbox: `outboxgen migrate up -schema %s -table %s` creates this one",
			t.ob.Schema(), t.ob.Table())
	}
	var b strings.Builder
	fmt.Fprintf(&b, "the database holds %d outbox%s (choose with -schema and -table, or OUTBOX_SCHEMA and OUTBOX_TABLE):",
		len(all), pluralES(len(all)))
	for i, n := range all {
		if i == maxListed {
			fmt.Fprintf(&b, "\n  and %d more", len(all)-maxListed)
			break
		}
		fmt.Fprintf(&b, "\n  %s  (-schema %s -table %s)", n, n.Schema, n.Table)
	}
	return b.String()
}

// libText is the text of a library error without the "outbox: " its
// messages start with, for a message that names the command instead:
// "migrate up: Config.Table ..." rather than "migrate up: outbox: Config.Table ...".
func libText(err error) string { return strings.TrimPrefix(err.Error(), "outbox: ") }

// maxListed caps the outboxes an error lists.
const maxListed = 20

// pluralES returns "es" unless n is 1.
func pluralES(n int) string {
	if n == 1 {
		return ""
	}
	return "es"
}
