package outbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/pgtest"
)

// logRecords is a slog.Handler that keeps the records logged through it.
type logRecords struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecords) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}
func (h *logRecords) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logRecords) WithGroup(string) slog.Handler      { return h }

// retries returns the attributes of each retry warning logged so far.
func (h *logRecords) retries() []map[string]slog.Value {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]slog.Value
	for _, r := range h.recs {
		if !strings.Contains(r.Message, "retrying") {
			continue
		}
		attrs := map[string]slog.Value{}
		r.Attrs(func(a slog.Attr) bool {
			attrs[a.Key] = a.Value
			return true
		})
		out = append(out, attrs)
	}
	return out
}

// lockHolder is a session of its own, under application_name name, whose
// open transaction has read the outbox table and holds a SHARE lock on
// the outbox's migration history: every migration step waits for it,
// whatever the step changes, since every step records itself in that
// history. release ends the transaction.
type lockHolder struct {
	pid     int32
	release func()
}

func holdLocks(t *testing.T, d *pgtest.DB, ob *Outbox, name string) *lockHolder {
	t.Helper()
	cfg, err := pgx.ParseConfig(d.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = name
	tx := pgtest.Tx(t, cfg)
	n := ob.naming
	if _, err := tx.Exec(t.Context(), "SELECT count(*) FROM "+n.Qualified(n.Table)+
		"; LOCK TABLE "+n.Qualified(n.VersionTable())+" IN SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	h := &lockHolder{}
	if err := tx.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&h.pid); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	h.release = func() {
		once.Do(func() {
			if err := tx.Rollback(context.Background()); err != nil {
				t.Errorf("release the held locks: %v", err)
			}
		})
	}
	t.Cleanup(h.release)
	return h
}

// blocking reports whether a session waits for a lock pid holds.
func blocking(t *testing.T, d *pgtest.DB, pid int32) bool {
	t.Helper()
	var waits bool
	if err := d.Pool.QueryRow(t.Context(),
		"SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1::integer = ANY (pg_blocking_pids(pid)))", pid).Scan(&waits); err != nil {
		t.Fatal(err)
	}
	return waits
}

// libraryLatest returns the number of the library's last migration.
func libraryLatest(t *testing.T) int64 {
	t.Helper()
	_, m, err := resolveNames(nil)
	if err != nil {
		t.Fatal(err)
	}
	var latest int64
	for name := range m {
		if v, ok := migrationVersion(name); ok {
			latest = max(latest, v)
		}
	}
	return latest
}

// latestStep returns the file name of the library's last migration.
func latestStep(t *testing.T, ob *Outbox) string {
	t.Helper()
	for name := range ob.migrations {
		if v, _ := migrationVersion(name); v == ob.latest {
			return name
		}
	}
	t.Fatalf("no migration numbered %d", ob.latest)
	return ""
}

// The promise: a migration step that must wait for a lock (here an
// ALTER TABLE of the outbox behind a transaction that has read it) never
// makes a Publish wait much longer than the lock timeout, while a
// publisher publishes in a loop and a subscriber runs; the step is
// retried, and once the transaction ends the migration completes.
//
// The step is one more migration, after the library's last, that adds a
// column: the service runs on the latest schema, as a running service
// does, whatever that schema's number.
func TestMigrateNeverQueuesPublishersBehindAWaitingStep(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const lockTimeout = 200 * time.Millisecond
	// What a Publish may take beyond the lock timeout on a loaded machine.
	const slack = 3 * time.Second

	var handled atomic.Int64
	startSub(t, e.ob, []string{"q"}, func(context.Context, *Message[int]) error {
		handled.Add(1)
		return nil
	}, &SubscriberConfig[int]{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), ListenDSN: pgtest.ListenURL()})

	pub, err := NewPublisher[int](e.ob, "q", nil)
	if err != nil {
		t.Fatal(err)
	}
	var (
		published atomic.Int64
		slowest   atomic.Int64 // nanoseconds
		pubErr    atomic.Value
		stop      = make(chan struct{})
		wg        sync.WaitGroup
	)
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			began := time.Now()
			if _, err := pub.Publish(e.ctx, e.pubPool, i, nil); err != nil {
				pubErr.Store(err)
				return
			}
			took := int64(time.Since(began))
			for old := slowest.Load(); took > old && !slowest.CompareAndSwap(old, took); old = slowest.Load() {
			}
			published.Add(1)
		}
	})
	stopPublishing := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopPublishing)
	eventually(t, "the subscriber handling published rows", func() bool { return handled.Load() > 10 })

	// The migrator: the library's migrations and one more step.
	mig := newOutbox(t, e.db)
	n := mig.naming
	mig.latest++
	mig.migrations[fmt.Sprintf("%05d_add_a_column.sql", mig.latest)] = &fstest.MapFile{Data: []byte(
		"-- +goose Up\nALTER TABLE " + n.Qualified(n.Table) + " ADD COLUMN added_by_test integer;\n" +
			"-- +goose Down\nALTER TABLE " + n.Qualified(n.Table) + " DROP COLUMN added_by_test;\n")}

	holder := holdLocks(t, e.db, e.ob, "reads-the-outbox")
	logs := &logRecords{}
	done := make(chan error, 1)
	go func() {
		done <- mig.Migrate(e.ctx, MigrateLockTimeout(lockTimeout), MigrateLogger(slog.New(logs)))
	}()
	// The step's first retry says it waited out its lock timeout behind
	// the holder (watching for the wait itself could miss it: between
	// tries the step waits out a backoff that grows).
	eventually(t, "the step's first retry", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Migrate returned while the holder held its locks: %v", err)
		default:
		}
		return len(logs.retries()) >= 1
	})
	// Publishing goes on while the step is held up: it waits, times
	// out, and retries.
	at := published.Load()
	eventually(t, "publishes while the step is held up", func() bool {
		if err, _ := pubErr.Load().(error); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		return published.Load() >= at+20
	})
	eventually(t, "two retries of the step", func() bool { return len(logs.retries()) >= 2 })
	holder.release()
	if err := <-done; err != nil {
		t.Fatalf("Migrate after the holder ended: %v", err)
	}
	var added bool
	if err := e.db.Pool.QueryRow(e.ctx, "SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2 AND column_name = 'added_by_test')",
		n.Schema, n.Table).Scan(&added); err != nil || !added {
		t.Errorf("the step's column after Migrate: %v, %v", added, err)
	}
	after := handled.Load()
	eventually(t, "the subscriber handling rows after the migration", func() bool { return handled.Load() > after+10 })
	stopPublishing()
	if err, _ := pubErr.Load().(error); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if got := time.Duration(slowest.Load()); got >= lockTimeout+slack {
		t.Errorf("the slowest of %d publishes took %v; want under the lock timeout %v (+%v)", published.Load(), got, lockTimeout, slack)
	}
	t.Logf("%d publishes, the slowest %v; %d retries", published.Load(), time.Duration(slowest.Load()), len(logs.retries()))
}

