package outbox

import (
	"fmt"
	"log/slog"
	"time"
)

// Defaults of the [MigrateOption] values.
const (
	// MigrationLockTimeoutDefault is how long a statement of a migration
	// step waits for a lock before the step is rolled back and retried,
	// when [MigrateLockTimeout] is not given. Publishers and claims that
	// queue behind a waiting step wait at most about this long.
	MigrationLockTimeoutDefault = 2 * time.Second

	// MigrationRetryBudgetDefault is how long Migrate keeps retrying a step
	// whose locks are not granted, when [MigrateRetryBudget] is not given.
	MigrationRetryBudgetDefault = 5 * time.Minute
)

// A MigrateOption tunes how [Outbox.Migrate], [Outbox.MigrateDown] and
// [Outbox.MigrateDownTo] apply their steps under a live service. Options
// are validated before anything is changed: an invalid one gives an
// *[InputError] naming it.
type MigrateOption func(*migrateOptions)

// MigrateLockTimeout bounds how long any statement of a migration step
// waits for a lock (PostgreSQL's lock_timeout, set for the step's own
// transaction only). A step whose lock is not granted in time is rolled
// back, whole, and tried again after a backoff, so that the publishers
// and claims that queue behind its lock request wait at most about d,
// rather than as long as the transaction it waits for stays open.
//
// Zero means [MigrationLockTimeoutDefault]; a negative d is an error.
// It is rounded up to whole milliseconds.
func MigrateLockTimeout(d time.Duration) MigrateOption {
	return func(o *migrateOptions) {
		if d < 0 {
			o.fail(&InputError{Field: "MigrateLockTimeout", Rule: fmt.Sprintf(
				"got %v; must be positive, or 0 for MigrationLockTimeoutDefault (%v)", d, MigrationLockTimeoutDefault)})
			return
		}
		o.lockTimeout = d
	}
}

// MigrateRetryBudget bounds how long a step whose locks are not granted
// within the lock timeout is retried: tries, each followed by an
// exponential backoff with jitter, go on while the next one can start
// within d of the step's first try. When it is spent, the migration
// stops with a *[MigrationLockError] naming the step, its tries and what
// held the lock; the steps before it stay applied.
//
// Zero means [MigrationRetryBudgetDefault]; a negative d is an error. A
// budget shorter than the lock timeout gives a step one try.
func MigrateRetryBudget(d time.Duration) MigrateOption {
	return func(o *migrateOptions) {
		if d < 0 {
			o.fail(&InputError{Field: "MigrateRetryBudget", Rule: fmt.Sprintf(
				"got %v; must be positive, or 0 for MigrationRetryBudgetDefault (%v)", d, MigrationRetryBudgetDefault)})
			return
		}
		o.retryBudget = d
	}
}

// MigrateLogger receives the migration's logs: a warning before each
// retry of a step whose lock was not granted, naming the sessions that
// held it (pid, application_name, state, how long their transaction has
// been open, and the start of their statement). Nil means slog.Default().
func MigrateLogger(l *slog.Logger) MigrateOption {
	return func(o *migrateOptions) { o.log = l }
}

// migrateOptions are the resolved MigrateOption values.
type migrateOptions struct {
	lockTimeout time.Duration
	retryBudget time.Duration
	log         *slog.Logger
	// err is the first invalid option's error.
	err error
}

func (o *migrateOptions) fail(err error) {
	if o.err == nil {
		o.err = err
	}
}

// resolveMigrateOptions applies opts over the defaults and returns the
// first invalid option's error.
func resolveMigrateOptions(opts []MigrateOption) (*migrateOptions, error) {
	o := &migrateOptions{}
	for _, opt := range opts {
		if opt != nil {
			opt(o)
		}
	}
	if o.err != nil {
		return nil, o.err
	}
	if o.lockTimeout == 0 {
		o.lockTimeout = MigrationLockTimeoutDefault
	}
	// lock_timeout counts whole milliseconds, and 0 there means no limit.
	o.lockTimeout = (o.lockTimeout + time.Millisecond - 1).Truncate(time.Millisecond)
	if o.retryBudget == 0 {
		o.retryBudget = MigrationRetryBudgetDefault
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	return o, nil
}
