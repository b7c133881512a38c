// Package procstat reads a process's CPU times from /proc/PID/stat, for
// the benchmarks that charge the database server's CPU to what they run.
package procstat

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Times are a process's CPU times in clock ticks, as /proc/PID/stat gives
// them.
type Times struct {
	// Command is the process's command name (postgres for a server
	// process).
	Command string
	// User and System are the process's own times; ChildUser and
	// ChildSystem those of the children it has waited for (a postmaster's
	// reaped backends).
	User, System, ChildUser, ChildSystem int64
}

// clockTicks is the kernel's unit of the times (USER_HZ), 100 on every
// Linux this runs on.
const clockTicks = 100

// Duration converts clock ticks to a duration.
func Duration(ticks int64) time.Duration { return time.Duration(ticks) * time.Second / clockTicks }

// Read reads the stat file at path (/proc/PID/stat); false when it cannot
// be read or parsed (the process has exited, say).
func Read(path string) (Times, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Times{}, false
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return Times{}, false
	}
	f := strings.Fields(s[end+1:])
	// After the command: state is field 3 of proc(5), utime 14, stime 15,
	// cutime 16, cstime 17.
	if len(f) < 15 {
		return Times{}, false
	}
	t := Times{Command: s[open+1 : end]}
	for i, v := range []*int64{&t.User, &t.System, &t.ChildUser, &t.ChildSystem} {
		*v, _ = strconv.ParseInt(f[11+i], 10, 64)
	}
	return t, true
}

// Postgres is the CPU every postgres process on this machine has used,
// with the children each has reaped: a local server's, for the figures
// that charge it to what they run.
func Postgres() time.Duration {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var ticks int64
	for _, p := range stats {
		if t, ok := Read(p); ok && t.Command == "postgres" {
			ticks += t.User + t.System + t.ChildUser + t.ChildSystem
		}
	}
	return Duration(ticks)
}