// Before each retry, the warning names the sessions the step waited for:
// their pid and application_name.
func TestMigrateLogsWhatHoldsTheLock(t *testing.T) {
	t.Parallel()
	e := atVersion(t, libraryLatest(t)-1)
	holder := holdLocks(t, e.db, e.ob, "holds-the-lock")
	logs := &logRecords{}
	done := make(chan error, 1)
	go func() {
		done <- e.ob.Migrate(e.ctx, MigrateLockTimeout(200*time.Millisecond), MigrateLogger(slog.New(logs)))
	}()
	eventually(t, "a retry naming the holder", func() bool {
		for _, r := range logs.retries() {
			if strings.Contains(r["held_by"].String(), fmt.Sprintf("pid %d", holder.pid)) {
				return true
			}
		}
		return false
	})
	holder.release()
	if err := <-done; err != nil {
		t.Fatalf("Migrate after the holder ended: %v", err)
	}
	for _, r := range logs.retries() {
		if !strings.Contains(r["held_by"].String(), fmt.Sprintf("pid %d", holder.pid)) {
			continue
		}
		got := map[string]string{"step": r["step"].String(), "lock_timeout": r["lock_timeout"].String()}
		want := map[string]string{"step": latestStep(t, e.ob), "lock_timeout": "200ms"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("retry warning (-want +got):\n%s", diff)
		}
		if held := r["held_by"].String(); !strings.Contains(held, `application_name "holds-the-lock"`) {
			t.Errorf("held_by %q does not name the holder's application_name", held)
		}
		if pids := fmt.Sprint(r["holder_pids"].Any()); !strings.Contains(pids, fmt.Sprint(holder.pid)) {
			t.Errorf("holder_pids %s lacks %d", pids, holder.pid)
		}
		break
	}
	if v, err := e.ob.SchemaVersion(e.ctx); err != nil || v != e.ob.LatestSchemaVersion() {
		t.Errorf("schema version after Migrate: %d, %v; want %d", v, err, e.ob.LatestSchemaVersion())
	}
}

