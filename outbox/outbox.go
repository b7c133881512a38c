package outbox

import (
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"testing/fstest"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen"
	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/naming"
	"github.com/outboxgen/outboxgen/internal/wakeup"
)

// Outbox is one outbox table (and its dead-letter table) in one database.
// It is safe for concurrent use; create it once per table with [New] and
// share it between publishers and subscribers.
type Outbox struct {
	pool       *pgxpool.Pool
	naming     naming.Names
	sql        *naming.Cache
	migrations fstest.MapFS
	latest     int64 // the last migration's version

	// hubs are the LISTEN connections its running subscribers share, by
	// SubscriberConfig.ListenDSN ("" for the pool's settings).
	hubs wakeup.Hubs
}

// New validates cfg and returns the outbox it describes. It does not touch
// the database: call [Outbox.Migrate] to create the tables.
//
// An invalid configuration gives a *[ConfigError] naming the field and the
// rule it breaks.
func New(pool *pgxpool.Pool, cfg *Config) (*Outbox, error) {
	if pool == nil {
		return nil, &ConfigError{Field: "pool", Value: "<nil>", Rule: "must not be nil"}
	}
	n, migrations, err := resolveNames(cfg)
	if err != nil {
		return nil, err
	}
	var latest int64
	for name := range migrations {
		if v, ok := migrationVersion(name); ok {
			latest = max(latest, v)
		}
	}
	return &Outbox{
		pool:       pool,
		naming:     n,
		sql:        naming.NewCache(n),
		migrations: migrations,
		latest:     latest,
	}, nil
}

// resolveNames validates cfg's names and renders the migrations for them.
func resolveNames(cfg *Config) (naming.Names, fstest.MapFS, error) {
	c := cfg.withDefaults()
	n, err := newNaming(c.Schema, c.Table)
	if err != nil {
		return naming.Names{}, nil, err
	}
	migrations, err := renderMigrations(n)
	if err != nil {
		return naming.Names{}, nil, err
	}
	return n, migrations, nil
}

// Migrations returns the goose migrations of the outbox cfg describes,
// rendered for its schema and table: files named NNNNN_name.sql at the
// root of the returned file system, in goose's format. It validates cfg
// like [New] and touches no database. Migration tools and the
// outboxgen command write these into a repository of their own.
func Migrations(cfg *Config) (fs.FS, error) {
	_, m, err := resolveNames(cfg)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// renderMigrations renders the embedded migrations for n and checks that
// every identifier they derive fits PostgreSQL's limit.
func renderMigrations(n naming.Names) (fstest.MapFS, error) {
	out, idents, err := n.RenderMigrations(outboxgen.Migrations, outboxgen.MigrationsDir)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	for _, id := range append([]string{n.VersionTable()}, idents...) {
		if len(id) > naming.MaxIdentifierBytes {
			return nil, &ConfigError{Field: "Config.Table", Value: n.Table,
				Rule: fmt.Sprintf("derived name %q is %d bytes; PostgreSQL identifiers are at most %d",
					id, len(id), naming.MaxIdentifierBytes)}
		}
	}
	return out, nil
}

// Schema returns the schema that holds the outbox's tables.
func (o *Outbox) Schema() string { return o.naming.Schema }

// Table returns the outbox table's name, unqualified.
func (o *Outbox) Table() string { return o.naming.Table }

// DeadLetterTable returns the dead-letter table's name, unqualified.
func (o *Outbox) DeadLetterTable() string { return o.naming.Table + "_dlq" }

// Channel returns the LISTEN/NOTIFY channel on which the outbox's trigger
// announces new rows that are due now; each notification's payload is the
// queue name.
func (o *Outbox) Channel() string { return o.naming.Channel() }

// ScheduledChannel returns the channel on which the trigger announces rows
// inserted to be delivered later; the payload is the queue name.
func (o *Outbox) ScheduledChannel() string { return o.naming.ScheduledChannel() }

// queries returns the generated queries bound to conn (the pool, a
// connection or a transaction) and to this outbox's table.
func (o *Outbox) queries(conn db.DBTX) *db.Queries {
	return db.New(naming.DBTX{Inner: conn, Cache: o.sql})
}

// migrationVersion parses the number a migration file name starts with.
func migrationVersion(name string) (int64, bool) {
	num, _, ok := strings.Cut(path.Base(name), "_")
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(num, 10, 64)
	return v, err == nil
}
