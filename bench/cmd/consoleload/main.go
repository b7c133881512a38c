// Command consoleload measures what one browser tab of the console costs
// the database: the outbox page left open, refreshing itself every five
// seconds, on an outbox of 1,000,000 rows and 100,000 dead letters.
//
// It starts a PostgreSQL cluster of its own with the machine's server
// binaries (as the tests do when nothing else answers, as the postgres
// user when run as root), with pg_stat_statements loaded, autovacuum on
// and track_io_timing on; builds the outbox the console's plan test
// builds; serves the console on a loopback port; and, for -duration,
// fetches the outbox page every -every as the page's script does (or, with
// -chromium, leaves the page open in a headless Chromium, whose script
// does it). Then it reports the database's share of one CPU core two
// ways: the execution (and planning) time pg_stat_statements recorded for
// every statement over the wall time, and the CPU time (utime + stime in
// /proc) of the console pool's backends, which the pool keeps open
// (MinConns = MaxConns) for the whole run. The bar is 2 % of one core.
//
//	cd bench && go run ./cmd/consoleload
//	cd bench && go run ./cmd/consoleload -duration 1m -chromium /usr/bin/chromium
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/console"
	"github.com/outboxgen/outboxgen/internal/localpg"
	"github.com/outboxgen/outboxgen/outbox"
)

const (
	schema = "consoleload"
	// appName is the console pool's application_name, by which its
	// backends are found in pg_stat_activity.
	appName = "outboxgen-console"
	// poolSize is the console pool's MinConns and MaxConns.
	poolSize = 4
	// clockTicks is the unit of /proc/PID/stat times (USER_HZ).
	clockTicks = 100
)

func main() {
	duration := flag.Duration("duration", 5*time.Minute, "how long the tab stays open")
	every := flag.Duration("every", 5*time.Second, "the page's refresh period (the console's default)")
	chromium := flag.String("chromium", "", "drive a headless Chromium at this path (e.g. /usr/bin/chromium) on the page instead of fetching it")
	top := flag.Int("top", 10, "how many statements to list")
	flag.Parse()
	log.SetFlags(log.Ltime)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *duration, *every, *chromium, *top); err != nil {
		log.Printf("consoleload: %v", err)
		stop()
		os.Exit(1)
	}
}

