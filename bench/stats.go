package main

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"
)

// contender is one thing a suite measures; each round it does n operations.
type contender struct {
	name  string
	round func(n int) (time.Duration, error)
}

// samples holds one duration per round per contender.
type samples map[string][]time.Duration

// measure runs every contender for rounds rounds, with reset before each
// run, in ABBA order: each odd round runs the contenders in the reverse
// of the round before, so that within each pair of rounds every
// contender runs as early as it runs late, and a machine that slows or
// speeds up during a pair weighs on all of them alike; each pair starts
// one contender further on than the last, so that neighbours change.
func measure(rounds, n int, reset func() error, cs []contender) (samples, error) {
	s := samples{}
	cpuByName := cpuSamples{}
	lastCPUSamples = cpuByName
	for r := range rounds {
		for _, c := range roundOrder(cs, r) {
			if err := reset(); err != nil {
				return nil, err
			}
			lastCPU = cpuUse{} // a contender that keeps no clock records none
			d, err := c.round(n)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", c.name, err)
			}
			s[c.name] = append(s[c.name], d)
			if measureCPU && lastCPU != (cpuUse{}) {
				cpuByName[c.name] = append(cpuByName[c.name], lastCPU)
			}
		}
	}
	return s, nil
}

// roundOrder is the order of cs in round r (see measure): for two
// contenders A and B, rounds 0 to 3 run A B, B A, B A, A B.
func roundOrder[C any](cs []C, r int) []C {
	order := make([]C, len(cs))
	for i := range cs {
		order[i] = cs[(i+r/2)%len(cs)]
	}
	if r%2 == 1 {
		slices.Reverse(order)
	}
	return order
}

// pairedRatio is the rate of a over the rate of b, round by round (the
// two ran within minutes of each other, in the same round): the median
// of the rounds' ratios, and the lowest and highest. ok is false when
// either ran no round.
func pairedRatio(s samples, a, b string) (med, lo, hi float64, ok bool) {
	n := min(len(s[a]), len(s[b]))
	if n == 0 {
		return 0, 0, 0, false
	}
	rs := make([]float64, n)
	for i := range n {
		rs[i] = s[b][i].Seconds() / s[a][i].Seconds()
	}
	slices.Sort(rs)
	med = rs[n/2]
	if n%2 == 0 {
		med = (rs[n/2-1] + rs[n/2]) / 2
	}
	return med, rs[0], rs[n-1], true
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// report prints, per contender, the median time per operation, the rate,
// and the rate relative to base.
func report(w io.Writer, s samples, order []string, n int, unit, base string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "contender\tmedian per %s\t%s/s\tvs %s\t\n", unit, unit, base)
	baseRate := rate(median(s[base]), n)
	for _, name := range order {
		m := median(s[name])
		fmt.Fprintf(tw, "%s\t%v\t%.0f\t%.2fx\t\n", name, (m / time.Duration(n)).Round(time.Microsecond/10), rate(m, n), rate(m, n)/baseRate)
	}
	_ = tw.Flush()
	if measureCPU {
		reportCPU(w, lastCPUSamples, order, n, unit)
	}
	if showSamples {
		for _, name := range order {
			fmt.Fprintf(w, "  %s, per %s by round:", name, unit)
			for _, d := range s[name] {
				fmt.Fprintf(w, " %v", (d / time.Duration(n)).Round(time.Microsecond/10))
			}
			fmt.Fprintln(w)
		}
	}
}

// lastCPUSamples is the CPU the last measure recorded, printed by report.
var lastCPUSamples cpuSamples

// showSamples makes report print every round's figure (-samples).
var showSamples bool

func rate(d time.Duration, n int) float64 { return float64(n) / d.Seconds() }
