package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/outbox"
)

// childEnv names the variable that turns the benchmark binary into a
// subscriber process: its value is the number of subscribers to run.
const childEnv = "OUTBOXBENCH_CHILD_SUBSCRIBERS"

// childSchemaEnv names the variable that gives a subscriber process the
// schema of the outbox it subscribes to: schemaOurs when it is unset.
const childSchemaEnv = "OUTBOXBENCH_CHILD_SCHEMA"

// childReport is what a subscriber process prints when it stops.
type childReport struct {
	Handled int64 `json:"handled"`
	RSSKiB  int64 `json:"rss_kib"`
}

// runChild runs subscribers on the benchmark's outbox (in the schema
// childSchemaEnv names) until its standard input closes, then prints a
// childReport. It is the body of the child processes of the scale-out,
// ringscale and memory suites.
func runChild(dsn string, subscribers int) error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	ob, err := outbox.New(pool, &outbox.Config{Schema: cmp.Or(os.Getenv(childSchemaEnv), schemaOurs)})
	if err != nil {
		return err
	}
	var handled atomic.Int64
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, subscribers)
	for range subscribers {
		sub, err := outbox.NewSubscriber(ob, []string{topic}, func(context.Context, *outbox.Message[order]) error {
			handled.Add(1)
			return nil
		}, defaultConfig[order]())
		if err != nil {
			stop()
			return err
		}
		wg.Go(func() { errs <- sub.Run(rctx) })
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin) // the parent closes it to stop us
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	rss, err := rssKiB()
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(childReport{Handled: handled.Load(), RSSKiB: rss})
}

// rssKiB reads this process's resident set size.
func rssKiB() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, errors.New("no VmRSS in /proc/self/status")
}

// child is a running subscriber process.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// startChild starts a subscriber process with subscribers subscribers on
// the outbox in schema, and waits until they run.
func startChild(dsn, schema string, subscribers int) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-dsn", dsn)
	cmd.Env = append(os.Environ(), childEnv+"="+strconv.Itoa(subscribers), childSchemaEnv+"="+schema)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	if line, err := c.out.ReadString('\n'); err != nil || line != "ready\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("subscriber process did not start: %q %v", line, err)
	}
	return c, nil
}

// stop ends the process and returns its report.
func (c *child) stop() (childReport, error) {
	_ = c.stdin.Close()
	var r childReport
	err := json.NewDecoder(c.out).Decode(&r)
	if werr := c.cmd.Wait(); err == nil {
		err = werr
	}
	return r, err
}

// drainTarget is what drainProcesses drains: the outbox its subscriber
// processes subscribe to (by schema), how its n-row backlog is written,
// the tables locked while the processes start (every claim of the
// outbox's subscribers waits for the lock on one of them), and the wait
// until it is drained.
type drainTarget struct {
	schema  string
	fill    func(ctx context.Context, env *benchEnv, n int) error
	gate    []pgx.Identifier
	drained func(ctx context.Context, env *benchEnv) error
}

// tableTarget is the bench outbox's table, written by PublishBatch,
// drained when it holds no row.
var tableTarget = drainTarget{
	schema:  schemaOurs,
	fill:    func(ctx context.Context, env *benchEnv, n int) error { return outboxBacklog(ctx, env, n) },
	gate:    []pgx.Identifier{outboxTable},
	drained: waitEmpty,
}

// drainProcesses writes b's n-row backlog, starts procs processes of subs
// subscribers each, and times them until b is drained.
func drainProcesses(ctx context.Context, env *benchEnv, dsn string, b drainTarget, n, procs, subs int) (time.Duration, []childReport, error) {
	if err := b.fill(ctx, env, n); err != nil {
		return 0, nil, err
	}
	var children []*child
	stopAll := func() ([]childReport, error) {
		var reports []childReport
		var errs []error
		for _, c := range children {
			r, err := c.stop()
			reports = append(reports, r)
			errs = append(errs, err)
		}
		return reports, errors.Join(errs...)
	}
	// Start the processes while a lock keeps their claims waiting, and
	// start the clock when it is released, so start-up is not timed.
	tx, err := env.pool.Begin(ctx)
	if err != nil {
		return 0, nil, err
	}
	var gate []string
	for _, t := range b.gate {
		gate = append(gate, t.Sanitize())
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+strings.Join(gate, ", ")+" IN EXCLUSIVE MODE"); err != nil {
		_ = tx.Rollback(ctx)
		return 0, nil, err
	}
	for range procs {
		c, err := startChild(dsn, b.schema, subs)
		if err != nil {
			_ = tx.Rollback(ctx)
			_, _ = stopAll()
			return 0, nil, err
		}
		children = append(children, c)
	}
	clock := startClock()
	if err := tx.Commit(ctx); err != nil {
		_, _ = stopAll()
		return 0, nil, err
	}
	werr := b.drained(ctx, env)
	took := clock.stop()
	reports, err := stopAll()
	return took, reports, errors.Join(werr, err)
}

// waitEmpty polls, every 20 ms, until the outbox holds no row. It asks
// for the lowest id through the primary key; each poll still steps over
// the index entries of the rows drained so far (up to about 1 ms for a
// 100,000-row backlog), and the server CPU the suite reports counts it,
// so it polls no more often than the clock needs.
func waitEmpty(ctx context.Context, env *benchEnv) error {
	q := "SELECT count(*) > 0 FROM (SELECT 1 FROM " + pgx.Identifier{schemaOurs, "outbox"}.Sanitize() + " ORDER BY id LIMIT 1) AS first"
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var any bool
		if err := env.pool.QueryRow(ctx, q).Scan(&any); err != nil {
			return err
		}
		if !any {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("outbox not empty after 2 minutes")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
