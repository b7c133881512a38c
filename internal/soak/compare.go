package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// The goal of a run with the idle transaction against one without, over
// the minutes the transaction was open throughout.
const (
	goalThroughput = 0.9 // acknowledgements per second, at least this times the run without
	goalP99        = 2.0 // commit-to-handler p99, at most this times the run without
)

// compare prints the two runs of -compare side by side, minute by minute,
// with the ratios of the held run to the other, and says whether the held
// run met the goal over the minutes its transaction was open throughout.
func compare(w io.Writer, o *options, base, held *result) {
	fmt.Fprintf(w, "\n## held horizon: %v at %.0f msgs/s on %s, %s transaction held from %s to %s, against the same run without it\n\n",
		o.duration, o.rate, held.server, o.holdKind, elapsed(held.held.opened), elapsed(held.held.closed))
	heads := []string{"t", "held", "load", "ack/s", "ack/s held", "×", "p50 ms", "p50 held", "×", "p99 ms", "p99 held", "×",
		"dead tup", "dead tup held", "pending idx MiB", "pending idx held", "index MiB", "index held"}
	seps := make([]string, len(heads))
	for i := range seps {
		seps[i] = "---:"
	}
	fmt.Fprintf(w, "| %s |\n|%s|\n", strings.Join(heads, " | "), strings.Join(seps, "|"))
	var ackBase, ackHeld int64
	var worstP50, worstP99 float64
	var worstP50At, worstP99At time.Duration
	minutes := 0
	for i := range min(len(base.rows), len(held.rows)) {
		b, h := &base.rows[i], &held.rows[i]
		throughout := held.held.closed > 0 && h.at-h.span >= held.held.opened-2*time.Second && h.at <= held.held.closed+2*time.Second
		mark := ""
		switch {
		case throughout:
			mark = "yes"
		case h.hold:
			mark = "part"
		}
		p50, p99 := ratio(float64(h.latency.p50), float64(b.latency.p50)), ratio(float64(h.latency.p99), float64(b.latency.p99))
		if throughout {
			minutes++
			ackBase += b.acked
			ackHeld += h.acked
			if p50 > worstP50 {
				worstP50, worstP50At = p50, h.at
			}
			if p99 > worstP99 {
				worstP99, worstP99At = p99, h.at
			}
		}
		cells := []string{
			elapsed(h.at), mark, loads(b.load) + " / " + loads(h.load),
			perSecond(b.acked, b.span), perSecond(h.acked, h.span), times(ratio(float64(h.acked)/h.span.Seconds(), float64(b.acked)/b.span.Seconds())),
			millis(b.latency.n, b.latency.p50), millis(h.latency.n, h.latency.p50), times(p50),
			millis(b.latency.n, b.latency.p99), millis(h.latency.n, h.latency.p99), times(p99),
			strconv.FormatInt(b.deadTuples, 10), strconv.FormatInt(h.deadTuples, 10),
			mib(b.pendingBytes), mib(h.pendingBytes), mib(b.indexBytes), mib(h.indexBytes),
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
	fmt.Fprintf(w, "\nload: the machine's one-minute load average at the minute's end, without / with the idle transaction.\n")
	fmt.Fprintf(w, "×: the run with the idle transaction over the run without, minute by minute; held: yes for the minutes it was open throughout.\n")
	fmt.Fprintf(w, "published %d / %d, acked %d / %d, lost %d / %d (without / with)\n",
		base.acct.published, held.acct.published, base.acct.acked, held.acct.acked, base.acct.lost, held.acct.lost)
	if minutes == 0 {
		fmt.Fprintln(w, "no minute had the transaction open throughout: nothing to compare")
		return
	}
	tp := ratio(float64(ackHeld), float64(ackBase))
	fmt.Fprintf(w, "\nover the %d minutes held throughout:\n", minutes)
	fmt.Fprintf(w, "- throughput (acks): %s of the run without (goal ≥ %.1f×): %s\n", times(tp), goalThroughput, verdict(tp >= goalThroughput))
	fmt.Fprintf(w, "- p99, worst minute: %s at %s (goal ≤ %.0f×): %s\n", times(worstP99), elapsed(worstP99At), goalP99, verdict(worstP99 <= goalP99))
	fmt.Fprintf(w, "- p50, worst minute: %s at %s\n", times(worstP50), elapsed(worstP50At))
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

func times(v float64) string {
	if v == 0 {
		return "-"
	}
	if v < 10 {
		return strconv.FormatFloat(v, 'f', 2, 64) + "×"
	}
	return strconv.FormatFloat(v, 'f', 0, 64) + "×"
}

func loads(v float64) string {
	if v < 0 {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}
