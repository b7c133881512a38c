package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/faultproxy"
	"github.com/outboxgen/outboxgen/internal/naming"
	"github.com/outboxgen/outboxgen/internal/ring"
	"github.com/outboxgen/outboxgen/outbox"
)

type coordinator struct {
	dsn string
	// serverDSN, when set, is the PostgreSQL behind a pooler at dsn, and
	// listenDSN the workers' LISTEN connection.
	serverDSN, listenDSN string
	duration             time.Duration
	workers              int
	rate                 int
	keep                 bool
	restartPG            bool
	// roles runs publishers and workers as least-privileged roles.
	roles bool
	// ring adds the log tier's ring beside the outbox table, and
	// publishers write half of the messages into it.
	ring bool
	log  *slog.Logger

	schema string
	// ends is the directory where workers append their handlers' ends.
	ends string
	pool *pgxpool.Pool
	// server reaches the server's own backends: pool, or a pool of
	// serverDSN when dsn is a pooler.
	server *pgxpool.Pool
	ob     *outbox.Outbox
	// pubPool is what publishers publish on, and workerDSN what workers
	// connect with: the coordinator's, or the publisher's and the
	// subscriber's roles'.
	pubPool   *pgxpool.Pool
	workerDSN string
	proxy     *faultproxy.Proxy

	mu    sync.Mutex
	procs []*workerProc

	// counts of what was done to the system
	kills, terminations, stalls, cuts, halfOpens, restarts, pauses atomic.Int64
	// halfOpened counts the connections left half-open; halfOpenings
	// tracks the half-open faults whose connections the worker has not
	// all closed yet, and halfOpenLasted how long each took.
	halfOpened     atomic.Int64
	halfOpenings   sync.WaitGroup
	halfOpenMu     sync.Mutex
	halfOpenLasted []time.Duration
}

// workerProc is one running worker process.
type workerProc struct {
	n     int
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
}

// tables the coordinator and the workers write, in the scratch schema.
const tables = `
CREATE TABLE published (
    msg_id       bigint PRIMARY KEY,
    ordering_key text,
    seq          int,
    mode         text NOT NULL);
CREATE TABLE rolled_back (msg_id bigint PRIMARY KEY);
CREATE TABLE deliveries (
    id           bigint PRIMARY KEY, -- chosen by the worker, so it can finish a record whose insert's fate it does not know
    msg_id       bigint NOT NULL,
    row_id       bigint NOT NULL,
    ordering_key text,
    seq          int,
    worker       int NOT NULL,
    pid          int NOT NULL,
    sub          text NOT NULL,
    lease_ttl_ms int NOT NULL,
    attempt      int NOT NULL,
    deliveries   int NOT NULL,    -- Message.Deliveries
    claim        text,            -- lock, lease or gone (the row was not there), as the handler began
    lease_expires timestamptz,    -- the lease's expiry, as the handler began (claims by lease)
    started      timestamptz NOT NULL, -- when the handler began, on the worker's clock
    ended        timestamptz,     -- when the outcome was recorded, on the server's clock
    outcome      text,
    handler_end  timestamptz,     -- when the handler returned or its context ended, whichever came first, on the worker's clock
    end_kind     text);           -- returned, lease_lost, stopped or cancelled
CREATE INDEX ON deliveries (row_id, started);
CREATE INDEX ON deliveries (msg_id, started);
CREATE TABLE events (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind   text NOT NULL,
    worker int,
    at     timestamptz NOT NULL,
    until  timestamptz NOT NULL);`

