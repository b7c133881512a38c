package main

import (
	"context"
	"fmt"
	"time"
)

// runScaleOut drains the same backlog with one subscriber in one process,
// one subscriber in each of two processes, and two in each of two; more
// subscribers on one table must not be slower. Subscribers run at their
// default configuration.
func runScaleOut(ctx context.Context, env *benchEnv, o options) error {
	n := max(int(100000*o.scale)/drainBatch, 1) * drainBatch
	var reports int64
	shape := func(procs, subs int) func(int) (time.Duration, error) {
		return func(n int) (time.Duration, error) {
			took, rs, err := drainProcesses(ctx, env, o.dsn, tableTarget, n, procs, subs)
			for _, r := range rs {
				reports += r.Handled
			}
			return took, err
		}
	}
	cs := []contender{
		{"1 subscriber, 1 process", shape(1, 1)},
		{"2 subscribers, 2 processes", shape(2, 1)},
		{"4 subscribers, 2 processes", shape(2, 2)},
	}
	s, stats, err := o.measureStatements(ctx, env, n, cs)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "%d-row backlog, no-op handler, subscribers in child processes (%d deliveries in all; client CPU is this process's alone)\n", n, reports)
	names := []string{"1 subscriber, 1 process", "2 subscribers, 2 processes", "4 subscribers, 2 processes"}
	report(o.out, s, names, n, "msg", "1 subscriber, 1 process")
	stats.report(o.out, names, o.rounds, n)
	return nil
}

// runMemory drains 100,000 and then 1,000,000 rows, each in a fresh
// subscriber process, and compares the processes' resident memory at the
// end: nothing may grow per message.
func runMemory(ctx context.Context, env *benchEnv, o options) error {
	small := max(int(100000*o.scale)/drainBatch, 1) * drainBatch
	var rss []int64
	for _, n := range []int{small, small * 10} {
		if err := env.reset(ctx); err != nil {
			return err
		}
		took, rs, err := drainProcesses(ctx, env, o.dsn, tableTarget, n, 1, 1)
		if err != nil {
			return err
		}
		fmt.Fprintf(o.out, "drained %8d rows in %v: RSS %d MiB (%d handled)\n", n, took.Round(time.Millisecond), rs[0].RSSKiB/1024, rs[0].Handled)
		rss = append(rss, rs[0].RSSKiB)
	}
	fmt.Fprintf(o.out, "RSS after %d rows / after %d rows = %.2f\n", small*10, small, float64(rss[1])/float64(rss[0]))
	return nil
}
