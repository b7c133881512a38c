// Package pgtest gives each test its own schema in a real PostgreSQL.
//
// A test's connections reach its schema through search_path, sent as a
// startup parameter. A pooler such as PgBouncer passes only a few startup
// parameters on to the server, so when search_path does not arrive, each
// test connects as a login role of its own (a superuser, as the tests'
// base user is) whose default search_path is its schema, which the server
// applies to every connection the pooler opens for it.
//
// The database is TEST_DATABASE_URL when it is set; otherwise [Main] takes,
// in order, what PostgreSQL's client defaults reach (as psql with no
// arguments), a throwaway cluster made with the machine's server binaries,
// or a testcontainers container (see localpg.Acquire; container.go imports
// pgcontainer for it), and removes what it started afterwards. Tests never
// read DATABASE_URL, which the CLI and the demo use; they create and drop
// only schemas of their own.
//
// Only tests import this package, so release binaries never link
// testcontainers.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/outboxgen/outboxgen/internal/localpg"
)

// EnvURL is the variable that points tests at a database.
const EnvURL = "TEST_DATABASE_URL"

// EnvRoles is the variable that, set to 1, makes the tests that honour
// [RolesMode] run the code under test as least-privileged roles: the
// outbox owned by a migrator role, publishing as a publisher role and
// subscribing and operating as a subscriber role, each with only the
// privileges outboxgen grants gives it. Fixtures and checks still run as
// the role of EnvURL, which must be able to create roles.
const EnvRoles = "TEST_ROLES"

// RolesMode reports whether EnvRoles asks for least-privileged roles.
func RolesMode() bool { return os.Getenv(EnvRoles) == "1" }

// EnvListenURL, when set, connects straight to the server behind a
// pooler at EnvURL that cannot LISTEN (PgBouncer in transaction mode):
// the tests' subscribers and listeners LISTEN through it, as
// SubscriberConfig.ListenDSN has a service do.
const EnvListenURL = "TEST_LISTEN_DATABASE_URL"

// ListenURL returns EnvListenURL's value: where tests LISTEN when their
// database is behind a pooler that cannot, or "" to LISTEN on the test
// database itself.
func ListenURL() string { return os.Getenv(EnvListenURL) }

var (
	baseURL  string
	startErr error

	// pooled reports that search_path sent as a startup parameter does
	// not reach the server; poolCheck decides it once.
	pooled    bool
	poolCheck sync.Once
	poolErr   error
)

// Main runs the package's tests: it resolves the database (finding or
// starting one when EnvURL is unset), runs m, stops what it started, and
// fails the run if goroutines leaked. Call it from TestMain.
func Main(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var fromContainer bool
	code := localpg.RunTests(EnvURL, "pgtest", func(srv *localpg.Server, err error) int {
		if err != nil {
			startErr = err
		} else {
			baseURL, fromContainer = srv.URL, srv.Source == localpg.Container
			// Package examples connect as a service does, to
			// $DATABASE_URL: in a test binary, that is the test database.
			_ = os.Setenv("DATABASE_URL", srv.URL)
		}
		code := m.Run()
		closeSlots()
		if err == nil {
			// The catalogs' dead rows, which the package's schemas left.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if verr := vacuumCatalogs(ctx, srv.URL, os.Stderr); verr != nil {
				fmt.Fprintln(os.Stderr, "pgtest: vacuuming the catalogs:", verr)
			}
		}
		return code
	})
	if code == 0 && !fromContainer {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: goroutines leaked:", err)
			return 1
		}
	}
	return code
}

// URL returns the test database's connection string, failing tb when
// there is none.
func URL(tb testing.TB) string {
	tb.Helper()
	if startErr != nil {
		tb.Fatalf("pgtest: %v", startErr)
	}
	if baseURL == "" {
		tb.Fatalf("pgtest: no test database: set %s (and call pgtest.Main from TestMain)", EnvURL)
	}
	return baseURL
}

// DB is one test's database: a pool whose search_path is a fresh schema
// that is dropped when the test ends.
type DB struct {
	// Pool is connected with search_path set to Schema.
	Pool *pgxpool.Pool
	// Schema is the test's own, initially empty schema.
	Schema string
	// URL connects to the same database with search_path and
	// application_name set to Schema: as a startup parameter, or, behind
	// a pooler that drops it, as the default of the role URL names.
	URL string
}