func run(ctx context.Context, duration, every time.Duration, chromium string, top int) error {
	srv, err := localpg.StartCluster(ctx,
		"shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track_planning=on",
		"autovacuum=on", "track_io_timing=on")
	if err != nil {
		return fmt.Errorf("start a cluster: %w", err)
	}
	defer srv.Stop()
	log.Printf("started %s", srv.How)

	admin, err := pgx.Connect(ctx, srv.URL)
	if err != nil {
		return err
	}
	defer func() { _ = admin.Close(context.Background()) }()
	if _, err := admin.Exec(ctx, "CREATE EXTENSION pg_stat_statements; CREATE SCHEMA "+schema); err != nil {
		return err
	}
	if err := build(ctx, srv.URL+"&search_path="+schema); err != nil {
		return fmt.Errorf("build the outbox: %w", err)
	}

	cfg, err := pgxpool.ParseConfig(srv.URL)
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	cfg.MinConns, cfg.MaxConns = poolSize, poolSize
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := fill(ctx, pool); err != nil {
		return err
	}
	h, err := console.New(console.Config{Pool: pool})
	if err != nil {
		return err
	}
	served := &servedLog{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: served.wrap(h), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	defer func() { _ = hs.Close() }()
	page := "http://" + ln.Addr().String() + "/o/" + schema + "/outbox/"

	pids, err := backends(ctx, admin)
	if err != nil {
		return err
	}
	load0 := loadavg()
	if _, err := admin.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
		return err
	}
	cpu0 := cpuTicks(pids)
	start := time.Now()
	log.Printf("the tab is open on %s for %v", page, duration)
	if chromium != "" {
		err = browse(ctx, chromium, page, duration)
	} else {
		err = fetch(ctx, page, every, duration)
	}
	if err != nil {
		return err
	}
	wall := time.Since(start)
	cpu1 := cpuTicks(pids)
	load1 := loadavg()
	stats, err := statements(ctx, admin)
	if err != nil {
		return err
	}
	after, err := backends(ctx, admin)
	if err != nil {
		return err
	}
	vacuums, err := autovacuums(ctx, admin, start)
	if err != nil {
		return err
	}
	var exec, plan float64
	var calls int64
	for _, s := range stats {
		exec, plan, calls = exec+s.exec, plan+s.plan, calls+s.calls
	}
	var ticks int64
	for pid, t := range cpu1 {
		ticks += t - cpu0[pid]
	}
	backendCPU := time.Duration(ticks) * time.Second / clockTicks
	share := func(ms float64) string { return fmt.Sprintf("%.3f %%", ms/float64(wall.Milliseconds())*100) }

	n, median, slowest := served.summary()
	fmt.Printf("\nOne tab on the outbox page (%d outbox rows, %d dead letters), refreshed every %v for %v (%s)\n",
		fixtureRows, fixtureDead, every, wall.Round(time.Second), cmp.Or(chromium, "fetched as the page's script does"))
	fmt.Printf("machine: %d cores; load average %s at the start, %s at the end\n", runtime.NumCPU(), load0, load1)
	fmt.Printf("autovacuum: %s\n", vacuums)
	fmt.Printf("requests served: %d; server time median %v, slowest %v\n", n, median.Round(time.Millisecond/10), slowest.Round(time.Millisecond/10))
	fmt.Printf("pg_stat_statements: %d calls; execution %.1f ms, planning %.1f ms over %v of wall time\n",
		calls, exec, plan, wall.Round(time.Second))
	fmt.Printf("  share of one core, execution:             %s\n", share(exec))
	fmt.Printf("  share of one core, execution + planning:  %s\n", share(exec+plan))
	fmt.Printf("console pool's backends (%d, application_name %s): %v of CPU (utime + stime)\n", len(pids), appName, backendCPU)
	fmt.Printf("  share of one core:                        %s\n", share(float64(backendCPU.Milliseconds())))
	if !slices.Equal(pids, after) {
		fmt.Printf("  (the pool's backends changed during the run: %v, then %v; the figure counts only those of the start)\n", pids, after)
	}
	fmt.Printf("\nTop statements by execution + planning time:\n")
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "calls\tmean exec ms\tmean plan ms\ttotal ms\tstatement\n")
	for _, s := range stats[:min(top, len(stats))] {
		fmt.Fprintf(tw, "%d\t%.3f\t%.3f\t%.1f\t%s\n", s.calls, s.exec/float64(max(s.calls, 1)), s.plan/float64(max(s.calls, 1)), s.exec+s.plan, s.query)
	}
	return tw.Flush()
}

// build migrates the outbox and fills it with the fixture, through dsn,
// whose search path is the outbox's schema.
func build(ctx context.Context, dsn string) error {
	start := time.Now()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	if err != nil {
		return err
	}
	if err := ob.Migrate(ctx); err != nil {
		return err
	}
	for i, s := range fixtureSQL() {
		if _, err := pool.Exec(ctx, s.SQL, s.Args...); err != nil {
			return fmt.Errorf("statement %d: %w", i, err)
		}
	}
	log.Printf("built the outbox (%d rows, %d dead letters) in %v", fixtureRows, fixtureDead, time.Since(start).Round(time.Millisecond))
	return nil
}

