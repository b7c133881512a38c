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

// measure runs every contender for rounds rounds, rotating their order each
// round, with reset before each run.
func measure(rounds, n int, reset func() error, cs []contender) (samples, error) {
	s := samples{}
	cpuByName := cpuSamples{}
	lastCPUSamples = cpuByName
	for r := range rounds {
		for i := range cs {
			c := cs[(i+r)%len(cs)]
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
