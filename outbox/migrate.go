package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
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
// at once: an advisory lock per outbox serialises them (held by a
// transaction of its own, so it holds through a pooler in transaction
// mode; a pool of one connection holds it by session), and goose
// records what it applies in a version table of the outbox's own
// (<Table>_goose_version), so several outboxes in one database migrate
// independently.
//
// What is pending is judged by the schema itself, not only by that
// history: migrations applied by another tool (the files of `outboxgen
// migrations` run by a repository's own goose, say) count as applied, so
// Migrate is a no-op on an outbox that is up to date however it got there.
//
// Migrate never queues the service behind a step for long: each step's
// transaction waits at most the lock timeout for each lock it takes
// ([MigrateLockTimeout], default [MigrationLockTimeoutDefault]), so the
// publishers and claims that queue behind the step's lock request wait at
// most about that long. A step that times out is rolled back and tried
// again with exponential backoff and jitter, within a retry budget
// ([MigrateRetryBudget]); before each retry a warning names the sessions
// that held the lock ([MigrateLogger]). When the budget is spent it
// returns a *[MigrationLockError] naming the step, its tries and those
// sessions. Cancelling ctx ends a wait at once. Invalid options give an
// *[InputError] before anything is changed.
func (o *Outbox) Migrate(ctx context.Context, opts ...MigrateOption) error {
	mo, err := resolveMigrateOptions(opts)
	if err != nil {
		return err
	}
	if err := o.createSchema(ctx); err != nil {
		return err
	}
	have, err := o.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	if have >= o.latest {
		return nil
	}
	pending := make(fstest.MapFS)
	for name, f := range o.migrations {
		if v, _ := migrationVersion(name); v > have {
			pending[name] = f
		}
	}
	return o.withSteps(ctx, pending, mo, func(p *goose.Provider) error {
		_, err := p.Up(ctx)
		return err
	})
}

// createSchema creates the outbox's schema unless it exists. A schema
// that exists is left alone, so a migrator that owns it needs no CREATE
// privilege on the database. Concurrent callers race in the catalog even
// with IF NOT EXISTS; the loser's duplicate error means the schema is
// there.
func (o *Outbox) createSchema(ctx context.Context) error {
	exists, err := o.queries(o.pool).SchemaExists(ctx, pgx.Identifier{o.naming.Schema}.Sanitize())
	if err == nil && exists {
		return nil
	}
	if err == nil {
		err = o.queries(o.pool).CreateSchema(ctx)
	}
	if st := dbx.SQLState(err); st == "23505" || st == "42P06" {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("outbox: migrate: create schema %q: %w", o.naming.Schema, err)
	}
	return nil
}

// SchemaError reports an outbox schema that this library cannot use: it
// does not exist, or it is at another version than the library's
// migrations. Its message names the fix.
type SchemaError struct {
	// Schema and Table name the outbox.
	Schema, Table string
	// Version is the schema's version: the number of the last migration
	// applied to it, 0 when the outbox table does not exist.
	Version int64
	// Want is the version this library needs: its last migration's number.
	Want int64
}

// Error implements error.
func (e *SchemaError) Error() string {
	switch {
	case e.Version == 0:
		return fmt.Sprintf("outbox: %s.%s does not exist: run `outboxgen migrate up` or call Outbox.Migrate", e.Schema, e.Table)
	case e.Version < e.Want:
		return fmt.Sprintf("outbox: %s.%s is at schema version %d and this library needs %d: run `outboxgen migrate up` "+
			"(or call Outbox.Migrate), or regenerate your migrations with `outboxgen migrations` and apply them",
			e.Schema, e.Table, e.Version, e.Want)
	default:
		return fmt.Sprintf("outbox: %s.%s is at schema version %d, newer than this library's %d: upgrade the library",
			e.Schema, e.Table, e.Version, e.Want)
	}
}