// fill opens every connection of the pool, so that its backends exist
// from the start.
func fill(ctx context.Context, pool *pgxpool.Pool) error {
	conns := make([]*pgxpool.Conn, 0, poolSize)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range poolSize {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}

// backends returns the pids of the console pool's backends.
func backends(ctx context.Context, admin *pgx.Conn) ([]int, error) {
	rows, err := admin.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1 ORDER BY pid", appName)
	if err != nil {
		return nil, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	out := make([]int, len(pids))
	for i, p := range pids {
		out[i] = int(p)
	}
	if err == nil && len(out) != poolSize {
		err = fmt.Errorf("the console pool has %d backends, want %d", len(out), poolSize)
	}
	return out, err
}

// cpuTicks reads each process's user and system time, in clock ticks.
func cpuTicks(pids []int) map[int]int64 {
	out := map[int]int64{}
	for _, pid := range pids {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		// After the command: state is field 3 of proc(5), utime 14, stime 15.
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		k, _ := strconv.ParseInt(f[12], 10, 64)
		out[pid] = u + k
	}
	return out
}

// loadavg is the machine's load average over 1, 5 and 15 minutes.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// autovacuums says when autovacuum last vacuumed each of the outbox's
// tables, from the start of the run.
func autovacuums(ctx context.Context, admin *pgx.Conn, start time.Time) (string, error) {
	rows, err := admin.Query(ctx, `SELECT relname::text, last_autovacuum FROM pg_stat_user_tables
		WHERE schemaname = $1 AND relname IN ('outbox', 'outbox_dlq') ORDER BY relname`, schema)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var name string
		var at *time.Time
		if err := rows.Scan(&name, &at); err != nil {
			return "", err
		}
		switch {
		case at == nil:
			out = append(out, name+" not vacuumed")
		case at.Before(start):
			out = append(out, fmt.Sprintf("%s vacuumed %v before the start", name, start.Sub(*at).Round(time.Second)))
		default:
			out = append(out, fmt.Sprintf("%s vacuumed %v into the run", name, at.Sub(start).Round(time.Second)))
		}
	}
	return strings.Join(out, ", "), rows.Err()
}

// stat is one statement's line of pg_stat_statements.
type stat struct {
	query      string
	calls      int64
	exec, plan float64 // total milliseconds
}

// statements reads pg_stat_statements, the costliest first.
func statements(ctx context.Context, admin *pgx.Conn) ([]stat, error) {
	// All but the measurement's own: the reset and this read.
	rows, err := admin.Query(ctx, `SELECT query, calls, total_exec_time, total_plan_time
		FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%'
		ORDER BY total_exec_time + total_plan_time DESC`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []stat
	for rows.Next() {
		var s stat
		if err := rows.Scan(&s.query, &s.calls, &s.exec, &s.plan); err != nil {
			return nil, err
		}
		s.query = shorten(s.query)
		out = append(out, s)
	}
	return out, rows.Err()
}

// shorten names a statement by its sqlc name, or its first 60 characters
// on one line.
func shorten(q string) string {
	if _, rest, ok := strings.Cut(q, "-- name: "); ok {
		name, _, _ := strings.Cut(rest, " ")
		return name
	}
	q = strings.Join(strings.Fields(q), " ")
	if len(q) > 60 {
		q = q[:60] + "…"
	}
	return q
}

// fetch opens the page and fetches it again every period, as the page's
// script does while it is visible, until duration has passed.
func fetch(ctx context.Context, page string, every, duration time.Duration) error {
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	get := func(refresh bool) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, page, nil)
		if err != nil {
			return err
		}
		if refresh {
			req.Header.Set("X-Console-Refresh", "1")
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("GET %s: %s", page, resp.Status)
		}
		return err
	}
	if err := get(false); err != nil {
		return err
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	end := time.After(duration)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-end:
			return nil
		case <-tick.C:
			if err := get(true); err != nil {
				return err
			}
		}
	}
}

// browse leaves the page open in a headless Chromium for duration.
func browse(ctx context.Context, chromium, page string, duration time.Duration) error {
	profile, err := os.MkdirTemp("", "consoleload-chromium-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(profile) }()
	cmd := exec.Command(chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+profile, page)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		// Chromium's own child processes are in its process group.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	}()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case err := <-exited:
		exited <- err
		return fmt.Errorf("chromium exited early: %v", err)
	case <-time.After(duration):
		return nil
	}
}

