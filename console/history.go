package console

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outboxgen/outboxgen/outbox"
)

// history keeps an outbox's recent depth samples, oldest first.
type history struct {
	mu      sync.Mutex
	max     int
	samples []sample
}

type sample struct {
	at     time.Time
	depths []outbox.QueueDepth
}

func newHistory(n int) *history { return &history{max: n} }

// add records depths read at at, unless the last sample is younger than
// every.
func (h *history) add(at time.Time, depths []outbox.QueueDepth, every time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if n := len(h.samples); n > 0 && at.Sub(h.samples[n-1].at) < every*4/5 {
		return
	}
	if len(h.samples) == h.max {
		h.samples = slices.Delete(h.samples, 0, 1)
	}
	h.samples = append(h.samples, sample{at, depths})
}

func (h *history) snapshot() []sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.samples)
}

// withCurrent returns the samples ending with the read a page shows: when
// add kept it, as they are; otherwise with it in place of the last
// sample, so that the chart ends at the page's counts.
func (h *history) withCurrent(at time.Time, depths []outbox.QueueDepth) []sample {
	s := h.snapshot()
	if n := len(s); n > 0 && !s[n-1].at.Equal(at) {
		if n > 1 {
			s[n-1] = sample{at, depths}
		} else {
			s = append(s, sample{at, depths})
		}
	}
	return s
}

// chart is a line chart drawn as SVG by the page template.
type chart struct {
	Width, Height int
	Lines         []line
	// Max is the top of the y axis; Span the time the x axis covers.
	Max  string
	Span string
	// Log says the y axis is logarithmic: the lines' peaks are more
	// than logAbove apart, and a linear axis would draw the small ones
	// flat along the bottom.
	Log bool
	// Empty says why there is nothing to draw yet.
	Empty string
}

type line struct {
	// Class picks the line's colour in the style sheet.
	Class  string
	Label  string
	Points string
	Last   string
}

const (
	chartWidth, chartHeight = 720, 160
	// logAbove is how many times the highest line's peak must exceed the
	// lowest's (of those above zero) for the chart to draw on a
	// logarithmic axis.
	logAbove = 20
	// maxChartLines is how many queues the outbox chart draws: those with
	// the deepest backlog now.
	maxChartLines = 6
)

// series is a named value of each sample.
type series struct {
	label string
	value func(outbox.QueueDepth) int64
	queue string // the queue whose depth it reads
}

// backlog is what waits in a queue: every row not yet finished.
func backlog(d outbox.QueueDepth) int64 {
	return d.Ready + d.Scheduled + d.Leased + d.Expired + d.Blocked
}

// outboxChart draws each queue's backlog over time, for the queues with
// the deepest backlog in the last sample.
func outboxChart(samples []sample) chart {
	if len(samples) == 0 {
		return drawChart(samples, nil)
	}
	last := slices.Clone(samples[len(samples)-1].depths)
	slices.SortStableFunc(last, func(a, b outbox.QueueDepth) int { return cmp.Compare(backlog(b), backlog(a)) })
	// The deepest queues, in name order, so that a queue keeps its
	// colour when lines cross.
	top := last[:min(len(last), maxChartLines)]
	slices.SortFunc(top, func(a, b outbox.QueueDepth) int { return cmp.Compare(a.Queue, b.Queue) })
	var ss []series
	for _, d := range top {
		ss = append(ss, series{label: d.Queue, value: backlog, queue: d.Queue})
	}
	return drawChart(samples, ss)
}

// queueChart draws one queue's counts over time.
func queueChart(samples []sample, queue string) chart {
	return drawChart(samples, []series{
		{"ready", func(d outbox.QueueDepth) int64 { return d.Ready }, queue},
		{"scheduled", func(d outbox.QueueDepth) int64 { return d.Scheduled }, queue},
		{"leased", func(d outbox.QueueDepth) int64 { return d.Leased + d.Expired }, queue},
		{"blocked", func(d outbox.QueueDepth) int64 { return d.Blocked }, queue},
		{"dead", func(d outbox.QueueDepth) int64 { return d.DeadLettered }, queue},
	})
}

func drawChart(samples []sample, ss []series) chart {
	c := chart{Width: chartWidth, Height: chartHeight}
	if len(samples) < 2 {
		c.Empty = "The chart fills in as the console samples the depths (one sample per refresh while a page shows them)."
		return c
	}
	if len(ss) == 0 {
		c.Empty = "No queue holds rows."
		return c
	}
	values := make([][]int64, len(ss))
	var top int64 = 1
	for i, s := range ss {
		values[i] = make([]int64, len(samples))
		for j, smp := range samples {
			for _, d := range smp.depths {
				if d.Queue == s.queue {
					values[i][j] = s.value(d)
				}
			}
			top = max(top, values[i][j])
		}
	}
	// Peaks far apart: a logarithmic axis, so that a small queue's line
	// is not drawn flat under a large one's.
	var low int64 = math.MaxInt64
	for _, vs := range values {
		if peak := slices.Max(vs); peak > 0 {
			low = min(low, peak)
		}
	}
	c.Log = low < math.MaxInt64 && top/low > logAbove
	height := func(v int64) float64 {
		if c.Log {
			return math.Log1p(float64(v)) / math.Log1p(float64(top))
		}
		return float64(v) / float64(top)
	}
	t0, t1 := samples[0].at, samples[len(samples)-1].at
	span := max(t1.Sub(t0), time.Millisecond)
	for i, s := range ss {
		var b strings.Builder
		for j, smp := range samples {
			x := float64(smp.at.Sub(t0)) / float64(span) * chartWidth
			y := chartHeight - height(values[i][j])*chartHeight
			fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
		}
		c.Lines = append(c.Lines, line{
			Class: fmt.Sprintf("s%d", i), Label: s.label,
			Points: strings.TrimSpace(b.String()), Last: num(values[i][len(samples)-1]),
		})
	}
	c.Max, c.Span = num(top), dur(span)
	return c
}
