package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// MigrationState is one migration and whether it is applied.
type MigrationState struct {
	// Version is the migration's number, from its file name.
	Version int64
	// Name is the migration's file name.
	Name string
	// Applied says whether the migration is applied.
	Applied bool
	// AppliedAt is when it was applied, zero when it is not.
	AppliedAt time.Time
}

// Migrate creates the outbox's schema if needed and applies every pending
// migration: the outbox table with its indexes, the dead-letter table and
// the NOTIFY trigger. It is idempotent and safe to call from many processes
// at once: a session advisory lock per outbox serialises them, and goose
// records what is applied in a version table of the outbox's own
// (<Table>_goose_version), so several outboxes in one database migrate
// independently.
func (o *Outbox) Migrate(ctx context.Context) error {
	if err := o.queries(o.pool).CreateSchema(ctx); err != nil {
		return fmt.Errorf("outbox: migrate: create schema %q: %w", o.naming.schema, err)
	}
	return o.withProvider(ctx, func(p *goose.Provider) error {
		_, err := p.Up(ctx)
		return err
	})
}

// MigrateDown rolls back every applied migration, dropping the trigger, the
// dead-letter table and the outbox table with every row they hold. The
// schema and goose's (then empty) version table stay. It is meant for
// development and tests; production rollbacks should be reviewed one
// migration at a time.
func (o *Outbox) MigrateDown(ctx context.Context) error {
	return o.MigrateDownTo(ctx, 0)
}

// MigrateDownTo rolls back the applied migrations numbered above version,
// newest first; version 0 means all of them, like [Outbox.MigrateDown].
func (o *Outbox) MigrateDownTo(ctx context.Context, version int64) error {
	if version < 0 {
		return &InputError{Field: "version", Rule: "must not be negative"}
	}
	return o.withProvider(ctx, func(p *goose.Provider) error {
		_, err := p.DownTo(ctx, version)
		return err
	})
}

// MigrationStatus reports every migration the library ships and whether it
// is applied to this outbox.
func (o *Outbox) MigrationStatus(ctx context.Context) ([]MigrationState, error) {
	var out []MigrationState
	err := o.withProvider(ctx, func(p *goose.Provider) error {
		st, err := p.Status(ctx)
		if err != nil {
			return err
		}
		for _, s := range st {
			out = append(out, MigrationState{
				Version:   s.Source.Version,
				Name:      s.Source.Path,
				Applied:   s.State == goose.StateApplied,
				AppliedAt: s.AppliedAt,
			})
		}
		return nil
	})
	return out, err
}

// withProvider runs fn with a goose provider over this outbox's rendered
// migrations and closes what it opened.
func (o *Outbox) withProvider(ctx context.Context, fn func(*goose.Provider) error) (err error) {
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(o.naming.lockID()),
		lock.WithLockTimeout(1, 300),
	)
	if err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	sqlDB := stdlib.OpenDBFromPool(o.pool)
	defer func() { err = errors.Join(err, closeDB(sqlDB)) }()
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, o.migrations,
		goose.WithTableName(o.naming.schema+"."+o.naming.versionTable()),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	if err := fn(p); err != nil {
		return fmt.Errorf("outbox: migrate %s.%s: %w", o.naming.schema, o.naming.table, err)
	}
	return nil
}

// closeDB closes the database/sql handle that wraps the pool; closing it
// returns its connections to the pool and leaves the pool open.
func closeDB(db *sql.DB) error {
	if err := db.Close(); err != nil {
		return fmt.Errorf("outbox: migrate: close: %w", err)
	}
	return nil
}
