package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// column is one figure of a row, as its header and its cell.
type column struct {
	head string
	cell func(r *row) string
}

var columns = []column{
	{"t", func(r *row) string { return elapsed(r.at) }},
	{"txn held", func(r *row) string {
		if r.hold {
			return "yes"
		}
		return ""
	}},
	{"pub/s", func(r *row) string { return perSecond(r.published, r.span) }},
	{"ack/s", func(r *row) string { return perSecond(r.acked, r.span) }},
	{"retry/s", func(r *row) string { return perSecond(r.retried, r.span) }},
	{"dlq", func(r *row) string { return strconv.FormatInt(r.deadLettered, 10) }},
	{"lat p50 ms", func(r *row) string { return millis(r.latency.n, r.latency.p50) }},
	{"lat p99 ms", func(r *row) string { return millis(r.latency.n, r.latency.p99) }},
	{"sched late p99 ms", func(r *row) string { return millis(r.lateness.n, r.lateness.p99) }},
	{"claims/s", func(r *row) string { return perSecond(int64(r.claims.n), r.span) }},
	{"claim p50 ms", func(r *row) string { return millis(r.claims.n, r.claims.p50) }},
	{"claim p99 ms", func(r *row) string { return millis(r.claims.n, r.claims.p99) }},
	{"claim srv ms", func(r *row) string {
		if r.claimServer < 0 {
			return "-"
		}
		return millis(1, r.claimServer)
	}},
	{"queued", func(r *row) string { return strconv.FormatInt(r.queued, 10) }},
	{"dead tup", func(r *row) string { return strconv.FormatInt(r.deadTuples, 10) }},
	{"autovac", func(r *row) string { return strconv.FormatInt(r.vacuumRuns, 10) }},
	{"table MiB", func(r *row) string { return mib(r.tableBytes) }},
	{"index MiB", func(r *row) string { return mib(r.indexBytes) }},
	{"pending idx MiB", func(r *row) string { return mib(r.pendingBytes) }},
	{"xmin age", func(r *row) string { return strconv.FormatInt(r.xminAge, 10) }},
	{"RSS MiB", func(r *row) string { return mib(r.rss) }},
	{"heap MiB", func(r *row) string { return mib(r.heap) }},
	{"goroutines", func(r *row) string { return strconv.Itoa(r.goroutines) }},
	{"load", func(r *row) string {
		if r.load < 0 {
			return "-"
		}
		return strconv.FormatFloat(r.load, 'f', 1, 64)
	}},
}

// legend explains the columns; the summary prints it under the tables.
const legend = `pub/s, ack/s, retry/s: messages published (committed), acknowledged, rescheduled after a failure, per second; dlq: moved to the dead-letter table.
lat: commit (Commit returned to the publisher) to the first call of the handler, for messages due at once; sched late: a reminder's due time to its first handler call.
claims/s, claim p50/p99: the subscribers' claim statements, every one (empty ones included), timed on the client from send to the last row read; claim srv: their mean execution time in pg_stat_statements.
queued: rows in the outbox table; dead tup: n_dead_tup of the table (pg_stat_user_tables), the largest reading of the interval; autovac: autovacuum runs on it in the interval.
table, index: pg_relation_size and pg_indexes_size of the outbox table; pending idx: pg_relation_size of its pending index, the one claims scan; xmin age: the oldest backend_xmin or backend_xid of the database's sessions, in transactions, the largest reading of the interval.
RSS: VmRSS of the soak process (/proc/self/status), which runs publishers and subscribers; heap: Go's HeapInuse; goroutines: runtime.NumGoroutine.
load: the machine's one-minute load average (/proc/loadavg) at the interval's end: what else ran beside the soak and its database.`

func elapsed(d time.Duration) string {
	s := int64(d.Round(time.Second) / time.Second)
	return fmt.Sprintf("%dm%02ds", s/60, s%60)
}

func perSecond(n int64, span time.Duration) string {
	if span <= 0 {
		return "-"
	}
	return strconv.FormatFloat(float64(n)/span.Seconds(), 'f', 0, 64)
}

