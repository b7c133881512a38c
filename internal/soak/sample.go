package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"
)

// row is the figures of one interval: a fine sample (-sample) or a row of
// the table (-report). Counts and latencies cover the interval; gauges
// (sizes, memory) are read at its end, except the dead tuples and the
// xmin age, which are the largest of the interval's fine samples.
type row struct {
	at, span time.Duration // the interval's end, since the start, and its length
	hold     bool          // the idle transaction was open during the interval

	published, acked, retried, deadLettered int64
	latency, lateness, claims               quantiles
	claimServer                             time.Duration // mean execution in pg_stat_statements; -1 unknown

	tableStats
	vacuumRuns int64 // autovacuum runs on the table during the interval

	rss, heap  int64
	goroutines int
	load       float64 // the machine's one-minute load average
}

// sampler takes a fine sample every -sample and a table row every
// -report, prints both as they come, and keeps them for the summary.
type sampler struct {
	o      *options
	start  time.Time
	s      *soak
	claims *claimTimer
	probe  *dbProbe

	mu               sync.Mutex
	fine, rows       []row
	holdOpen, holdTo time.Duration // the idle transaction's span, since the start; holdTo 0 while open
	holding          bool
	held             bool
}

func newSampler(o *options, start time.Time, s *soak, claims *claimTimer, probe *dbProbe) *sampler {
	return &sampler{o: o, start: start, s: s, claims: claims, probe: probe}
}

// holdOpened and holdClosed mark the idle transaction's span.
func (sm *sampler) holdOpened(at time.Duration) {
	sm.mu.Lock()
	sm.holdOpen, sm.holding, sm.held = at, true, true
	sm.mu.Unlock()
}

func (sm *sampler) holdClosed(at time.Duration) {
	sm.mu.Lock()
	sm.holdTo, sm.holding = at, false
	sm.mu.Unlock()
}

// overlapsHold reports whether the interval (from, to] saw the idle
// transaction open.
func (sm *sampler) overlapsHold(from, to time.Duration) bool {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	if !sm.held {
		return false
	}
	end := sm.holdTo
	if sm.holding {
		end = to
	}
	return sm.holdOpen <= to && end > from
}

// counts is a reading of the running totals.
type counts struct {
	published, acked, retried, deadLettered int64
	stats                                   tableStats
}

func (sm *sampler) counts(ctx context.Context) counts {
	c := counts{
		published: sm.s.published.Load(), acked: sm.s.outcomes.acked.Load(),
		retried: sm.s.outcomes.retried.Load(), deadLettered: sm.s.outcomes.deadLettered.Load(),
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	st, err := sm.probe.read(rctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak: reading the table's statistics:", err)
	}
	c.stats = st
	return c
}

// loop samples until ctx is done, then takes a last, partial sample when
// it spans at least a second.
func (sm *sampler) loop(ctx context.Context) {
	perRow := int(sm.o.report / sm.o.sample)
	prev := sm.counts(ctx)
	prevRow := prev
	var lat, late, claims, latMin, lateMin, claimsMin []time.Duration
	var fineOfRow []row
	printHeader(os.Stdout)
	for i := 1; ; i++ {
		done := !sleepUntil(ctx, sm.start.Add(time.Duration(i)*sm.o.sample))
		at := time.Since(sm.start)
		from := time.Duration(i-1) * sm.o.sample
		if done && at-from < time.Second {
			break
		}
		cur := sm.counts(ctx)
		lat = sm.s.latency.obs.take(lat)
		late = sm.s.lateness.obs.take(late)
		claims = sm.claims.take(claims)
		latMin, lateMin, claimsMin = append(latMin, lat...), append(lateMin, late...), append(claimsMin, claims...)
		r := sm.row(from, at, prev, cur)
		r.latency, r.lateness, r.claims = quantilesOf(lat), quantilesOf(late), quantilesOf(claims)
		sm.mu.Lock()
		sm.fine = append(sm.fine, r)
		sm.mu.Unlock()
		fineOfRow = append(fineOfRow, r)
		printRow(os.Stdout, r, false)
		prev = cur
		if i%perRow == 0 || done {
			rowFrom := time.Duration(i-len(fineOfRow)) * sm.o.sample
			m := sm.row(rowFrom, at, prevRow, cur)
			m.latency, m.lateness, m.claims = quantilesOf(latMin), quantilesOf(lateMin), quantilesOf(claimsMin)
			for _, f := range fineOfRow {
				m.deadTuples, m.xminAge = max(m.deadTuples, f.deadTuples), max(m.xminAge, f.xminAge)
			}
			sm.mu.Lock()
			sm.rows = append(sm.rows, m)
			sm.mu.Unlock()
			printRow(os.Stdout, m, true)
			prevRow = cur
			latMin, lateMin, claimsMin, fineOfRow = latMin[:0], lateMin[:0], claimsMin[:0], fineOfRow[:0]
		}
		if done {
			break
		}
	}
}

// row builds the interval (from, at] from two readings; latencies are
// the caller's.
func (sm *sampler) row(from, at time.Duration, prev, cur counts) row {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r := row{
		at: at, span: at - from, hold: sm.overlapsHold(from, at),
		published: cur.published - prev.published, acked: cur.acked - prev.acked,
		retried: cur.retried - prev.retried, deadLettered: cur.deadLettered - prev.deadLettered,
		tableStats: cur.stats, vacuumRuns: cur.stats.vacuums - prev.stats.vacuums,
		claimServer: -1,
		rss:         rss(), heap: int64(ms.HeapInuse), goroutines: runtime.NumGoroutine(), load: loadAverage(),
	}
	if calls := cur.stats.claimCalls - prev.stats.claimCalls; sm.probe.statements && calls > 0 {
		r.claimServer = time.Duration((cur.stats.claimMillis - prev.stats.claimMillis) / float64(calls) * float64(time.Millisecond))
	}
	return r
}

// snapshot returns the fine samples and the table's rows.
func (sm *sampler) snapshot() (fine, rows []row) {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return sm.fine, sm.rows
}