// Check reports whether the outbox's schema exists at the version this
// library needs, whatever applied it. A missing or older (or newer) schema
// gives a *[SchemaError] naming the fix; a database error is returned
// wrapped. [Subscriber.Run] calls it before it starts; call it at service
// start to fail fast.
func (o *Outbox) Check(ctx context.Context) error {
	have, err := o.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	if e := o.schemaMismatch(have); e != nil {
		return e
	}
	return nil
}

// schemaMismatch returns the *SchemaError of a schema at version have, or
// nil when have is the version this library needs.
func (o *Outbox) schemaMismatch(have int64) *SchemaError {
	if have == o.latest {
		return nil
	}
	return &SchemaError{Schema: o.naming.Schema, Table: o.naming.Table, Version: have, Want: o.latest}
}

// SchemaVersion returns the version of the outbox's schema: the number of
// the last migration applied to it, by any tool, or 0 when the outbox
// table does not exist.
func (o *Outbox) SchemaVersion(ctx context.Context) (int64, error) {
	v, _, err := o.schemaState(ctx)
	return v, err
}

// LatestSchemaVersion returns the version this library's migrations bring
// an outbox to.
func (o *Outbox) LatestSchemaVersion() int64 { return o.latest }

// schemaState reads the version function the schema has had since
// migration 4, tells older schemas by the objects their migrations
// created, and reports whether this library's migration history (goose's
// version table) exists.
func (o *Outbox) schemaState(ctx context.Context) (version int64, history bool, err error) {
	n := o.naming
	q := o.queries(o.pool)
	objs, err := q.SchemaObjects(ctx, db.SchemaObjectsParams{
		TableName:   n.Qualified(n.Table),
		DlqName:     n.Qualified(n.Table + "_dlq"),
		SchemaName:  pgx.Identifier{n.Schema}.Sanitize(),
		NotifyFn:    n.Table + "_notify",
		VersionFn:   n.Table + "_schema_version",
		HistoryName: n.Qualified(n.VersionTable()),
	})
	if err != nil {
		return 0, false, fmt.Errorf("outbox: read the schema version of %s.%s: %w", n.Schema, n.Table, err)
	}
	switch {
	case objs.HasVersion:
		v, err := q.SchemaVersion(ctx)
		if err != nil {
			return 0, false, fmt.Errorf("outbox: read the schema version of %s.%s: %w", n.Schema, n.Table, err)
		}
		version = int64(v)
	case objs.HasNotify:
		version = 3
	case objs.HasDlq:
		version = 2
	case objs.HasTable:
		version = 1
	}
	return version, objs.HasHistory, nil
}

// MigrateDown rolls back every applied migration, dropping the trigger, the
// dead-letter table and the outbox table with every row they hold. The
// schema and goose's (then empty) version table stay. It is meant for
// development and tests; production rollbacks should be reviewed one
// migration at a time. Its steps wait for their locks as [Outbox.Migrate]'s
// do, tuned by the same options.
func (o *Outbox) MigrateDown(ctx context.Context, opts ...MigrateOption) error {
	return o.MigrateDownTo(ctx, 0, opts...)
}

// MigrateDownTo rolls back the applied migrations numbered above version,
// newest first; version 0 means all of them, like [Outbox.MigrateDown].
// It rolls back only what this library's Migrate (or outboxgen migrate)
// recorded applying; migrations another tool applied are that tool's to
// roll back. Its steps wait for their locks as [Outbox.Migrate]'s do,
// tuned by the same options.
func (o *Outbox) MigrateDownTo(ctx context.Context, version int64, opts ...MigrateOption) error {
	if version < 0 {
		return &InputError{Field: "version", Rule: "must not be negative"}
	}
	mo, err := resolveMigrateOptions(opts)
	if err != nil {
		return err
	}
	return o.withSteps(ctx, o.migrations, mo, func(p *goose.Provider) error {
		_, err := p.DownTo(ctx, version)
		return err
	})
}