// Pooled reports whether the test database drops search_path given as a
// startup parameter (a pooler such as PgBouncer), so that each test
// connects as a role of its own, named as its schema. It fails tb when
// the database cannot be reached.
func Pooled(tb testing.TB) bool {
	tb.Helper()
	base := URL(tb)
	poolCheck.Do(func() { pooled, poolErr = dropsSearchPath(base) })
	if poolErr != nil {
		tb.Fatalf("pgtest: %v", poolErr)
	}
	return pooled
}

// dropsSearchPath connects to base with search_path set as a startup
// parameter and reports whether the server's session did not get it: the
// pooler ignored it (PgBouncer's ignore_startup_parameters) or refused
// the connection for it while one without it succeeds.
func dropsSearchPath(base string) (bool, error) {
	ctx := context.Background()
	const probe = "pg_catalog"
	cfg, err := pgx.ParseConfig(base)
	if err != nil {
		return false, fmt.Errorf("parse %s: %w", EnvURL, err)
	}
	cfg.RuntimeParams["search_path"] = probe
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		plain, perr := pgx.Connect(ctx, base)
		if perr != nil {
			return false, fmt.Errorf("connect: %w", perr)
		}
		_ = plain.Close(ctx)
		return true, nil
	}
	defer conn.Close(ctx)
	var got string
	if err := conn.QueryRow(ctx, "SELECT current_setting('search_path')").Scan(&got); err != nil {
		return false, fmt.Errorf("read search_path: %w", err)
	}
	return got != probe, nil
}

// New creates a fresh schema for tb and a pool whose connections use it.
// The schema and everything in it are dropped at cleanup.
func New(tb testing.TB) *DB {
	tb.Helper()
	base := URL(tb)
	ctx := context.Background()
	schema := "t_" + randomHex(tb, 8)
	if !Pooled(tb) {
		// Behind a pooler, sessions (and so the slots' locks) are not
		// the clients'; the pooler queues clients itself.
		admit(tb, base, 1)
	}

	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		tb.Fatalf("pgtest: connect: %v", err)
	}
	defer admin.Close(ctx)
	// The URL names the database it reached, so that a test connecting
	// as another role (whose default database is its own name) reaches it
	// too, when the base URL leaves it to the client's defaults.
	var database string
	if err := admin.QueryRow(ctx, "SELECT current_database()").Scan(&database); err != nil {
		tb.Fatalf("pgtest: current database: %v", err)
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		tb.Fatalf("pgtest: create schema: %v", err)
	}
	pooled := Pooled(tb)
	tb.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), base)
		if err != nil {
			tb.Errorf("pgtest: connect for cleanup: %v", err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			tb.Errorf("pgtest: drop schema %s: %v", schema, err)
		}
		if pooled {
			// What the role still owns or was granted, then the role; the
			// pooler closes its idle server connections in time.
			role := pgx.Identifier{schema}.Sanitize()
			if _, err := c.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE "+role); err != nil {
				tb.Errorf("pgtest: drop role %s: %v", schema, err)
			}
		}
	})

	u := WithSearchPath(tb, base, schema)
	if pooled {
		u = asRole(tb, admin, base, schema)
	}
	u = withDatabase(tb, u, database)
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		tb.Fatalf("pgtest: pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return &DB{Pool: pool, Schema: schema, URL: u}
}

