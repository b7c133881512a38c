package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/pgtest"
)

// The tests of this file run through a PgBouncer: TEST_PGBOUNCER_URL
// names it (with pgx's defaults), TEST_PGBOUNCER_MODE its pool_mode
// (transaction or session), and TEST_PGBOUNCER_SERVER_URL the PostgreSQL
// behind it. make leg-pgbouncer sets them; without them the tests skip.
// docs/poolers.md is what they prove.

// bouncer is the PgBouncer the tests run through.
type bouncer struct {
	url, mode, server string
}

func pgBouncer(t *testing.T) bouncer {
	t.Helper()
	b := bouncer{url: os.Getenv("TEST_PGBOUNCER_URL"), mode: os.Getenv("TEST_PGBOUNCER_MODE"), server: os.Getenv("TEST_PGBOUNCER_SERVER_URL")}
	if b.url == "" {
		t.Skip("TEST_PGBOUNCER_URL names no PgBouncer (make leg-pgbouncer sets it)")
	}
	if b.server == "" || (b.mode != "transaction" && b.mode != "session") {
		t.Fatal("TEST_PGBOUNCER_URL needs TEST_PGBOUNCER_SERVER_URL and TEST_PGBOUNCER_MODE (transaction or session)")
	}
	return b
}

// as returns base connecting as the role d's connections use (its own,
// when the test database is pooled) with the query parameters kv.
func as(t *testing.T, base string, d *pgtest.DB, kv ...string) string {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	du, err := url.Parse(d.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = du.User
	q := u.Query()
	q.Set("application_name", d.Schema)
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// poolOn opens a pool on dsn and an outbox of d's schema on it, migrated
// through it.
func poolOn(t *testing.T, d *pgtest.DB, dsn string) (*pgxpool.Pool, *Outbox) {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ob, err := New(pool, &Config{Schema: d.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate through PgBouncer: %v", err)
	}
	return pool, ob
}

// The settings docs/poolers.md gives work: through PgBouncer in
// transaction mode, pgx's exec and describe-cache modes with the LISTEN
// connection on the server (ListenDSN); in session mode, pgx's defaults
// and a LISTEN through the pooler too. Each migrates through the pooler,
// publishes keyed, unkeyed, batched and timed rows, and has a subscriber
// and a transactional subscriber handle them (a retry and a dead letter
// among them), in order per key, woken by NOTIFY.
func TestPgBouncerDeliversWithTheDocumentedSettings(t *testing.T) {
	t.Parallel()
	b := pgBouncer(t)
	modes := []string{"exec", "cache_describe"}
	listenDSN := b.server
	if b.mode == "session" {
		modes, listenDSN = []string{"cache_statement", "exec"}, ""
	}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			d := pgtest.New(t)
			pool, ob := poolOn(t, d, as(t, b.url, d, "default_query_exec_mode", mode))
			ctx := t.Context()
			listen := ""
			if listenDSN != "" {
				listen = as(t, listenDSN, d)
			}
			var logs logLines
			cfg := fastConfig[string](nil)
			cfg.ListenDSN, cfg.Logger = listen, slog.New(slog.NewTextHandler(&logs, nil))
			// Only a NOTIFY delivers quickly: the subscriber polls every 30 s.
			cfg.MinFetchInterval, cfg.MaxFetchInterval = 30*time.Second, 30*time.Second
			cfg.Retry = ConstantRetry{Delay: 10 * time.Millisecond, MaxAttempts: 2}

			var (
				mu       sync.Mutex
				handled  []string
				attempts = map[string]int{}
			)
			startSub(t, ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
				mu.Lock()
				defer mu.Unlock()
				attempts[m.Payload]++
				switch {
				case m.Payload == "reject":
					return Reject(errors.New("rejected on purpose"))
				case m.Payload == "retry" && attempts[m.Payload] == 1:
					return errors.New("the first attempt fails")
				}
				handled = append(handled, m.Payload)
				return nil
			}, cfg)
			if _, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{d.Schema, "effects"}.Sanitize()+" (payload text PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			txCfg := fastConfig[string](nil)
			txCfg.ListenDSN = listen
			txCfg.Workers = 1 // a transaction beside the 3 connections it keeps, in pgxpool's smallest default pool
			txSub, err := NewTxSubscriber(ob, []string{"tx"}, func(ctx context.Context, tx pgx.Tx, m *Message[string]) error {
				_, err := tx.Exec(ctx, "INSERT INTO "+pgx.Identifier{d.Schema, "effects"}.Sanitize()+" VALUES ($1)", m.Payload)
				return err
			}, txCfg)
			if err != nil {
				t.Fatal(err)
			}
			start(t, txSub)

			pub, err := NewPublisher[string](ob, "q", nil)
			if err != nil {
				t.Fatal(err)
			}
			txPub, err := NewPublisher[string](ob, "tx", nil)
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for i := range 3 {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					for k := range 4 {
						p := fmt.Sprintf("k%d-%d", k, i)
						if _, err := pub.Publish(ctx, tx, p, &PublishOpts{OrderingKey: fmt.Sprintf("k%d", k), Headers: map[string]string{"n": p}}); err != nil {
							return err
						}
						want = append(want, p)
					}
					batch := []string{fmt.Sprintf("b%d-0", i), fmt.Sprintf("b%d-1", i)}
					if _, err := pub.PublishBatch(ctx, tx, batch, &PublishOpts{Headers: map[string]string{"batch": "yes"}}); err != nil {
						return err
					}
					want = append(want, batch...)
					if _, err := txPub.Publish(ctx, tx, fmt.Sprintf("effect-%d", i), nil); err != nil {
						return err
					}
					return nil
				})
				if err != nil {
					t.Fatalf("publishing through PgBouncer (%s): %v", mode, err)
				}
			}
			if _, err := pub.Publish(ctx, pool, "timer", &PublishOpts{TimerID: "t-1", Delay: 100 * time.Millisecond}); err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{"retry", "reject"} {
				if _, err := pub.Publish(ctx, pool, p, nil); err != nil {
					t.Fatal(err)
				}
			}
			want = append(want, "timer", "retry")

			eventually(t, "every row handled", func() bool {
				var n int
				if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{d.Schema, ob.Table()}.Sanitize()).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n == 0
			})
			mu.Lock()
			got := slices.Clone(handled)
			mu.Unlock()
			for k := range 4 {
				var keyed []string
				for _, p := range got {
					if strings.HasPrefix(p, fmt.Sprintf("k%d-", k)) {
						keyed = append(keyed, p)
					}
				}
				if diff := cmp.Diff([]string{fmt.Sprintf("k%d-0", k), fmt.Sprintf("k%d-1", k), fmt.Sprintf("k%d-2", k)}, keyed); diff != "" {
					t.Errorf("key k%d handled out of order (-want +got):\n%s", k, diff)
				}
			}
			slices.Sort(got)
			slices.Sort(want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("handled (-want +got):\n%s", diff)
			}
			dead, err := ob.DeadLetters(ctx, DeadLetterFilter{}, 0, 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(dead) != 1 || string(dead[0].Payload) != "reject" {
				t.Errorf("dead letters %+v, want the rejected row", dead)
			}
			var effects int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{d.Schema, "effects"}.Sanitize()).Scan(&effects); err != nil {
				t.Fatal(err)
			}
			if effects != 3 {
				t.Errorf("%d effects of the transactional subscriber, want 3", effects)
			}
			if strings.Contains(logs.String(), "did not reach the LISTEN connection") {
				t.Errorf("the subscriber's LISTEN connection was deaf:\n%s", logs.String())
			}
			h, err := ob.Health(ctx, &HealthOptions{ListenDSN: listen})
			if err != nil {
				t.Fatal(err)
			}
			if !h.NotifyHeard {
				t.Errorf("Health with the subscribers' LISTEN connection: NOTIFY not heard (%s)", h.NotifyError)
			}
		})
	}
}