// servedLog times the requests the console serves.
type servedLog struct {
	mu    sync.Mutex
	times []time.Duration
}

func (s *servedLog) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		h.ServeHTTP(w, r)
		if !strings.HasPrefix(r.URL.Path, "/o/") {
			return // the style sheet, the script, a browser's favicon
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.times = append(s.times, time.Since(start))
	})
}

// summary returns how many outbox pages were served, the median server time and
// the slowest.
func (s *servedLog) summary() (int, time.Duration, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.times) == 0 {
		return 0, 0, 0
	}
	t := slices.Sorted(slices.Values(s.times))
	return len(t), t[len(t)/2], t[len(t)-1]
}

// The outbox is the one the console's plan test and page benchmark build
// (console/fixture_test.go), from a copy of its statements, which that
// package's tests hold equal to these: 1,000,000 outbox rows over four
// queues and 100,000 dead letters.
const (
	fixtureRounds   = 10     // rounds of inserts, each a slice of the id range
	fixturePlain    = 80_000 // rows without an ordering key, per round
	fixtureKeys     = 1_000  // ordering keys per round
	fixturePerKey   = 20     // rows per key: its head and the rows behind it
	fixtureDead     = 100_000
	fixtureRows     = fixtureRounds * (fixturePlain + fixtureKeys*fixturePerKey)
	fixtureFirstRow = 150_001 // ids below it are the dead letters' (and gaps)
)

// fixtureQueue is the SQL expression of the queue of row n.
func fixtureQueue(n string) string {
	return `(ARRAY['orders','orders','orders','orders','emails','emails','emails','webhooks','webhooks','billing'])[1 + ` + n + ` % 10]`
}

