package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
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

// clockTicks is the kernel's unit of /proc/PID/stat times (USER_HZ), 100
// on every Linux this runs on.
const clockTicks = 100

func serverCPU() time.Duration {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var ticks int64
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open || s[open+1:end] != "postgres" {
			continue
		}
		f := strings.Fields(s[end+1:])
		// After the command: state is field 3 of the man page, utime 14,
		// stime 15, cutime 16, cstime 17.
		if len(f) < 15 {
			continue
		}
		for _, i := range []int{11, 12, 13, 14} {
			v, _ := strconv.ParseInt(f[i], 10, 64)
			ticks += v
		}
	}
	return time.Duration(ticks) * time.Second / clockTicks
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