// pgx's default, a named prepared statement per query cached by each
// client connection, does not survive PgBouncer before 1.21 in
// transaction mode: client connections share server connections, so a
// client prepares a statement another one prepared there already
// (SQLSTATE 42P05), or runs one prepared on another server connection
// (26000). A publisher's error names the statement and the SQLSTATE. In
// session mode pgx's default works (TestPgBouncerDeliversWithTheDocumentedSettings).
func TestPgBouncerRefusesPgxDefaultInTransactionMode(t *testing.T) {
	t.Parallel()
	b := pgBouncer(t)
	if b.mode != "transaction" {
		t.Skip("pgx's default works through PgBouncer in session mode")
	}
	d := pgtest.New(t)
	pool, ob := poolOn(t, d, as(t, b.url, d, "default_query_exec_mode", "exec"))
	// Only the two clients below use the role's server connections from
	// here on, one statement at a time: PgBouncer hands each the one it
	// used last.
	pool.Close()
	pub, err := NewPublisher[string](ob, "q", nil)
	if err != nil {
		t.Fatal(err)
	}
	dsn := as(t, b.url, d)
	var conns [2]*pgx.Conn
	for i := range conns {
		if conns[i], err = pgx.Connect(t.Context(), dsn); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conns[i].Close(context.Background()) })
	}
	if _, err := pub.Publish(t.Context(), conns[0], "first", nil); err != nil {
		t.Fatalf("the first client's publish: %v", err)
	}
	_, err = pub.Publish(t.Context(), conns[1], "second", nil)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || (pe.Code != "42P05" && pe.Code != "26000") || !strings.Contains(pe.Message, `prepared statement "stmtcache_`) {
		t.Fatalf("the second client's publish with pgx's default through PgBouncer in transaction mode: %v; "+
			"want SQLSTATE 42P05 or 26000 naming pgx's prepared statement", err)
	}
	if !strings.Contains(err.Error(), `outbox: Publish to "q"`) {
		t.Errorf("error %q does not say what failed", err)
	}
}