// RollbackLoss is what rolling an outbox back to a version would drop with
// the tables it drops: see [Outbox.MigrateDownLoss].
type RollbackLoss struct {
	// Rows counts the outbox's rows, dropped with its table when the
	// rollback reaches version 0.
	Rows int64
	// DeadLetters counts the dead-lettered rows, dropped with the
	// dead-letter table when the rollback goes below version 2.
	DeadLetters int64
}

// MigrateDownLoss reports how many rows and dead-lettered rows
// [Outbox.MigrateDownTo] with version would drop with their tables, as
// the outbox stands now: zero for tables the rollback keeps or that do
// not exist. Rows written after it counts are dropped too; a caller that
// asks before a rollback (as outboxgen migrate does before it drops rows)
// should stop the outbox's writers first.
func (o *Outbox) MigrateDownLoss(ctx context.Context, version int64) (RollbackLoss, error) {
	var loss RollbackLoss
	if version < 0 {
		return loss, &InputError{Field: "version", Rule: "must not be negative"}
	}
	have, err := o.SchemaVersion(ctx)
	if err != nil {
		return loss, err
	}
	q := o.queries(o.pool)
	if version < 1 && have >= 1 {
		if loss.Rows, err = q.CountRows(ctx); err != nil {
			return loss, fmt.Errorf("outbox: MigrateDownLoss: %w", err)
		}
	}
	if version < 2 && have >= 2 {
		c, err := q.CountDeadLetters(ctx, countParams(DeadLetterFilter{}))
		if err != nil {
			return loss, fmt.Errorf("outbox: MigrateDownLoss: %w", err)
		}
		loss.DeadLetters = c.Total
	}
	return loss, nil
}

// MigrationStatus reports every migration the library ships and whether it
// is applied to this outbox. It changes nothing in the database. A migration counts as applied when the schema
// is at its version or later, whichever tool applied it; AppliedAt is
// known only for those this library's Migrate (or outboxgen migrate)
// applied, and zero for the rest.
func (o *Outbox) MigrationStatus(ctx context.Context) ([]MigrationState, error) {
	have, history, err := o.schemaState(ctx)
	if err != nil {
		return nil, err
	}
	var out []MigrationState
	if !history {
		// Nothing this library applied: the schema's version says it all,
		// and goose, asked, would create its version table.
		for name := range o.migrations {
			if v, ok := migrationVersion(name); ok {
				out = append(out, MigrationState{Version: v, Name: name, Applied: v <= have})
			}
		}
		slices.SortFunc(out, func(a, b MigrationState) int { return cmp.Compare(a.Version, b.Version) })
		return out, nil
	}
	err = o.withProvider(ctx, o.migrations, func(p *goose.Provider) error {
		st, err := p.Status(ctx)
		if err != nil {
			return err
		}
		for _, s := range st {
			out = append(out, MigrationState{
				Version:   s.Source.Version,
				Name:      s.Source.Path,
				Applied:   s.Source.Version <= have,
				AppliedAt: s.AppliedAt,
			})
		}
		return nil
	})
	return out, err
}

// withProvider runs fn with a goose provider over migrations (this
// outbox's rendered migrations, or some of them), holding the outbox's
// migration lock, and closes what it opened. Steps fn runs wait for locks
// as the default options say.
func (o *Outbox) withProvider(ctx context.Context, migrations fs.FS, fn func(*goose.Provider) error) error {
	mo, err := resolveMigrateOptions(nil)
	if err != nil {
		return err
	}
	return o.withSteps(ctx, migrations, mo, fn)
}

