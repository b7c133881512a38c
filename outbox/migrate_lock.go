package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
)

// How a migration step's lock is waited for.
//
// Schema changes take ACCESS EXCLUSIVE locks (ALTER TABLE, CREATE and DROP
// TRIGGER, ...). A request for one waits behind every transaction that
// holds any lock on the table, a claim or a long read, and every later
// request, a publisher's INSERT included, queues behind the waiting
// request. So each step's transaction starts by setting lock_timeout for
// itself (BeginMigrationStep, through set_config(..., true)): a step that
// cannot have its lock within the timeout fails with lock_not_available
// (55P03), goose rolls the step's transaction back, releasing whatever the
// step had taken, the queue behind it drains, and the step is tried again
// after a backoff.
//
// Goose runs each migration in a transaction of its own (the library's
// migrations are all transactional; a step marked NO TRANSACTION would run
// under the session's own lock_timeout), but offers no hook inside it. The
// setting is therefore made by the database/sql connection goose migrates
// on: stepConn begins each transaction and runs BeginMigrationStep in it.
// Setting lock_timeout for goose's whole session instead would leak it,
// through a pooler in transaction mode, into whichever client uses that
// server connection next; the library sets only transaction-local settings.

// migrationRetryMax caps the backoff between two tries of a step.
const migrationRetryMax = 30 * time.Second

// migrationSampleTimeout bounds one read of what a step waits for.
const migrationSampleTimeout = 5 * time.Second

// LockHolder is a session a migration step waited for: one of the
// pg_blocking_pids of the step's backend while its lock request waited.
type LockHolder struct {
	// PID is the session's backend process id (pg_stat_activity.pid); a
	// DBA may end it with pg_terminate_backend.
	PID int32
	// ApplicationName and User are the session's application_name and
	// role.
	ApplicationName, User string
	// State is pg_stat_activity.state: "idle in transaction" for a
	// transaction left open between statements, "active" for one running a
	// statement. Empty when the role may not see it.
	State string
	// XactAge is how long the session's transaction had been open.
	XactAge time.Duration
	// Query is the start of the session's current or last statement, at
	// most 200 characters.
	Query string
}

// String describes the holder in one line, as the logs and
// [MigrationLockError] do.
func (h LockHolder) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pid %d (", h.PID)
	var parts []string
	if h.ApplicationName != "" {
		parts = append(parts, fmt.Sprintf("application_name %q", h.ApplicationName))
	}
	if h.User != "" {
		parts = append(parts, "user "+h.User)
	}
	if h.State != "" {
		parts = append(parts, h.State)
	}
	parts = append(parts, "transaction open "+h.XactAge.Round(time.Millisecond).String())
	b.WriteString(strings.Join(parts, ", "))
	b.WriteString(")")
	if q := strings.Join(strings.Fields(h.Query), " "); q != "" {
		fmt.Fprintf(&b, ": %s", q)
	}
	return b.String()
}

// MigrationLockError reports a migration step whose locks were not
// granted within the lock timeout on any try of its retry budget (see
// [MigrateLockTimeout] and [MigrateRetryBudget]). Nothing of that step was
// applied; the steps before it were.
type MigrationLockError struct {
	// Schema and Table name the outbox.
	Schema, Table string
	// Version and Name are the step's migration number and file name.
	Version int64
	Name    string
	// Down is set when the step was a rollback.
	Down bool
	// Tries is how many times the step was tried; Elapsed is the time
	// from its first try to the end of its last.
	Tries   int
	Elapsed time.Duration
	// LockTimeout is the lock timeout of each try.
	LockTimeout time.Duration
	// WaitedFor names the lock the step last waited for, such as
	// "AccessExclusiveLock on billing.events"; empty when it was not seen.
	WaitedFor string
	// Holders are the sessions last seen holding what the step waited
	// for; empty when none was seen (with a pool of one connection, none
	// can be).
	Holders []LockHolder
	// Err is the last try's error (SQLSTATE 55P03, lock_not_available).
	Err error
}

// Error implements error.
func (e *MigrationLockError) Error() string {
	dir := "step"
	if e.Down {
		dir = "rollback of"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "outbox: migrate %s.%s: %s %s: its locks were not granted within the lock timeout (%v) in %d %s over %v",
		e.Schema, e.Table, dir, e.Name, e.LockTimeout, e.Tries, pluralize(e.Tries, "try", "tries"), e.Elapsed.Round(time.Millisecond))
	if e.WaitedFor != "" {
		fmt.Fprintf(&b, "; it waited for %s", e.WaitedFor)
	}
	if len(e.Holders) == 0 {
		b.WriteString("; what held it was not seen")
	} else {
		b.WriteString(", held by ")
		b.WriteString(holderList(e.Holders))
	}
	b.WriteString("; to proceed, end that transaction (or let it finish) and migrate again, or give the migration a longer retry budget (MigrateRetryBudget, outboxgen migrate -lock-retry-for)")
	return b.String()
}