// WithSearchPath returns dsn with search_path set to schema, and
// application_name too, so a test can find its own backends in
// pg_stat_activity.
func WithSearchPath(tb testing.TB, dsn, schema string) string {
	tb.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		tb.Fatalf("pgtest: parse %s: %v", EnvURL, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	q.Set("application_name", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// Tx opens a connection of its own with cfg, closed when the test
// ends, and begins a transaction on it.
func Tx(tb testing.TB, cfg *pgx.ConnConfig) pgx.Tx {
	tb.Helper()
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close(context.Background()) })
	tx, err := conn.Begin(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	return tx
}

// asRole creates a superuser login role named schema whose default
// search_path is schema, and returns base connecting as it, with
// application_name set to schema.
func asRole(tb testing.TB, admin *pgx.Conn, base, schema string) string {
	tb.Helper()
	role := pgx.Identifier{schema}.Sanitize()
	if _, err := admin.Exec(context.Background(), "CREATE ROLE "+role+" LOGIN SUPERUSER; ALTER ROLE "+role+" SET search_path TO "+role); err != nil {
		tb.Fatalf("pgtest: a role for a pooled test database: %v", err)
	}
	u, err := url.Parse(base)
	if err != nil {
		tb.Fatalf("pgtest: parse %s: %v", EnvURL, err)
	}
	u.User = url.User(schema)
	q := u.Query()
	q.Set("application_name", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// withDatabase returns dsn naming database, unless it names one already.
func withDatabase(tb testing.TB, dsn, database string) string {
	tb.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		tb.Fatalf("pgtest: parse %s: %v", EnvURL, err)
	}
	if strings.Trim(u.Path, "/") == "" {
		u.Path = "/" + database
	}
	return u.String()
}

// Roles are three login roles of one test, named after its schema and
// dropped (with what they own) when it ends.
type Roles struct {
	Migrator, Publisher, Subscriber string
}

// NewRoles creates the test's migrator, publisher and subscriber roles,
// with no privilege but LOGIN, and gives the test's schema to the
// migrator. The role of EnvURL must be able to create roles.
func (d *DB) NewRoles(tb testing.TB) Roles {
	tb.Helper()
	ctx := context.Background()
	r := Roles{Migrator: d.Schema + "_migrator", Publisher: d.Schema + "_publisher", Subscriber: d.Schema + "_subscriber"}
	all := []string{r.Migrator, r.Publisher, r.Subscriber}
	ident := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	for _, name := range all {
		if _, err := d.Pool.Exec(ctx, "CREATE ROLE "+ident(name)+" LOGIN"); err != nil {
			tb.Fatalf("pgtest: create role %s: %v", name, err)
		}
	}
	// Registered after the schema's own cleanup, so it runs first: the
	// roles' objects go back to the test's role and the schema is dropped
	// with them.
	tb.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), d.URL)
		if err != nil {
			tb.Errorf("pgtest: connect to drop the roles: %v", err)
			return
		}
		defer func() { _ = c.Close(context.Background()) }()
		for _, name := range all {
			// A role's sessions may outlive its test's pools by a moment.
			_, _ = c.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", name)
			if _, err := c.Exec(context.Background(), "REASSIGN OWNED BY "+ident(name)+" TO CURRENT_USER; DROP OWNED BY "+ident(name)+"; DROP ROLE "+ident(name)); err != nil {
				tb.Errorf("pgtest: drop role %s: %v", name, err)
			}
		}
	})
	if _, err := d.Pool.Exec(ctx, "ALTER SCHEMA "+ident(d.Schema)+" OWNER TO "+ident(r.Migrator)); err != nil {
		tb.Fatalf("pgtest: give the schema to %s: %v", r.Migrator, err)
	}
	return r
}

// URLAs returns d.URL connecting as role instead (trust or a password
// the environment gives, as for EnvURL).
func (d *DB) URLAs(tb testing.TB, role string) string {
	tb.Helper()
	u, err := url.Parse(d.URL)
	if err != nil {
		tb.Fatalf("pgtest: parse %s: %v", EnvURL, err)
	}
	u.User = url.User(role)
	return u.String()
}

// PoolAs returns a pool of d's database and schema connecting as role,
// closed when the test ends.
func (d *DB) PoolAs(tb testing.TB, role string) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), d.URLAs(tb, role))
	if err != nil {
		tb.Fatalf("pgtest: pool as %s: %v", role, err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

func randomHex(tb testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		tb.Fatalf("pgtest: random: %v", err)
	}
	return hex.EncodeToString(b)
}

// Catalog describes every object in schema, one line each: relations with
// their options, columns, index, constraint and trigger definitions, and
// function bodies. Two schemas built alike have equal catalogs.
func Catalog(tb testing.TB, pool *pgxpool.Pool, schema string) []string {
	tb.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT 'rel ' || c.relname || ' ' || c.relkind::text || ' ' || coalesce(array_to_string(c.reloptions, ','), '')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1
		UNION ALL
		SELECT 'idx ' || indexdef FROM pg_indexes WHERE schemaname = $1
		UNION ALL
		SELECT 'con ' || conname || ' ' || pg_get_constraintdef(c.oid)
		FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = $1
		UNION ALL
		SELECT 'trg ' || pg_get_triggerdef(t.oid)
		FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND NOT t.tgisinternal
		UNION ALL
		SELECT 'fn ' || p.proname || ' ' || p.prosrc
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1
		UNION ALL
		SELECT 'col ' || table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, '')
		FROM information_schema.columns WHERE table_schema = $1
		ORDER BY 1`, schema)
	if err != nil {
		tb.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		tb.Fatal(err)
	}
	return out
}