func (c *coordinator) run(ctx context.Context) (bool, error) {
	var err error
	c.pool, err = pgxpool.New(ctx, c.dsn)
	if err != nil {
		return false, err
	}
	defer c.pool.Close()
	c.server = c.pool
	if c.serverDSN != "" {
		if c.server, err = pgxpool.New(ctx, c.serverDSN); err != nil {
			return false, err
		}
		defer c.server.Close()
	}
	c.schema = fmt.Sprintf("chaos_%d", os.Getpid())
	if _, err := c.pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{c.schema}.Sanitize()); err != nil {
		return false, err
	}
	if c.ob, err = outbox.New(c.pool, &outbox.Config{Schema: c.schema}); err != nil {
		return false, err
	}
	c.pubPool, c.workerDSN = c.pool, c.dsn
	if c.roles {
		dropRoles, err := c.asRoles(ctx)
		if err != nil {
			return false, err
		}
		defer dropRoles()
		defer c.pubPool.Close()
	} else if err := c.ob.Migrate(ctx); err != nil {
		return false, err
	}
	// SET LOCAL: through a pooler in transaction mode, a session's
	// settings would stay with the server connection for other clients.
	if err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+pgx.Identifier{c.schema}.Sanitize()); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, tables)
		return err
	}); err != nil {
		return false, err
	}
	if c.roles {
		// The harness's own tables are the application's.
		pub, sub := pgx.Identifier{c.schema + "_publisher"}.Sanitize(), pgx.Identifier{c.schema + "_subscriber"}.Sanitize()
		table := func(name string) string { return pgx.Identifier{c.schema, name}.Sanitize() }
		if _, err := c.pool.Exec(ctx, "GRANT SELECT, INSERT ON "+table("published")+", "+table("rolled_back")+" TO "+pub+
			"; GRANT SELECT, INSERT, UPDATE ON "+table("deliveries")+", "+table("events")+" TO "+sub); err != nil {
			return false, err
		}
	}
	if c.ends, err = os.MkdirTemp("", c.schema+"-ends-"); err != nil {
		return false, err
	}
	defer os.RemoveAll(c.ends)
	u, err := url.Parse(c.dsn)
	if err != nil {
		return false, err
	}
	if c.proxy, err = faultproxy.Listen(u.Host); err != nil {
		return false, err
	}
	defer c.proxy.Close()
	as := "as " + c.pool.Config().ConnConfig.User
	if c.roles {
		as = "as the roles " + c.schema + "_{migrator,publisher,subscriber}"
	}
	if c.ring {
		as += ", half of the messages written into the ring"
	}
	fmt.Printf("chaos: schema %s, %d workers (worker 0 through a fault proxy), %v of faults at %d msgs/s, %s\n",
		c.schema, c.workers, c.duration, c.rate, as)

	for n := range c.workers {
		if err := c.start(ctx, n); err != nil {
			return false, err
		}
	}
	defer c.stopAll()

	began := time.Now()
	pctx, stopPublishing := context.WithCancel(ctx)
	var pubs sync.WaitGroup
	pub := newPublishers(c, 4)
	pub.run(pctx, &pubs)
	c.breakThings(ctx, began)
	stopPublishing()
	pubs.Wait()
	c.proxy.Restore()
	c.halfOpenings.Wait()
	fmt.Printf("chaos: published for %v; draining\n", time.Since(began).Round(time.Second))

	drained := c.drain(ctx, 2*time.Minute)
	c.stopAll()
	if err := c.loadEnds(context.WithoutCancel(ctx)); err != nil {
		return false, err
	}
	a, err := c.account(context.WithoutCancel(ctx), pub)
	if err != nil {
		return false, err
	}
	fmt.Println(a.line(c))
	if c.halfOpens.Load() > 0 {
		fmt.Println(c.halfOpenLine())
	}
	for _, r := range a.recoveries() {
		fmt.Println("chaos: recovery", r)
	}
	problems := a.problems()
	if !drained {
		problems = append(problems, "the outbox did not drain within 2 minutes")
	}
	for _, p := range problems {
		fmt.Println("chaos: FAIL:", p)
	}
	if rows := a.suspects(3); len(rows) > 0 {
		if err := c.history(context.WithoutCancel(ctx), began, rows); err != nil {
			fmt.Println("chaos: the history of rows", rows, "could not be read:", err)
		}
	}
	if len(problems) == 0 && !c.keep {
		_, _ = c.pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+pgx.Identifier{c.schema}.Sanitize()+" CASCADE")
	} else {
		fmt.Printf("chaos: schema %s kept for inspection\n", c.schema)
	}
	return len(problems) == 0, nil
}

