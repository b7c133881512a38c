package main

import (
	"fmt"
	"io"
	"path/filepath"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/outboxgen/outboxgen/bench/internal/procstat"
)

// cpuUse is the CPU time spent by this process (client) and by the local
// PostgreSQL server's processes (server) over one timed run.
type cpuUse struct{ client, server time.Duration }

// cpuClock reads both clocks. The server's is the CPU time of every live
// process named postgres plus what its postmaster reaped from exited
// backends, so it is only right for a server on this machine whose
// processes this one may read (root, or the same user).
func cpuClock() cpuUse {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	client := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return cpuUse{client: client, server: serverCPU()}
}

func serverCPU() time.Duration {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var ticks int64
	for _, p := range stats {
		if t, ok := procstat.Read(p); ok && t.Command == "postgres" {
			ticks += t.User + t.System + t.ChildUser + t.ChildSystem
		}
	}
	return procstat.Duration(ticks)
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
		lastCPU = cpuUse{client: now.client - c.cpu.client, server: now.server - c.cpu.server}
	}
	return took
}

// reportCPU prints, per contender, the median client and server CPU time
// per operation over its rounds.
func reportCPU(w io.Writer, s cpuSamples, order []string, n int, unit string) {
	if len(s) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "contender\tclient CPU per %s\tserver CPU per %s\t\n", unit, unit)
	for _, name := range order {
		var client, server []time.Duration
		for _, u := range s[name] {
			client, server = append(client, u.client), append(server, u.server)
		}
		if len(client) == 0 {
			continue
		}
		fmt.Fprintf(tw, "%s\t%v\t%v\t\n", name,
			(median(client) / time.Duration(n)).Round(time.Microsecond/10), (median(server) / time.Duration(n)).Round(time.Microsecond/10))
	}
	_ = tw.Flush()
}