// withSteps is withProvider with the options mo: fn runs again, after a
// backoff, while the step it fails on timed out waiting for a lock (see
// retrySteps).
func (o *Outbox) withSteps(ctx context.Context, migrations fs.FS, mo *migrateOptions, fn func(*goose.Provider) error) (err error) {
	w := &stepWatch{lockTimeout: mo.lockTimeout}
	opts := []goose.ProviderOption{
		goose.WithTableName(o.naming.Schema + "." + o.naming.VersionTable()),
		goose.WithDisableGlobalRegistry(true),
	}
	if o.pool.Config().MaxConns < 2 {
		// No room for the lock's own connection beside goose's: the
		// session lock of earlier releases, on goose's connection.
		locker, err := lock.NewPostgresSessionLocker(
			lock.WithLockID(o.naming.LockID()),
			lock.WithLockTimeout(migrationLockPeriod, migrationLockTries),
		)
		if err != nil {
			return fmt.Errorf("outbox: migrate: %w", err)
		}
		opts = append(opts, goose.WithSessionLocker(locker))
	} else {
		// Taken before goose takes its connection, so that migrations
		// waiting for the lock never hold the connections its holder
		// needs.
		lockTx, unlock, err := o.lockMigrations(ctx)
		if err != nil {
			return fmt.Errorf("outbox: migrate %s.%s: %w", o.naming.Schema, o.naming.Table, err)
		}
		defer func() { err = errors.Join(err, unlock(context.WithoutCancel(ctx))) }()
		w.q = lockWatchOn(o, lockTx)
	}
	sqlDB := o.stepDB(w)
	defer func() { err = errors.Join(err, closeDB(sqlDB)) }()
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations, opts...)
	if err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	err = o.retrySteps(ctx, mo, w, func() error { return fn(p) })
	var le *MigrationLockError
	if err != nil && !errors.As(err, &le) {
		return fmt.Errorf("outbox: migrate %s.%s: %w", o.naming.Schema, o.naming.Table, err)
	}
	return err
}

// A migration waits for another migrator of the outbox for up to
// migrationLockTries tries, migrationLockPeriod seconds apart.
const (
	migrationLockPeriod = 1
	migrationLockTries  = 300
)

// lockMigrations takes the outbox's migration lock and returns the
// transaction that holds it and the function that releases it. The lock
// is the outbox's advisory lock, held by a transaction of its own, open
// on a pool connection of its own until the release. A lock held by the session, as goose's session locker
// holds it, is lost through a pooler in transaction mode (PgBouncer),
// which runs each transaction on any server connection: the unlock
// reaches another one and fails, and the lock stays behind on the first,
// held by no migration, until that server connection closes. An open
// transaction keeps its server connection. Session and transaction
// advisory locks of one id exclude each other, so releases that lock by
// session wait for this one, and it for them. A try that fails gives its
// connection back to the pool until the next.
func (o *Outbox) lockMigrations(ctx context.Context) (pgx.Tx, func(context.Context) error, error) {
	for try := 1; ; try++ {
		tx, err := o.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
		if err != nil {
			return nil, nil, fmt.Errorf("migration lock: %w", err)
		}
		r, err := o.queries(tx).MigrationLock(ctx, o.naming.LockID())
		if err == nil && r.Locked {
			return tx, func(ctx context.Context) error {
				if err := tx.Rollback(ctx); err != nil {
					return fmt.Errorf("migration unlock: %w", err)
				}
				return nil
			}, nil
		}
		rerr := tx.Rollback(context.WithoutCancel(ctx))
		switch {
		case err != nil:
			return nil, nil, errors.Join(fmt.Errorf("migration lock: %w", err), rerr)
		case try == migrationLockTries:
			return nil, nil, fmt.Errorf("migration lock: another migration held it for %d s", migrationLockPeriod*migrationLockTries)
		}
		if !dbx.Sleep(ctx, migrationLockPeriod*time.Second) {
			return nil, nil, fmt.Errorf("migration lock: %w", context.Cause(ctx))
		}
	}
}

// closeDB closes the database/sql handle that wraps the pool; closing it
// returns its connections to the pool and leaves the pool open.
func closeDB(db *sql.DB) error {
	if err := db.Close(); err != nil {
		return fmt.Errorf("outbox: migrate: close: %w", err)
	}
	return nil
}
