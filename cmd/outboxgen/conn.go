package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/outbox"
)

// conn holds the flags every database command shares.
type conn struct {
	dsn, schema, table *string
}

func connFlags(fs *flag.FlagSet) conn {
	return conn{
		dsn:    fs.String("dsn", "", "database connection string (default $DATABASE_URL)"),
		schema: fs.String("schema", outbox.SchemaDefault, "schema of the outbox tables"),
		table:  fs.String("table", outbox.TableDefault, "name of the outbox table"),
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
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: -dsn/DATABASE_URL: %v", errUsage, cmd, err)
	}
	ob, err := outbox.New(pool, &outbox.Config{Schema: *c.schema, Table: *c.table})
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
