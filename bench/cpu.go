package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/bench/internal/procstat"
)

// cpuUse is the CPU time spent by this process (client) and by the local
// PostgreSQL server's processes (server) over one timed run, and the WAL
// the server wrote meanwhile, in bytes.
type cpuUse struct {
	client, server time.Duration
	wal            int64
}

// walPool reads the server's WAL position for the clocks (-cpu).
var walPool *pgxpool.Pool

// clockStatements, when set (-statements), is reset as each clock starts,
// so the statements a suite collects are those of its timed runs alone; a
// reset that fails leaves the run's setup in its figures.
var clockStatements *statementStats

// cpuClock reads both clocks and the WAL position. The server's clock is
// the CPU time of every live process named postgres plus what its
// postmaster reaped from exited backends, so it is only right for a server
// on this machine whose processes this one may read (root, or the same
// user). The WAL position is the server's own, right for any server.
func cpuClock() cpuUse {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	client := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return cpuUse{client: client, server: procstat.Postgres(), wal: walPosition()}
}

// walPosition is the server's WAL insert position in bytes, or 0 when it
// cannot be read.
func walPosition() int64 {
	if walPool == nil {
		return 0
	}
	var pos int64
	if err := walPool.QueryRow(context.Background(),
		"SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint").Scan(&pos); err != nil {
		return 0
	}
	return pos
}

// cpuSamples holds, per contender, the CPU each round used.
type cpuSamples map[string][]cpuUse

// measureCPU makes measure record every round's CPU (-cpu).
var measureCPU bool

// lastCPU is the CPU the last timed run used, read by measure.
var lastCPU cpuUse

// clock times one run: its wall time and, with -cpu, its CPU time.
type clock struct {
	start time.Time
	cpu   cpuUse
}

func startClock() clock {
	if clockStatements != nil {
		_ = clockStatements.reset(context.Background())
	}
	perfControl("enable")
	c := clock{start: time.Now()}
	if measureCPU {
		c.cpu = cpuClock()
	}
	return c
}

// stop returns the wall time since start and records the CPU time in
// lastCPU.
func (c clock) stop() time.Duration {
	took := time.Since(c.start)
	if measureCPU {
		now := cpuClock()
		lastCPU = cpuUse{client: now.client - c.cpu.client, server: now.server - c.cpu.server, wal: now.wal - c.cpu.wal}
	}
	perfControl("disable")
	return took
}

// perfFIFO is the control FIFO of a `perf record --control fifo:...`
// started disabled (-D -1) (-perf-control): timed runs enable it while
// their clock runs, so that a profile holds only the work they time.
var perfFIFO string

// perfControl writes cmd to perfFIFO, when one was given.
func perfControl(cmd string) {
	if perfFIFO == "" {
		return
	}
	if err := os.WriteFile(perfFIFO, []byte(cmd+"\n"), 0); err != nil {
		fmt.Fprintln(os.Stderr, "bench: -perf-control:", err)
	}
}

// reportCPU prints, per contender, the median client and server CPU time
// and WAL bytes per operation over its rounds.
func reportCPU(w io.Writer, s cpuSamples, order []string, n int, unit string) {
	if len(s) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "contender\tclient CPU per %s\tserver CPU per %s\tWAL per %s\t\n", unit, unit, unit)
	for _, name := range order {
		var client, server, wal []time.Duration
		for _, u := range s[name] {
			client, server = append(client, u.client), append(server, u.server)
			wal = append(wal, time.Duration(u.wal))
		}
		if len(client) == 0 {
			continue
		}
		fmt.Fprintf(tw, "%s\t%v\t%v\t%d B\t\n", name,
			(median(client) / time.Duration(n)).Round(time.Microsecond/10), (median(server) / time.Duration(n)).Round(time.Microsecond/10),
			int64(median(wal))/int64(n))
	}
	_ = tw.Flush()
}
