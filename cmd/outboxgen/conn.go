package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

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
		dsn:   fs.String("dsn", "", "database connection string (default $DATABASE_URL)"),
		names: nameFlags(fs),
	}
}

// open connects and returns the outbox the flags name; cmd prefixes errors.
func (c conn) open(ctx context.Context, cmd string, getenv func(string) string) (*outbox.Outbox, func(), error) {
	dsn := *c.dsn
	if dsn == "" {
		dsn = getenv("DATABASE_URL")
	}
	if dsn == "" {
		return nil, nil, fmt.Errorf("%w: %s: no database: set DATABASE_URL or pass -dsn", errUsage, cmd)
	}
	schema, table := c.resolve(getenv)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: -dsn/DATABASE_URL: %v", errUsage, cmd, err)
	}
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema, Table: table})
	if err != nil {
		pool.Close()
		var ce *outbox.ConfigError
		if errors.As(err, &ce) {
			return nil, nil, fmt.Errorf("%w: %s: %v", errUsage, cmd, err)
		}
		return nil, nil, err
	}
	return ob, pool.Close, nil
}