// A subscriber whose LISTEN goes through PgBouncer in transaction mode
// hears nothing: it says so, naming SubscriberConfig.ListenDSN, and
// delivers by polling; Health reports it with the same fix, and hears
// with the subscribers' direct ListenDSN. In session mode LISTEN through
// the pooler works.
func TestPgBouncerListenThroughThePooler(t *testing.T) {
	t.Parallel()
	b := pgBouncer(t)
	d := pgtest.New(t)
	pool, ob := poolOn(t, d, as(t, b.url, d, "default_query_exec_mode", "exec"))
	ctx := t.Context()
	var logs logLines
	cfg := fastConfig[string](nil)
	cfg.ListenDSN, cfg.Logger = "", slog.New(slog.NewTextHandler(&logs, nil))
	cfg.MinFetchInterval, cfg.MaxFetchInterval = 200*time.Millisecond, 200*time.Millisecond
	cfg.ListenProbeInterval, cfg.ListenProbeTimeout = time.Second, 500*time.Millisecond
	handled := make(chan string, 4)
	startSub(t, ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
		handled <- m.Payload
		return nil
	}, cfg)
	const deaf = "a NOTIFY sent through the pool did not reach the LISTEN connection"
	if b.mode == "transaction" {
		eventually(t, "the subscriber's warning", func() bool { return strings.Contains(logs.String(), deaf) })
		if !strings.Contains(logs.String(), "SubscriberConfig.ListenDSN") {
			t.Errorf("the warning does not name the fix:\n%s", logs.String())
		}
	}
	pub, err := NewPublisher[string](ob, "q", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(ctx, pool, "polled", nil); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-handled:
		if p != "polled" {
			t.Errorf("handled %q", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a row published while the subscriber's LISTEN hears nothing was not delivered within 10 s")
	}

	h, err := ob.Health(ctx, &HealthOptions{NotifyTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var problem string
	for _, p := range h.Problems {
		if strings.Contains(p, "NOTIFY did not reach") {
			problem = p
		}
	}
	switch b.mode {
	case "transaction":
		if h.NotifyHeard || !strings.Contains(problem, "SubscriberConfig.ListenDSN") {
			t.Errorf("Health through PgBouncer in transaction mode: heard %t, problems %q; want not heard, naming SubscriberConfig.ListenDSN",
				h.NotifyHeard, h.Problems)
		}
		h, err = ob.Health(ctx, &HealthOptions{ListenDSN: as(t, b.server, d)})
		if err != nil {
			t.Fatal(err)
		}
		if !h.NotifyHeard {
			t.Errorf("Health with a direct ListenDSN: NOTIFY not heard (%s)", h.NotifyError)
		}
	case "session":
		if !h.NotifyHeard || problem != "" || strings.Contains(logs.String(), deaf) {
			t.Errorf("LISTEN through PgBouncer in session mode: Health heard %t (%s); subscriber's log:\n%s", h.NotifyHeard, h.NotifyError, logs.String())
		}
	}
}

// afterStatement calls fn once, after the first statement whose text
// holds marker succeeded.
type afterStatement struct {
	marker string
	once   sync.Once
	fn     func()
}

type markedKey struct{}

func (a *afterStatement) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, markedKey{}, strings.Contains(data.SQL, a.marker))
}

func (a *afterStatement) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if marked, _ := ctx.Value(markedKey{}).(bool); marked && data.Err == nil {
		a.once.Do(a.fn)
	}
}