// fixtureSQL are the statements that fill a freshly migrated outbox (its
// schema first on the search path), in order, each with its arguments.
//
// Rows without a key, by their number i, of every 1,000 values of i / 10
// (so that every queue, i % 10, has rows in every state): 855 ready (due
// since they were created), 50 scheduled for the next two hours, 20
// scheduled with a timer id for the next day, 60 retrying (an attempt or
// more, a last error, half of them due again), 12 leased with a live lease
// and 3 leased with a lease that expired minutes ago. Rows with a key come
// as 20 per key, inserted head first: the ordering trigger leaves a key's
// lowest id unblocked and blocks every later row of it. Heads, by key k,
// of every 20 values of k / 10: 10 ready, 3 leased, 1 leased past its
// expiry, 3 retrying and 3 scheduled, these due later; the rows behind
// them are due. Rows are created 50 ms apart, the oldest about 14 hours
// ago. Dead letters take the ids below fixtureFirstRow (with gaps, the
// rows delivered between them), spread over the four queues and the four
// reasons, one failing every 25 seconds over the last 29 days. The inserts
// fire the triggers (the ordering trigger per keyed row, the wake-up per
// statement) as publishers' inserts do; nothing is dropped to speed them.
func fixtureSQL() []fixtureStmt {
	stmts := []fixtureStmt{
		{SQL: `SELECT setval('outbox_id_seq', $1::bigint - 1)`, Args: []any{fixtureFirstRow}},
		{SQL: `INSERT INTO outbox_dlq (id, queue, payload, headers, ordering_key, timer_id, deliveries_count,
				attempts_count, created_at, failed_at, failure_reason, last_error)
			SELECT g.j + (g.j - 1) / 2, ` + fixtureQueue("g.j") + `,
			       convert_to(format('{"order":%s,"customer":"customer-%s","total":%s,"items":["tea","cake","scones"]}',
			                         g.j, g.j % 5000, 100 + g.j % 9900), 'UTF8'),
			       '{"content-type":"application/json","source":"checkout"}'::jsonb,
			       CASE WHEN g.j % 5 = 0 THEN 'customer-' || g.j % 10000 END,
			       CASE WHEN g.j % 50 = 0 THEN 'timer-dead-' || g.j END,
			       CASE WHEN r.reason = 'max_deliveries' THEN 10 ELSE 5 END,
			       CASE WHEN r.reason IN ('max_deliveries', 'decode_error') THEN 0 ELSE 5 END,
			       f.failed - interval '10 minutes', f.failed, r.reason,
			       CASE r.reason WHEN 'retry_exhausted' THEN format('handler: POST https://hooks.example.com/%s: 503 Service Unavailable', g.j % 100)
			                     WHEN 'rejected' THEN 'handler: customer ' || g.j % 5000 || ' is closed'
			                     WHEN 'decode_error' THEN 'decode: unexpected end of JSON input' END
			FROM generate_series(1, $1::int) AS g(j)
			CROSS JOIN LATERAL (SELECT now() - ($1::int - g.j) * interval '25 seconds' AS failed) AS f
			CROSS JOIN LATERAL (SELECT (ARRAY['max_deliveries','retry_exhausted','rejected','decode_error'])[1 + (g.j / 10) % 4] AS reason) AS r`,
			Args: []any{fixtureDead}},
	}
	plain := `INSERT INTO outbox (queue, payload, headers, timer_id, created_at, next_attempt_at, attempts_count,
			deliveries_count, first_attempt_at, last_attempt_at, acquired_at, acquired_token, lease_expires_at, last_error)
		SELECT ` + fixtureQueue("g.i") + `,
		       convert_to(format('{"order":%s,"customer":"customer-%s","total":%s,"items":["tea","cake","scones"]}',
		                         g.i, g.i % 5000, 100 + g.i % 9900), 'UTF8'),
		       '{"content-type":"application/json","source":"checkout"}'::jsonb,
		       CASE WHEN s.st = 'timer' THEN 'timer-' || g.i END,
		       c.created,
		       CASE s.st WHEN 'scheduled' THEN now() + (1 + g.i % 7200) * interval '1 second'
		                 WHEN 'timer' THEN now() + (1 + g.i % 86400) * interval '1 second'
		                 WHEN 'retrying' THEN now() + (g.i % 1800 - 900) * interval '1 second'
		                 ELSE c.created END,
		       CASE WHEN s.st = 'retrying' THEN 1 + g.i % 5 ELSE 0 END,
		       CASE WHEN s.st = 'retrying' THEN 1 + g.i % 5 WHEN s.st IN ('leased', 'expired') THEN 1 ELSE 0 END,
		       CASE WHEN s.st = 'retrying' THEN c.created + interval '1 second' ELSE l.acquired END,
		       CASE WHEN s.st = 'retrying' THEN now() - (900 + g.i % 600) * interval '1 second' ELSE l.acquired END,
		       l.acquired,
		       CASE WHEN l.acquired IS NOT NULL THEN md5(g.i::text)::uuid END,
		       l.acquired + interval '30 seconds',
		       CASE WHEN s.st = 'retrying' THEN format('handler: POST https://hooks.example.com/%s: 503 Service Unavailable', g.i % 100) END
		FROM generate_series($1::int, $2::int) AS g(i)
		CROSS JOIN LATERAL (SELECT g.i / 10 % 1000 AS n) AS n
		CROSS JOIN LATERAL (SELECT CASE WHEN n.n < 855 THEN 'ready' WHEN n.n < 905 THEN 'scheduled'
		                                WHEN n.n < 925 THEN 'timer' WHEN n.n < 985 THEN 'retrying'
		                                WHEN n.n < 997 THEN 'leased' ELSE 'expired' END AS st) AS s
		CROSS JOIN LATERAL (SELECT now() - ($3::int - $4::int - g.i) * interval '50 ms' AS created) AS c
		CROSS JOIN LATERAL (SELECT CASE s.st WHEN 'leased' THEN now() - (g.i % 20) * interval '1 second'
		                                     WHEN 'expired' THEN now() - (300 + g.i % 600) * interval '1 second' END AS acquired) AS l
		ORDER BY g.i`
	keyed := `INSERT INTO outbox (queue, payload, headers, ordering_key, created_at, next_attempt_at, attempts_count,
			deliveries_count, first_attempt_at, last_attempt_at, acquired_at, acquired_token, lease_expires_at, last_error)
		SELECT ` + fixtureQueue("k.k") + `,
		       convert_to(format('{"customer":"customer-%s","event":%s,"status":"updated"}', k.k, p.p), 'UTF8'),
		       '{"content-type":"application/json","source":"accounts"}'::jsonb,
		       'customer-' || k.k,
		       c.created,
		       CASE s.st WHEN 'retrying' THEN now() + (60 + k.k % 1800) * interval '1 second'
		                 WHEN 'scheduled' THEN now() + (60 + k.k % 7200) * interval '1 second'
		                 ELSE c.created END,
		       CASE WHEN s.st = 'retrying' THEN 1 + k.k % 5 ELSE 0 END,
		       CASE WHEN s.st = 'retrying' THEN 1 + k.k % 5 WHEN s.st IN ('leased', 'expired') THEN 1 ELSE 0 END,
		       CASE WHEN s.st = 'retrying' THEN c.created + interval '1 second' ELSE l.acquired END,
		       CASE WHEN s.st = 'retrying' THEN now() - (k.k % 600) * interval '1 second' ELSE l.acquired END,
		       l.acquired,
		       CASE WHEN l.acquired IS NOT NULL THEN md5('key' || k.k)::uuid END,
		       l.acquired + interval '30 seconds',
		       CASE WHEN s.st = 'retrying' THEN 'handler: customer ' || k.k || ': account is locked' END
		FROM generate_series(0, $3::int - 1) AS p(p)
		CROSS JOIN generate_series($1::int, $2::int) AS k(k)
		CROSS JOIN LATERAL (SELECT k.k / 10 % 20 AS n) AS n
		CROSS JOIN LATERAL (SELECT CASE WHEN p.p > 0 THEN 'behind' WHEN n.n < 10 THEN 'ready'
		                                WHEN n.n < 13 THEN 'leased' WHEN n.n = 13 THEN 'expired'
		                                WHEN n.n < 17 THEN 'retrying' ELSE 'scheduled' END AS st) AS s
		CROSS JOIN LATERAL (SELECT now() - ($4::int - p.p * $5::int - k.k % $5::int) * interval '50 ms' AS created) AS c
		CROSS JOIN LATERAL (SELECT CASE s.st WHEN 'leased' THEN now() - (k.k % 20) * interval '1 second'
		                                     WHEN 'expired' THEN now() - (300 + k.k % 600) * interval '1 second' END AS acquired) AS l
		ORDER BY p.p, k.k`
	// Each round's keyed rows are created after its plain ones; a key's
	// rows follow one another every keys-of-the-round rows. A round takes
	// one advisory lock per key (the ordering trigger's), held to its end:
	// a thousand keys stay well inside the server's lock table.
	perRound := fixturePlain + fixtureKeys*fixturePerKey
	for r := range fixtureRounds {
		first := r*fixturePlain + 1
		stmts = append(stmts,
			fixtureStmt{SQL: plain, Args: []any{first, first + fixturePlain - 1, fixtureRows, r * (perRound - fixturePlain)}},
			fixtureStmt{SQL: keyed, Args: []any{r * fixtureKeys, (r+1)*fixtureKeys - 1, fixturePerKey,
				fixtureRows - r*perRound - fixturePlain, fixtureKeys}})
	}
	// Statistics, as autovacuum's analyze would gather them; no vacuum.
	// The tables stay as a burst of inserts leaves them: no page marked
	// all-visible, so every index-only scan checks the table too. That is
	// the harder case for the plans (the test database runs with
	// autovacuum off, so nothing vacuums them during the test either).
	return append(stmts, fixtureStmt{SQL: "ANALYZE outbox, outbox_dlq"})
}

// fixtureStmt is one statement of the fixture.
type fixtureStmt struct {
	SQL  string
	Args []any
}