// start runs worker n; worker 0 connects through the fault proxy.
func (c *coordinator) start(ctx context.Context, n int) error {
	dsn := c.workerDSN
	if n == 0 {
		u, _ := url.Parse(c.workerDSN)
		u.Host = c.proxy.Addr()
		dsn = u.String()
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "-worker", fmt.Sprint(n), "-schema", c.schema, "-ends", c.ends, "-dsn", dsn, "-listen-dsn", c.listenDSN)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	p := &workerProc{n: n, cmd: cmd, stdin: stdin, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	ready := make(chan struct{})
	go func() {
		buf := make([]byte, 64)
		k, _ := stdout.Read(buf)
		if strings.Contains(string(buf[:k]), "ready") {
			close(ready)
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case <-ready:
	case <-p.done:
		return fmt.Errorf("worker %d exited at start", n)
	case <-time.After(30 * time.Second):
		return fmt.Errorf("worker %d not ready within 30 s", n)
	case <-ctx.Done():
		return ctx.Err()
	}
	c.mu.Lock()
	c.procs = append(c.without(n), p)
	c.mu.Unlock()
	return nil
}

// without returns the running workers other than n. c.mu is held.
func (c *coordinator) without(n int) []*workerProc {
	var out []*workerProc
	for _, p := range c.procs {
		if p.n != n {
			out = append(out, p)
		}
	}
	return out
}

func (c *coordinator) proc(n int) *workerProc {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.procs {
		if p.n == n {
			return p
		}
	}
	return nil
}

// stopAll stops every worker gracefully (closing its standard input),
// killing those that do not exit within 10 s.
func (c *coordinator) stopAll() {
	c.mu.Lock()
	procs := c.procs
	c.procs = nil
	c.mu.Unlock()
	for _, p := range procs {
		_ = p.stdin.Close()
	}
	for _, p := range procs {
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
}

// event records a fault in the events table, on the server's clock.
func (c *coordinator) event(ctx context.Context, kind string, worker int, lasted time.Duration) {
	_, err := c.pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.events (kind, worker, at, until)
		VALUES ($1, nullif($2, -1), clock_timestamp() - make_interval(secs => $3), clock_timestamp())`,
		pgx.Identifier{c.schema}.Sanitize()), kind, worker, lasted.Seconds())
	if err != nil {
		c.log.Warn("chaos: record event", slog.String("kind", kind), slog.Any("error", err))
	}
}

// breakThings injects faults until the duration has passed.
func (c *coordinator) breakThings(ctx context.Context, began time.Time) {
	restartAt := began.Add(c.duration / 2)
	restarted := !c.restartPG
	faults := rand.IntN(6)
	for time.Since(began) < c.duration && ctx.Err() == nil {
		sleep(ctx, time.Duration(2000+rand.IntN(3000))*time.Millisecond)
		if !restarted && time.Now().After(restartAt) {
			restarted = true
			c.restartPostgres(ctx)
			continue
		}
		// Every kind of fault in turn, each at a random target.
		faults++
		switch faults % 6 {
		case 0:
			c.kill(ctx, rand.IntN(c.workers))
		case 1:
			c.terminate(ctx, rand.IntN(c.workers))
		case 2:
			c.stall(ctx, time.Duration(1000+rand.IntN(3000))*time.Millisecond)
		case 3:
			n := c.proxy.Cut()
			c.cuts.Add(1)
			c.event(ctx, "cut", 0, 0)
			c.log.Info("chaos: cut", slog.Int("connections", n))
		case 4:
			c.halfOpen(ctx)
		case 5:
			c.pause(ctx, queues[rand.IntN(len(queues))], time.Duration(1000+rand.IntN(2000))*time.Millisecond)
		}
	}
}

// halfOpenLimit bounds a half-open fault in the events table: twice the
// longest lease, by when every claim the worker made before the fault has
// lost its rows and had its handlers cancelled, so no later delivery
// depends on it, though idle connections of the worker's pool may stay
// half-open until it next uses them.
const halfOpenLimit = 10 * time.Second

// halfOpen leaves worker 0's connections half-open: the proxy closes
// their server side, so PostgreSQL ends the sessions (their transactions
// abort, their row locks go), and keeps their client side open and
// silent, so the worker learns nothing until a statement times out or its
// listener's probe does. The fault lasts, in the events table, until the
// worker has closed every one of those connections, or halfOpenLimit.
func (c *coordinator) halfOpen(ctx context.Context) {
	began := time.Now()
	n, closed := c.proxy.HalfOpen()
	c.halfOpens.Add(1)
	c.halfOpened.Add(int64(n))
	c.log.Info("chaos: half-open", slog.Int("connections", n))
	c.halfOpenings.Add(1)
	go func() {
		defer c.halfOpenings.Done()
		t := time.NewTimer(halfOpenLimit)
		defer t.Stop()
		select {
		case <-closed:
			c.halfOpenMu.Lock()
			c.halfOpenLasted = append(c.halfOpenLasted, time.Since(began))
			c.halfOpenMu.Unlock()
		case <-t.C:
		case <-ctx.Done():
		}
		c.event(context.WithoutCancel(ctx), "half_open", 0, time.Since(began))
	}()
}

// pause pauses queue for d, as an operator would (Outbox.PauseQueue),
// and resumes it: its rows wait meanwhile, and every promise holds
// across it.
func (c *coordinator) pause(ctx context.Context, queue string, d time.Duration) {
	if _, err := c.ob.PauseQueue(ctx, queue, "chaos"); err != nil {
		c.log.Warn("chaos: pause", slog.String("queue", queue), slog.Any("error", err))
		return
	}
	sleep(ctx, d)
	// Resumed even when the run ends meanwhile: the drain needs the queue.
	if _, err := c.ob.ResumeQueue(context.WithoutCancel(ctx), queue); err != nil {
		c.log.Error("chaos: resume", slog.String("queue", queue), slog.Any("error", err))
		return
	}
	c.pauses.Add(1)
	c.event(context.WithoutCancel(ctx), "pause", -1, d)
}

// kill SIGKILLs worker n mid-batch and starts it again.
func (c *coordinator) kill(ctx context.Context, n int) {
	p := c.proc(n)
	if p == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	c.kills.Add(1)
	c.event(ctx, "kill", n, 0)
	sleep(ctx, time.Duration(200+rand.IntN(800))*time.Millisecond)
	if err := c.start(ctx, n); err != nil && ctx.Err() == nil {
		c.log.Error("chaos: restart worker", slog.Int("worker", n), slog.Any("error", err))
	}
}

// terminate ends every backend of worker n (its pool, its listener): on
// the server, through a connection of its own when the workers go through
// a pooler, where the backends carry the application_name of the worker
// whose transaction they run.
func (c *coordinator) terminate(ctx context.Context, n int) {
	var k int
	err := c.server.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1 AND pid <> pg_backend_pid()`, workerApp(n)).Scan(&k)
	if err != nil {
		c.log.Warn("chaos: terminate", slog.Any("error", err))
		return
	}
	c.terminations.Add(int64(k))
	c.event(ctx, "terminate", n, 0)
}

// stall blackholes worker 0's connections for d: every byte is accepted
// and none delivered, then traffic flows again (the connections that
// carried bytes meanwhile are broken and must be noticed).
func (c *coordinator) stall(ctx context.Context, d time.Duration) {
	c.proxy.Stall()
	sleep(ctx, d)
	c.proxy.Restore()
	c.stalls.Add(1)
	c.event(ctx, "stall", 0, d)
}

// restartPostgres restarts the server (OUTBOX_CHAOS_PG_RESTART overrides
// the command).
func (c *coordinator) restartPostgres(ctx context.Context) {
	cmdline := os.Getenv("OUTBOX_CHAOS_PG_RESTART")
	if cmdline == "" {
		versions, _ := filepath.Glob("/etc/postgresql/*")
		if len(versions) == 0 {
			c.log.Error("chaos: no /etc/postgresql cluster to restart; set OUTBOX_CHAOS_PG_RESTART")
			return
		}
		cmdline = "pg_ctlcluster --skip-systemctl-redirect " + filepath.Base(versions[0]) + " main restart"
	}
	began := time.Now()
	out, err := exec.CommandContext(ctx, "sh", "-c", cmdline).CombinedOutput()
	if err != nil {
		c.log.Error("chaos: restart PostgreSQL", slog.Any("error", err), slog.String("output", string(out)))
		return
	}
	c.restarts.Add(1)
	for ctx.Err() == nil {
		if err := c.pool.Ping(ctx); err == nil {
			break
		}
		sleep(ctx, 100*time.Millisecond)
	}
	c.event(ctx, "pg_restart", -1, time.Since(began))
}

// drain waits until the outbox holds no row: every committed message
// acknowledged or dead-lettered. The ring is asked before the table: a
// claim of the ring moves rows that need state into the table in the
// transaction that writes its lanes' progress, so rows moved after the
// table was counted would look drained.
func (c *coordinator) drain(ctx context.Context, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		n, err := c.ringUnread(ctx)
		if err == nil && n == 0 {
			err = c.pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{c.schema, c.ob.Table()}.Sanitize()).Scan(&n)
			if err == nil && n == 0 {
				return true
			}
		}
		sleep(ctx, 200*time.Millisecond)
	}
	return false
}