// Unwrap returns the last try's error.
func (e *MigrationLockError) Unwrap() error { return e.Err }

// holderList describes holders in one line.
func holderList(hs []LockHolder) string {
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = h.String()
	}
	return strings.Join(parts, "; ")
}

func pluralize(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// stepDB returns a database/sql handle over the pool whose transactions
// each begin with BeginMigrationStep (lock_timeout for that transaction)
// and are watched by w while they are open. Closing it returns its
// connections to the pool and leaves the pool open.
func (o *Outbox) stepDB(w *stepWatch) *sql.DB {
	c := &stepConnector{Connector: stdlib.GetPoolConnector(o.pool), o: o, w: w}
	sqlDB := sql.OpenDB(c)
	// As stdlib.OpenDBFromPool does: idle connections belong in the pool.
	sqlDB.SetMaxIdleConns(0)
	return sqlDB
}

// stepConnector opens goose's connections from the pool as stepConns.
type stepConnector struct {
	driver.Connector
	o *Outbox
	w *stepWatch
}

// Connect implements driver.Connector.
func (c *stepConnector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	sc, ok := dc.(*stdlib.Conn)
	if !ok {
		return nil, errors.Join(fmt.Errorf("migrate: unexpected driver connection %T", dc), dc.Close())
	}
	return &stepConn{Conn: sc, c: c}, nil
}

// stepConn is pgx's database/sql connection whose transactions begin with
// the step's lock_timeout; every other method is pgx's own.
type stepConn struct {
	*stdlib.Conn
	c *stepConnector
}

// Begin implements driver.Conn.
func (s *stepConn) Begin() (driver.Tx, error) {
	return s.BeginTx(context.Background(), driver.TxOptions{})
}

// BeginTx implements driver.ConnBeginTx: it begins the transaction, sets
// its lock_timeout and starts watching it.
func (s *stepConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := s.Conn.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	step, err := s.c.o.queries(s.Conn.Conn()).BeginMigrationStep(ctx, strconv.FormatInt(s.c.w.lockTimeout.Milliseconds(), 10))
	if err != nil {
		return nil, errors.Join(fmt.Errorf("migrate: set the step's lock_timeout: %w", err), tx.Rollback())
	}
	return &stepTx{Tx: tx, stop: s.c.w.watch(ctx, step.Pid)}, nil
}

// stepTx stops the watch of its transaction when it ends.
type stepTx struct {
	driver.Tx
	stop func()
}

// Commit implements driver.Tx.
func (t *stepTx) Commit() error {
	defer t.stop()
	return t.Tx.Commit()
}

// Rollback implements driver.Tx.
func (t *stepTx) Rollback() error {
	defer t.stop()
	return t.Tx.Rollback()
}

// stepWatch reads, every quarter of the lock timeout while a step's
// transaction is open, which sessions its lock request waits for, so
// that a step that times out can say what held it. The wait is over by
// the time the step fails, and pg_blocking_pids names only the sessions a
// waiting request waits for, so it is read during the wait. It reads on
// the connection of the migration lock, which is idle while goose
// migrates (a pool of one connection has no such connection: nothing is
// read there).
type stepWatch struct {
	lockTimeout time.Duration
	// q runs the reads (nil: none is made). Reads run one at a time, under mu.
	q func(context.Context, func(*db.Queries) error) error

	mu      sync.Mutex
	holders []LockHolder
	wanted  string
}

// watch starts watching the transaction of backend pid, forgetting
// what was seen of the transactions before it, and returns the function
// that stops it and waits for its last read. A step that fails is the
// last transaction watched, so what is seen then is its own.
func (w *stepWatch) watch(ctx context.Context, pid int32) func() {
	w.forget()
	if w.q == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		every := max(w.lockTimeout/4, time.Millisecond)
		t := time.NewTimer(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			w.sample(ctx, pid)
			t.Reset(every)
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			wg.Wait()
		})
	}
}

// sample reads what backend pid waits for, and keeps it when it waits.
func (w *stepWatch) sample(ctx context.Context, pid int32) {
	// Detached from ctx: a read cut short by the caller's cancellation
	// could close the migration lock's connection under a running step.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), migrationSampleTimeout)
	defer cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	var rows []db.MigrationLockHoldersRow
	err := w.q(rctx, func(q *db.Queries) error {
		if err := q.ClearActivitySnapshot(rctx); err != nil {
			return err
		}
		var err error
		rows, err = q.MigrationLockHolders(rctx, pid)
		return err
	})
	if err != nil || len(rows) == 0 {
		return
	}
	w.holders = w.holders[:0]
	for _, r := range rows {
		w.holders = append(w.holders, LockHolder{
			PID: r.Pid, ApplicationName: r.ApplicationName, User: r.Usename, State: r.State,
			XactAge: dbx.Seconds(r.XactSeconds), Query: r.Query,
		})
	}
	w.wanted = rows[0].WantedMode + " on " + rows[0].WantedObject
}

