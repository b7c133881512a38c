package outboxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/localpg"
	"github.com/outboxgen/outboxgen/outbox"
)

// EnvURL names the variable [Connect] reads the test database from.
const EnvURL = "TEST_DATABASE_URL"

// Fixture is one test's outbox: a schema of its own, migrated to the
// library's latest version, dropped when the test ends. Tests that run in
// parallel each get their own, so they never see each other's rows.
type Fixture struct {
	// Outbox is the test's outbox; its tables are in Schema.
	Outbox *outbox.Outbox
	// Pool is the pool the fixture was made on, or with [WithMigrations]
	// a pool of its own on the same database whose search_path starts
	// with Schema. Outbox uses it.
	Pool *pgxpool.Pool
	// Schema is the test's own schema, "outboxtest_" and random hex.
	Schema string
}

// New makes a fresh, migrated outbox in a schema of its own on pool and
// drops the schema when tb ends. cfg may be nil; its Schema is replaced by
// the fixture's own. Rows that the code under test publishes through
// f.Outbox land in that schema, whatever the pool's search_path; the code's
// own tables stay where they are, unless opts give the service's
// migrations ([WithMigrations]) to make the test a copy of them in its
// schema.
func New(tb testing.TB, pool *pgxpool.Pool, cfg *outbox.Config, opts ...Option) *Fixture {
	tb.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.migrate && o.migrations == nil {
		tb.Fatalf("outboxtest: New: WithMigrations with a nil fs.FS")
	}
	var c outbox.Config
	if cfg != nil {
		c = *cfg
	}
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	c.Schema = "outboxtest_" + hex.EncodeToString(b[:])
	obPool := pool
	if o.migrate {
		obPool = searchPathPool(tb, pool, c.Schema)
	}
	ob, err := outbox.New(obPool, &c)
	if err != nil {
		tb.Fatalf("outboxtest: New: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{c.Schema}.Sanitize()+" CASCADE"); err != nil {
			tb.Errorf("outboxtest: dropping schema %s: %v", c.Schema, err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ob.Migrate(ctx); err != nil {
		tb.Fatalf("outboxtest: New: %v", err)
	}
	if o.migrate {
		applyMigrations(tb, obPool, c.Schema, ob.Table(), o)
	}
	return &Fixture{Outbox: ob, Pool: obPool, Schema: c.Schema}
}

// Main runs a package's tests against a test database and exits with
// their code. Call it from TestMain:
//
//	func TestMain(m *testing.M) { outboxtest.Main(m) }
//
// It takes, in order: the database $TEST_DATABASE_URL names; the one
// PostgreSQL's own client defaults reach (the PG* variables, then the
// local socket or localhost:5432, as psql with no arguments); a throwaway
// cluster made with the machine's PostgreSQL server binaries (initdb and
// pg_ctl on PATH or where distributions install them; as root, the
// cluster runs as the postgres user); or, when the test binary imports
// [github.com/outboxgen/outboxgen/outbox/outboxtest/pgcontainer], a
// PostgreSQL container through testcontainers, where Docker runs. It
// removes the cluster or container when the tests end, and [Connect]
// connects to what it chose. When none is found, Connect fails each test
// saying what to install, set or import.
func Main(m *testing.M) {
	os.Exit(localpg.RunTests(EnvURL, "outboxtest", func(_ *localpg.Server, err error) int {
		mainErr = err
		return m.Run()
	}))
}

// mainErr is why Main found no database.
var mainErr error

// Connect returns a pool on the test database, closed when tb ends: the
// one [Main] chose, or without Main the one $TEST_DATABASE_URL names or
// else the one PostgreSQL's own client defaults reach. When none answers
// it fails tb saying what to set.
func Connect(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	if mainErr != nil {
		tb.Fatalf("outboxtest: %v", mainErr)
	}
	dsn, from := os.Getenv(EnvURL), "$"+EnvURL
	if dsn == "" {
		from = "PostgreSQL's client defaults (PGHOST, PGPORT, PGUSER, PGDATABASE; else the local socket or localhost:5432)"
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		tb.Fatalf("outboxtest: %s: %v", from, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		tb.Fatalf("outboxtest: no test database through %s: %v\n"+
			"Run PostgreSQL locally, set %s (e.g. %s=postgres://postgres@localhost:5432/postgres?sslmode=disable), "+
			"or call outboxtest.Main from TestMain to start a throwaway cluster (or, importing "+
			"outbox/outboxtest/pgcontainer too, a container)",
			from, err, EnvURL, EnvURL)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// RequirePublished fails tb unless queue holds exactly want, oldest first,
// decoded with the default codec of T, and prints the difference. Call it
// after the transaction under test committed: it reads through ob's pool.
// [RequirePublishedTx] asserts within the transaction before it commits.
func RequirePublished[T any](tb testing.TB, ob *outbox.Outbox, queue string, want ...T) {
	tb.Helper()
	requireEqual(tb, queue, want, Published[T](tb, ob, queue, nil))
}

// RequirePublishedBy is [RequirePublished] with codec decoding the rows
// (nil: the default codec of T), and with opts comparing them: a codec's
// message types may need options of their own, such as
// protocmp.Transform() for Protocol Buffers messages.
func RequirePublishedBy[T any](tb testing.TB, ob *outbox.Outbox, queue string, codec outbox.Codec[T], opts []cmp.Option, want ...T) {
	tb.Helper()
	requireEqual(tb, queue, want, Published(tb, ob, queue, codec), opts...)
}

// String describes the fixture, for test logs.
func (f *Fixture) String() string {
	return fmt.Sprintf("outbox %s.%s", f.Schema, f.Outbox.Table())
}