// When the retry budget is spent, Migrate stops with an error that names
// the step, its tries and the holder, and leaves the step unapplied.
func TestMigrateGivesUpNamingTheStepAndTheHolder(t *testing.T) {
	t.Parallel()
	e := atVersion(t, libraryLatest(t)-1)
	holder := holdLocks(t, e.db, e.ob, "never-lets-go")
	err := e.ob.Migrate(e.ctx, MigrateLockTimeout(200*time.Millisecond), MigrateRetryBudget(3*time.Second),
		MigrateLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	var le *MigrationLockError
	if !errors.As(err, &le) {
		t.Fatalf("Migrate behind a lock that is never released: %v; want a *MigrationLockError", err)
	}
	step := latestStep(t, e.ob)
	if le.Name != step || le.Version != e.ob.LatestSchemaVersion() || le.Tries < 1 || le.LockTimeout != 200*time.Millisecond {
		t.Errorf("error %+v; want step %s (%d), tries, lock timeout 200ms", le, step, e.ob.LatestSchemaVersion())
	}
	var pids []int32
	for _, h := range le.Holders {
		pids = append(pids, h.PID)
	}
	if diff := cmp.Diff([]int32{holder.pid}, pids); diff != "" {
		t.Errorf("holders (-want +got):\n%s", diff)
	}
	for _, want := range []string{step, fmt.Sprintf("pid %d", holder.pid), `"never-lets-go"`, "idle in transaction", fmt.Sprintf("in %d tr", le.Tries)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if dbxState := le.Unwrap(); dbxState == nil || !strings.Contains(dbxState.Error(), "55P03") {
		t.Errorf("the last try's error %v; want lock_not_available (55P03)", dbxState)
	}
	holder.release()
	if v, err := e.ob.SchemaVersion(e.ctx); err != nil || v != e.ob.LatestSchemaVersion()-1 {
		t.Errorf("schema version after giving up: %d, %v; want %d", v, err, e.ob.LatestSchemaVersion()-1)
	}
}

// Cancelling Migrate's context while a step waits for its lock ends the
// wait at once, long before the lock timeout would.
func TestMigrateReturnsWhenCancelledWhileAStepWaits(t *testing.T) {
	t.Parallel()
	e := atVersion(t, libraryLatest(t)-1)
	holder := holdLocks(t, e.db, e.ob, "outwaits-the-migration")
	const lockTimeout = 5 * time.Minute
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- e.ob.Migrate(ctx, MigrateLockTimeout(lockTimeout)) }()
	eventually(t, "the step waiting for the held lock", func() bool { return blocking(t, e.db, holder.pid) })
	cancelled := time.Now()
	cancel()
	err := <-done
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Migrate cancelled while a step waits: %v; want context.Canceled", err)
	}
	if took := time.Since(cancelled); took > lockTimeout/2 {
		t.Errorf("Migrate returned %v after its context was cancelled", took)
	}
	eventually(t, "the step's wait ended", func() bool { return !blocking(t, e.db, holder.pid) })
	holder.release()
	if v, err := e.ob.SchemaVersion(e.ctx); err != nil || v != e.ob.LatestSchemaVersion()-1 {
		t.Errorf("schema version after the cancelled Migrate: %d, %v; want %d", v, err, e.ob.LatestSchemaVersion()-1)
	}
}