// seen returns the holders and the wanted lock last seen.
func (w *stepWatch) seen() ([]LockHolder, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]LockHolder(nil), w.holders...), w.wanted
}

// forget drops what was seen, at a new transaction.
func (w *stepWatch) forget() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.holders, w.wanted = nil, ""
}

// lockWatchOn returns the reads of a stepWatch on the transaction that
// holds the migration lock: each in a savepoint, so that a failed read
// leaves the transaction, and the lock, as they were.
func lockWatchOn(o *Outbox, tx pgx.Tx) func(context.Context, func(*db.Queries) error) error {
	return func(ctx context.Context, fn func(*db.Queries) error) error {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		err = fn(o.queries(sp))
		return errors.Join(err, sp.Rollback(ctx))
	}
}

// retrySteps runs run (goose applying or rolling back steps) until it
// returns without a step that timed out waiting for a lock: such a step
// was rolled back, and is tried again after a backoff, within the retry
// budget of each step.
func (o *Outbox) retrySteps(ctx context.Context, mo *migrateOptions, w *stepWatch, run func() error) error {
	var (
		step  *goose.MigrationResult
		tries int
		first time.Time
		// What the step's tries saw last: a try whose reads came too late
		// to see its wait (a busy server) leaves what an earlier try saw.
		holders []LockHolder
		wanted  string
	)
	for {
		start := time.Now()
		err := run()
		failed := lockTimedOut(err)
		if failed == nil {
			if err != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
				err = fmt.Errorf("%w (%w)", context.Cause(ctx), err)
			}
			return err
		}
		if step == nil || step.Source.Version != failed.Source.Version || step.Direction != failed.Direction {
			step, tries, first = failed, 0, start
			holders, wanted = nil, ""
		}
		tries++
		if seen, waitedFor := w.seen(); len(seen) > 0 {
			holders, wanted = seen, waitedFor
		}
		wait := migrationBackoff(mo.lockTimeout, tries)
		if time.Since(first)+wait > mo.retryBudget {
			return &MigrationLockError{
				Schema: o.naming.Schema, Table: o.naming.Table,
				Version: failed.Source.Version, Name: path.Base(failed.Source.Path), Down: failed.Direction == "down",
				Tries: tries, Elapsed: time.Since(first), LockTimeout: mo.lockTimeout,
				WaitedFor: wanted, Holders: holders, Err: err,
			}
		}
		pids := make([]int32, len(holders))
		for i, h := range holders {
			pids[i] = h.PID
		}
		heldBy := holderList(holders)
		if heldBy == "" {
			heldBy = "not seen"
		}
		mo.log.WarnContext(ctx, "outbox: a migration step's lock was not granted within the lock timeout; rolled it back, retrying",
			slog.String("outbox", o.naming.Schema+"."+o.naming.Table),
			slog.String("step", path.Base(failed.Source.Path)),
			slog.String("direction", failed.Direction),
			slog.Int("try", tries),
			slog.Duration("lock_timeout", mo.lockTimeout),
			slog.Duration("retry_in", wait),
			slog.String("waited_for", wanted),
			slog.String("held_by", heldBy),
			slog.Any("holder_pids", pids))
		if !dbx.Sleep(ctx, wait) {
			return fmt.Errorf("%w (while waiting to retry %s, whose lock was held by %s)",
				context.Cause(ctx), path.Base(failed.Source.Path), heldBy)
		}
	}
}

// lockTimedOut returns the step that failed because its lock was not
// granted within lock_timeout, or nil.
func lockTimedOut(err error) *goose.MigrationResult {
	var pe *goose.PartialError
	if err == nil || !errors.As(err, &pe) || pe.Failed == nil || pe.Failed.Source == nil {
		return nil
	}
	if dbx.SQLState(err) != "55P03" {
		return nil
	}
	return pe.Failed
}

// migrationBackoff is the wait before the next try of a step tried tries
// times: exponential from the lock timeout, capped, with jitter, so that
// migrators of several processes do not retry in step, and the sessions
// queued behind each try have time to drain.
func migrationBackoff(lockTimeout time.Duration, tries int) time.Duration {
	d := lockTimeout
	for i := 1; i < tries && d < migrationRetryMax; i++ {
		d *= 2
	}
	d = min(d, max(migrationRetryMax, lockTimeout))
	return d/2 + rand.N(d/2+1)
}