// Migrate's lock holds through PgBouncer in transaction mode, where
// every transaction may run on another server connection. Here another
// client takes the server connection the lock was taken on as soon as
// the lock's statement ends: a lock held by that session (goose's session
// locker) is then out of reach of its unlock, which fails for a minute
// while the lock stays behind; the lock's own transaction keeps its
// server connection, and ends with the migration.
func TestPgBouncerMigrationLockHoldsInTransactionMode(t *testing.T) {
	t.Parallel()
	b := pgBouncer(t)
	if b.mode != "transaction" {
		t.Skip("a session pooler keeps a session's locks")
	}
	d := pgtest.New(t)
	dsn := as(t, b.url, d, "default_query_exec_mode", "exec")
	other, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close(context.Background()) })
	var held pgx.Tx
	tracer := &afterStatement{marker: "advisory", fn: func() {
		var err error
		if held, err = other.Begin(context.Background()); err == nil {
			_, err = held.Exec(context.Background(), "SELECT 1")
		}
		if err != nil {
			t.Errorf("another client's transaction: %v", err)
		}
	}}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ob, err := New(pool, &Config{Schema: d.Schema})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := ob.Migrate(ctx); err != nil {
		t.Errorf("Migrate through PgBouncer in transaction mode: %v", err)
	}
	if held == nil {
		t.Fatal("no statement of Migrate took an advisory lock")
	}
	_ = held.Rollback(context.Background())
	direct, err := pgx.Connect(t.Context(), b.server)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(context.Background())
	var locks int
	if err := direct.QueryRow(t.Context(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1
		AND ((classid::bigint << 32) | objid::bigint) = $1`, ob.naming.LockID()).Scan(&locks); err != nil {
		t.Fatal(err)
	}
	if locks != 0 {
		t.Errorf("%d migration locks of the outbox left held after Migrate", locks)
	}
	if v, err := ob.SchemaVersion(t.Context()); err != nil || v != ob.LatestSchemaVersion() {
		t.Errorf("schema version %d (%v), want %d", v, err, ob.LatestSchemaVersion())
	}
}
