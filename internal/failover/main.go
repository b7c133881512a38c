// Command failover fails an outbox over to a streaming standby mid-drain
// and counts every message.
//
// For each replication mode (synchronous: the primary's
// synchronous_standby_names names the standby and synchronous_commit is
// on; asynchronous) it makes a pair of throwaway clusters with the
// machine's PostgreSQL server binaries, a primary and a standby made with
// pg_basebackup -R, and connects every client through one multi-host DSN
// (both hosts, target_session_attrs=read-write). It migrates the outbox,
// publishes a backlog, and runs publishers, each writing a business row
// (the ledger) and its message in one transaction, and two services of
// two subscribers each (the public API, the default configuration) whose
// handlers append every delivery to a file. Unkeyed rows in bulk are
// claimed by row lock; keyed rows, whose claims find only the keys'
// heads, by lease. Mid-drain, it holds the standby's WAL back for a
// moment, as a slow network would, stops the primary as a crash would
// (an immediate shutdown), promotes the standby (pg_ctl promote) and
// keeps publishing. Then it lets the outbox drain and checks: every
// message on the new primary was delivered; no message without its
// business row or the other way round; with synchronous replication no
// acknowledged commit was lost and no handler saw a message the new
// primary does not hold; per-key order; subscribers recovered without
// Run returning; nothing the old primary left (lock records, leases,
// sleep records, hand-overs) kept a row. It reports the recovery time and,
// with asynchronous replication, the transactions lost.
//
//	go run ./internal/failover -modes sync,async
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	var opt options
	modes := flag.String("modes", "sync,async", "replication modes to fail over in, comma-separated: sync, async")
	runs := flag.Int("runs", 1, "runs of each mode (figures: their medians)")
	flag.StringVar(&opt.bin, "bin", "", "PostgreSQL server binaries (default: initdb on PATH, else the newest /usr/lib/postgresql/*/bin)")
	flag.IntVar(&opt.primaryPort, "primary-port", 5441, "the primary's port")
	flag.IntVar(&opt.standbyPort, "standby-port", 5442, "the standby's port")
	flag.IntVar(&opt.backlog, "backlog", 8000, "unkeyed rows published before the subscribers start")
	flag.IntVar(&opt.publishers, "publishers", 4, "publishing goroutines")
	flag.DurationVar(&opt.period, "period", 10*time.Millisecond, "between one publisher's transactions")
	flag.Float64Var(&opt.killAt, "kill-at", 0.3, "share of the backlog delivered when the primary is stopped")
	flag.DurationVar(&opt.lag, "lag", 500*time.Millisecond, "how long the standby receives no WAL before the primary is stopped")
	flag.DurationVar(&opt.outage, "outage", 2*time.Second, "from the primary's stop to the standby's promotion")
	flag.IntVar(&opt.burst, "burst", 12000, "unkeyed rows published at once after the promotion")
	flag.DurationVar(&opt.after, "after", 3*time.Second, "how long publishing goes on after the promotion")
	flag.DurationVar(&opt.drainTimeout, "drain-timeout", 90*time.Second, "how long the outbox may take to drain after publishing ends")
	flag.BoolVar(&opt.keep, "keep", false, "keep the clusters' directory")
	flag.BoolVar(&opt.verbose, "v", false, "print the subscribers' logs")
	flag.BoolVar(&opt.trace, "trace", false, "print, each second after the promotion, where the rows published before it are")
	flag.Parse()
	if opt.bin == "" {
		bin, err := findBin()
		if err != nil {
			fmt.Fprintln(os.Stderr, "failover:", err)
			os.Exit(2)
		}
		opt.bin = bin
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	failed := false
	for _, mode := range strings.Split(*modes, ",") {
		if mode != "sync" && mode != "async" {
			fmt.Fprintf(os.Stderr, "failover: unknown mode %q (sync, async)\n", mode)
			os.Exit(2)
		}
		var reports []report
		for i := range *runs {
			logs := newLogCounter(os.Stderr, opt.verbose)
			l := &leg{opt: opt, sync: mode == "sync", logs: logs, log: slog.New(logs)}
			began := time.Now()
			fmt.Printf("== %s replication, run %d of %d\n", l.mode(), i+1, *runs)
			err := l.run(ctx)
			for _, line := range l.report.lines {
				fmt.Println("  " + line)
			}
			if s := logs.summary(); len(s) > 0 {
				fmt.Println("  subscribers' warnings and errors:")
				for _, line := range s {
					fmt.Println("    " + line)
				}
			}
			if err != nil {
				l.fail("the harness could not run: %v", err)
			}
			for _, f := range l.report.failures {
				fmt.Printf("  FAILED: %s\n", f)
			}
			fmt.Printf("  %s: %s replication, %s, in %v\n", verdict(l.report.failures), l.mode(), l.version, time.Since(began).Round(time.Second))
			failed = failed || len(l.report.failures) > 0
			reports = append(reports, l.report)
			if ctx.Err() != nil {
				os.Exit(1)
			}
		}
		if *runs > 1 {
			fmt.Printf("== %s: medians of %d runs: first delivery of a new message %v, every subscriber claiming %v, backlog %v after the promotion; lost transactions %v\n",
				mode, *runs, median(reports, func(r report) time.Duration { return r.firstNew }),
				median(reports, func(r report) time.Duration { return r.allSubscribers }),
				median(reports, func(r report) time.Duration { return r.backlog }),
				lostOf(reports))
		}
	}
	if failed {
		os.Exit(1)
	}
}

func verdict(failures []string) string {
	if len(failures) > 0 {
		return "FAILED"
	}
	return "ok"
}

func median(rs []report, f func(report) time.Duration) time.Duration {
	ds := make([]time.Duration, len(rs))
	for i, r := range rs {
		ds[i] = f(r)
	}
	slices.Sort(ds)
	return ds[len(ds)/2].Round(time.Millisecond)
}

func lostOf(rs []report) []int {
	out := make([]int, len(rs))
	for i, r := range rs {
		out[i] = r.lostTx
	}
	return out
}