func millis(n int, d time.Duration) string {
	if n == 0 {
		return "-"
	}
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms < 10:
		return strconv.FormatFloat(ms, 'f', 2, 64)
	case ms < 100:
		return strconv.FormatFloat(ms, 'f', 1, 64)
	}
	return strconv.FormatFloat(ms, 'f', 0, 64)
}

func width(c column) int { return max(len(c.head), 6) }

// printHeader and printRow print the live lines: fine samples indented,
// the table's rows flush left and marked.
func printHeader(w io.Writer) {
	var b strings.Builder
	b.WriteString("  ")
	for _, c := range columns {
		fmt.Fprintf(&b, " %*s", width(c), c.head)
	}
	fmt.Fprintln(w, b.String())
}

func printRow(w io.Writer, r row, tableRow bool) {
	var b strings.Builder
	if tableRow {
		b.WriteString("==")
	} else {
		b.WriteString("  ")
	}
	for _, c := range columns {
		fmt.Fprintf(&b, " %*s", width(c), c.cell(&r))
	}
	fmt.Fprintln(w, b.String())
}

// markdown prints rows as a Markdown table.
func markdown(w io.Writer, rows []row) {
	heads := make([]string, len(columns))
	seps := make([]string, len(columns))
	for i, c := range columns {
		heads[i], seps[i] = c.head, "---:"
	}
	fmt.Fprintf(w, "| %s |\n|%s|\n", strings.Join(heads, " | "), strings.Join(seps, "|"))
	for _, r := range rows {
		cells := make([]string, len(columns))
		for i, c := range columns {
			cells[i] = c.cell(&r)
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
}

// report prints the summary: the accounting, the table, and the hold
// phase's degradation and recovery.
func report(w io.Writer, o *options, sm *sampler, held holdResult, a accounting, left int64, published time.Duration) {
	fine, rows := sm.snapshot()
	fmt.Fprintf(w, "\n## soak summary: %v at %.0f msgs/s, %d writers, on %s (autovacuum %s)\n\n",
		o.duration, o.rate, o.writers, sm.probe.server, sm.probe.autovacuum)
	reasons := slices.Sorted(maps.Keys(a.deadLettered))
	var dl []string
	for _, r := range reasons {
		dl = append(dl, fmt.Sprintf("%s %d", r, a.deadLettered[r]))
	}
	fmt.Fprintf(w, "published %d in %v (%.0f msgs/s), acked %d, retried %d, dead-lettered %d (%s), still queued %d (scheduled for later), lost %d\n",
		a.published, published.Round(time.Second), float64(a.published)/published.Seconds(), a.acked, a.retried, a.dlq,
		strings.Join(dl, ", "), a.queued, a.lost)
	fmt.Fprintf(w, "lease lost %d, outcomes refused %d, deleted without a dead-letter table %d, failed publishing transactions %d\n",
		a.leaseLost, a.refused, a.terminal, a.pubErrors)
	// What the latency bookkeeping still holds: messages not yet handled
	// (the queued ones) or handled but never committed, which would be
	// the soak's own leak.
	fmt.Fprintf(w, "latency bookkeeping holds %d messages seen on one side only\n\n",
		sm.s.latency.inFlight()+sm.s.lateness.inFlight())
	markdown(w, rows)
	fmt.Fprintf(w, "\n%s\n", legend)
	if held.opened > 0 && held.closed > 0 {
		holdReport(w, fine, held, o.sample)
	} else if held.err != nil {
		fmt.Fprintf(w, "\nhold phase failed: %v\n", held.err)
	}
}

// slack is how far above the minute before the hold a figure may be and
// count as recovered.
const slack = 1.5

// holdReport compares the fine samples of the minute before the hold with
// those while it was open, says when each figure came back within slack
// of the minute before and stayed there, and prints the timeline.
func holdReport(w io.Writer, fine []row, h holdResult, sample time.Duration) {
	var before, during, after []row
	for _, r := range fine {
		from := r.at - r.span
		switch {
		case r.at <= h.opened && from >= h.opened-time.Minute:
			before = append(before, r)
		case r.hold:
			during = append(during, r)
		case from >= h.closed:
			after = append(after, r)
		}
	}
	fmt.Fprintf(w, "\n### idle %s open from %s to %s (%v)\n\n", h.name(), elapsed(h.opened), elapsed(h.closed),
		(h.closed - h.opened).Round(time.Second))
	if len(before) == 0 || len(during) == 0 {
		fmt.Fprintln(w, "not enough samples around the hold to compare")
		return
	}
	type figure struct {
		name string
		v    func(r *row) float64
		show func(float64) string
		kind int // how it recovers: stays, vacuumed, size
	}
	const (
		stays    = iota // back within slack and stays there
		vacuumed        // falls with the first vacuum that can remove the backlog, then rises and falls again
		size            // never shrinks; report where it ended
		next            // report the first sample after the hold
	)
	asMs := func(v float64) string { return millis(1, time.Duration(v)) }
	asInt := func(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }
	asMiB := func(v float64) string { return mib(int64(v)) }
	figures := []figure{
		{"claim p99 ms", func(r *row) float64 { return float64(r.claims.p99) }, asMs, stays},
		{"claim p50 ms", func(r *row) float64 { return float64(r.claims.p50) }, asMs, stays},
		{"claim srv ms", func(r *row) float64 { return float64(r.claimServer) }, asMs, stays},
		{"lat p99 ms", func(r *row) float64 { return float64(r.latency.p99) }, asMs, stays},
		{"lat p50 ms", func(r *row) float64 { return float64(r.latency.p50) }, asMs, stays},
		{"dead tup", func(r *row) float64 { return float64(r.deadTuples) }, asInt, vacuumed},
		{"xmin age", func(r *row) float64 { return float64(r.xminAge) }, asInt, next},
		{"table MiB", func(r *row) float64 { return float64(r.tableBytes) }, asMiB, size},
		{"index MiB", func(r *row) float64 { return float64(r.indexBytes) }, asMiB, size},
		{"pending idx MiB", func(r *row) float64 { return float64(r.pendingBytes) }, asMiB, size},
	}
	worst := func(rs []row, v func(*row) float64) float64 {
		m := 0.0
		for i := range rs {
			m = max(m, v(&rs[i]))
		}
		return m
	}
	fmt.Fprintf(w, "| figure | minute before (worst %v) | while open (worst %v) | after the rollback |\n|---|---:|---:|---|\n",
		sample, sample)
	for _, f := range figures {
		if f.name == "claim srv ms" && before[0].claimServer < 0 {
			continue
		}
		b, d := worst(before, f.v), worst(during, f.v)
		var out string
		switch {
		case len(after) == 0:
			out = "no samples after it"
		case f.kind == next:
			out = f.show(f.v(&after[0])) + " in the first sample after it"
		case f.kind == size:
			out = "at the end: " + f.show(f.v(&after[len(after)-1]))
		case f.kind == vacuumed:
			out = "not within the run"
			for _, r := range after {
				if f.v(&r) <= b {
					out = fmt.Sprintf("back to %s within %v", f.show(f.v(&r)), (r.at - h.closed).Round(time.Second))
					break
				}
			}
		default:
			out = recovery(after, h.closed, f.v, b*slack)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", f.name, f.show(b), f.show(d), out)
	}
	fmt.Fprintf(w, "\n\"after the rollback\", by %v samples: when a figure first came back within %.1f× the minute before;\n"+
		"for dead tuples, when the first vacuum after the rollback brought them back to the minute before's worst; for sizes, where they ended.\n\n",
		sample, slack)
	var timeline []row
	for _, r := range fine {
		if r.at > h.opened-time.Minute && r.at-r.span < h.closed+3*time.Minute {
			timeline = append(timeline, r)
		}
	}
	markdown(w, timeline)
}

// recovery says how long after closed the figure v of the samples after
// it first fell to limit or below (the end of that sample), and how many
// samples after that one rose above it again: on a busy machine a figure
// comes back, then jumps now and then as it did before the hold.
func recovery(after []row, closed time.Duration, v func(*row) float64, limit float64) string {
	for i := range after {
		if v(&after[i]) > limit {
			continue
		}
		above := 0
		for j := i + 1; j < len(after); j++ {
			if v(&after[j]) > limit {
				above++
			}
		}
		return fmt.Sprintf("within %v; %d of %d later samples above", (after[i].at - closed).Round(time.Second), above, len(after)-i-1)
	}
	return "not within the run"
}
