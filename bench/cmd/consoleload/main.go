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

	"github.com/outboxgen/outboxgen/bench/internal/procstat"
	"github.com/outboxgen/outboxgen/console"
	"github.com/outboxgen/outboxgen/internal/bigoutbox"
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
	backendCPU := procstat.Duration(ticks)
	share := func(ms float64) string { return fmt.Sprintf("%.3f %%", ms/float64(wall.Milliseconds())*100) }

	n, median, slowest := served.summary()
	fmt.Printf("\nOne tab on the outbox page (%d outbox rows, %d dead letters), refreshed every %v for %v (%s)\n",
		bigoutbox.Rows, bigoutbox.DeadLetters, every, wall.Round(time.Second), cmp.Or(chromium, "fetched as the page's script does"))
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
	if err := bigoutbox.Fill(ctx, pool); err != nil {
		return err
	}
	log.Printf("built the outbox (%d rows, %d dead letters) in %v", bigoutbox.Rows, bigoutbox.DeadLetters, time.Since(start).Round(time.Millisecond))
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
		if t, ok := procstat.Read(filepath.Join("/proc", strconv.Itoa(pid), "stat")); ok {
			out[pid] = t.User + t.System
		}
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