// A negative lock timeout or retry budget is refused before anything is
// changed, naming the option; zero means the default.
func TestMigrateRefusesANegativeLockTimeoutOrRetryBudget(t *testing.T) {
	t.Parallel()
	e := atVersion(t, libraryLatest(t)-1)
	for _, c := range []struct {
		field string
		opt   MigrateOption
	}{
		{"MigrateLockTimeout", MigrateLockTimeout(-time.Second)},
		{"MigrateRetryBudget", MigrateRetryBudget(-time.Millisecond)},
	} {
		err := e.ob.Migrate(e.ctx, c.opt)
		var in *InputError
		if !errors.As(err, &in) || in.Field != c.field || !strings.Contains(err.Error(), "0 for") {
			t.Errorf("Migrate with a negative %s: %v; want an *InputError naming it and the default", c.field, err)
		}
		if err := e.ob.MigrateDownTo(e.ctx, 1, c.opt); !errors.As(err, &in) || in.Field != c.field {
			t.Errorf("MigrateDownTo with a negative %s: %v; want an *InputError naming it", c.field, err)
		}
	}
	if v, err := e.ob.SchemaVersion(e.ctx); err != nil || v != e.ob.LatestSchemaVersion()-1 {
		t.Errorf("schema version after refused options: %d, %v; want %d unchanged", v, err, e.ob.LatestSchemaVersion()-1)
	}
	if err := e.ob.Migrate(e.ctx, MigrateLockTimeout(0), MigrateRetryBudget(0)); err != nil {
		t.Errorf("Migrate with zero options (the defaults): %v", err)
	}
}

// The lock timeout is set for each step in whole milliseconds, never 0
// (which PostgreSQL reads as no limit).
func TestMigrateLockTimeoutRoundsUpToWholeMilliseconds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want time.Duration }{
		{0, MigrationLockTimeoutDefault},
		{time.Nanosecond, time.Millisecond},
		{1500 * time.Microsecond, 2 * time.Millisecond},
		{3 * time.Second, 3 * time.Second},
	} {
		mo, err := resolveMigrateOptions([]MigrateOption{MigrateLockTimeout(c.in)})
		if err != nil || mo.lockTimeout != c.want {
			t.Errorf("MigrateLockTimeout(%v): %v, %v; want %v", c.in, mo.lockTimeout, err, c.want)
		}
	}
}

// A pool of one connection, whose migrations hold their lock on goose's
// own connection, bounds and retries its steps too; it has no connection
// to spare for reading what holds the lock, and says so.
func TestMigrateOnAPoolOfOneConnectionGivesUpSayingTheHolderWasNotSeen(t *testing.T) {
	t.Parallel()
	e := atVersion(t, libraryLatest(t)-1)
	one := e.outboxOn(func(c *pgxpool.Config) { c.MaxConns = 1 })
	holder := holdLocks(t, e.db, e.ob, "holds-a-pool-of-one")
	err := one.Migrate(e.ctx, MigrateLockTimeout(100*time.Millisecond), MigrateRetryBudget(300*time.Millisecond),
		MigrateLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	var le *MigrationLockError
	if !errors.As(err, &le) || le.Name != latestStep(t, one) || len(le.Holders) != 0 || !strings.Contains(err.Error(), "what held it was not seen") {
		t.Fatalf("Migrate on a pool of one behind a held lock: %v; want a *MigrationLockError for %s without holders", err, latestStep(t, one))
	}
	holder.release()
	if err := one.Migrate(e.ctx); err != nil {
		t.Fatalf("Migrate on a pool of one once the holder ended: %v", err)
	}
}
