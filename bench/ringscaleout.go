package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// ringTarget is the bench ring outbox's ring, written with plain SQL (one
// statement per drainBatch unkeyed rows, as the ring suite writes them);
// the lock on its lanes holds the claims of the ring, the lock on its
// table the claims of the table.
var ringTarget = drainTarget{
	schema:  schemaRing,
	fill:    func(ctx context.Context, env *benchEnv, n int) error { return keyedBacklog(ctx, env, ringTable, n, 0) },
	gate:    []pgx.Identifier{{schemaRing, "outbox"}, {schemaRing, "outbox_ring_lanes"}},
	drained: func(ctx context.Context, env *benchEnv) error { return waitRingDrained(ctx, env, 20*time.Millisecond) },
}

// runRingScale drains the same backlog, written into the ring, with one
// subscriber in one process, one in each of two processes, and one in
// each of four: a queue's unkeyed rows lie in four lanes, each read by
// one claim at a time. Subscribers run at their default configuration
// (claims by lock). A run ends when every lane's progress has passed its
// rows and the ring outbox's table is empty, and fails unless the
// processes' handlers ran exactly n times: every row was read, so each
// was handled at least once, and none twice.
func runRingScale(ctx context.Context, env *benchEnv, o options) error {
	n := max(int(100000*o.scale)/drainBatch, 1) * drainBatch
	one, two, four := "1 subscriber, 1 process", "2 subscribers, 2 processes", "4 subscribers, 4 processes"
	names := []string{one, two, four}
	// byProcess holds, per shape, each round's deliveries by process.
	byProcess := map[string][]string{}
	shape := func(name string, procs int) func(int) (time.Duration, error) {
		return func(n int) (time.Duration, error) {
			took, rs, err := drainProcesses(ctx, env, o.dsn, ringTarget, n, procs, 1)
			var handled int64
			var each []string
			for _, r := range rs {
				handled += r.Handled
				each = append(each, fmt.Sprint(r.Handled))
			}
			byProcess[name] = append(byProcess[name], strings.Join(each, "+"))
			if err == nil && handled != int64(n) {
				err = fmt.Errorf("the processes handled %d deliveries (%s) for %d rows", handled, strings.Join(each, "+"), n)
			}
			return took, err
		}
	}
	cs := []contender{{one, shape(one, 1)}, {two, shape(two, 2)}, {four, shape(four, 4)}}
	s, stats, err := o.measureStatements(ctx, env, n, cs)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "%d-row backlog in the ring (unkeyed, 4 lanes), no-op handler, subscribers at their defaults in child processes; "+
		"clock stops when every lane's progress passed its rows and the table is empty; every row handled once (client CPU is this process's alone)\n", n)
	report(o.out, s, names, n, "msg", one)
	fmt.Fprintln(o.out, "deliveries by process, each round:")
	for _, name := range names {
		fmt.Fprintf(o.out, "  %s: %s\n", name, strings.Join(byProcess[name], ", "))
	}
	stats.report(o.out, names, o.rounds, n)
	return nil
}