// names are the outbox's.
func (c *coordinator) names() naming.Names {
	return naming.Names{Schema: c.schema, Table: c.ob.Table()}
}

// ringUnread counts the rows of the ring no lane has read past (0 without
// the ring).
func (c *coordinator) ringUnread(ctx context.Context) (int64, error) {
	if !c.ring {
		return 0, nil
	}
	return ring.Unread(ctx, c.pool, naming.Queries(c.names()), 30*time.Second)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// errRolledBack marks a transaction the publisher rolled back on purpose.
var errRolledBack = errors.New("rolled back on purpose")

// asRoles makes the migrator, publisher and subscriber roles of the
// schema, gives the schema to the migrator, migrates the outbox as the
// migrator and runs, as the migrator, the statements outboxgen grants
// prints for the other two; publishers then publish as the publisher and
// workers connect as the subscriber. drop removes the roles and what
// they own, unless the schema is kept for inspection.
func (c *coordinator) asRoles(ctx context.Context) (drop func(), err error) {
	migrator, publisher, subscriber := c.schema+"_migrator", c.schema+"_publisher", c.schema+"_subscriber"
	ident := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	for _, r := range []string{migrator, publisher, subscriber} {
		if _, err := c.pool.Exec(ctx, "CREATE ROLE "+ident(r)+" LOGIN"); err != nil {
			return nil, fmt.Errorf("create role %s (the -roles mode needs a role that may create roles): %w", r, err)
		}
	}
	drop = func() {
		if c.keep {
			return
		}
		ctx := context.WithoutCancel(ctx)
		for _, r := range []string{migrator, publisher, subscriber} {
			_, _ = c.pool.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", r)
			if _, err := c.pool.Exec(ctx, "REASSIGN OWNED BY "+ident(r)+" TO CURRENT_USER; DROP OWNED BY "+ident(r)+"; DROP ROLE "+ident(r)); err != nil {
				c.log.Warn("chaos: drop role", "role", r, "error", err)
			}
		}
	}
	fail := func(err error) (func(), error) { drop(); return nil, err }
	if _, err := c.pool.Exec(ctx, "ALTER SCHEMA "+ident(c.schema)+" OWNER TO "+ident(migrator)); err != nil {
		return fail(err)
	}
	as := func(role string) (string, error) {
		u, err := url.Parse(c.dsn)
		if err != nil {
			return "", err
		}
		u.User = url.User(role)
		return u.String(), nil
	}
	mdsn, err := as(migrator)
	if err != nil {
		return fail(err)
	}
	mpool, err := pgxpool.New(ctx, mdsn)
	if err != nil {
		return fail(err)
	}
	defer mpool.Close()
	owner, err := outbox.New(mpool, &outbox.Config{Schema: c.schema})
	if err != nil {
		return fail(err)
	}
	if err := owner.Migrate(ctx); err != nil {
		return fail(fmt.Errorf("migrate as %s: %w", migrator, err))
	}
	grants, err := outbox.Grants(&outbox.Config{Schema: c.schema}, outbox.Roles{Publisher: publisher, Subscriber: subscriber})
	if err != nil {
		return fail(err)
	}
	for _, g := range grants {
		if _, err := mpool.Exec(ctx, g); err != nil {
			return fail(fmt.Errorf("as %s: %s: %w", migrator, g, err))
		}
	}
	pdsn, err := as(publisher)
	if err != nil {
		return fail(err)
	}
	if c.pubPool, err = pgxpool.New(ctx, pdsn); err != nil {
		return fail(err)
	}
	if c.workerDSN, err = as(subscriber); err != nil {
		c.pubPool.Close()
		return fail(err)
	}
	return drop, nil
}
