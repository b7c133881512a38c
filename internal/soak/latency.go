package main

import (
	"slices"
	"sync"
	"time"
)

// durations collects observations until the sampler takes them. Two
// buffers alternate, so a long run allocates nothing once they have grown
// to a sample's worth.
type durations struct {
	mu  sync.Mutex
	buf []time.Duration
}

func (d *durations) add(v time.Duration) {
	d.mu.Lock()
	d.buf = append(d.buf, v)
	d.mu.Unlock()
}

// take returns what was collected since the last take and keeps spare,
// emptied, to collect into next.
func (d *durations) take(spare []time.Duration) []time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.buf
	d.buf = spare[:0]
	return out
}

// commitLatency measures, per message, the time from a reference point on
// the publishing side (the commit, or the due time of a scheduled
// message) to the first call of its handler. The two sides meet in maps
// keyed by sequence number, whichever comes first: a subscriber woken by
// the commit's NOTIFY can call the handler before Commit has returned to
// the publisher, and that counts as no latency at all. Entries leave the
// maps when both sides have been seen, so the maps hold only messages in
// flight.
type commitLatency struct {
	mu      sync.Mutex
	from    map[int64]time.Time // publisher side seen first
	handled map[int64]time.Time // handler side seen first
	obs     durations
}

func newCommitLatency() *commitLatency {
	return &commitLatency{from: map[int64]time.Time{}, handled: map[int64]time.Time{}}
}

// committed records the reference point of seq.
func (c *commitLatency) committed(seq int64, at time.Time) {
	c.mu.Lock()
	h, ok := c.handled[seq]
	if ok {
		delete(c.handled, seq)
	} else {
		c.from[seq] = at
	}
	c.mu.Unlock()
	if ok {
		c.obs.add(max(h.Sub(at), 0))
	}
}

// handledAt records the first handler call of seq.
func (c *commitLatency) handledAt(seq int64, at time.Time) {
	c.mu.Lock()
	from, ok := c.from[seq]
	if ok {
		delete(c.from, seq)
	} else {
		c.handled[seq] = at
	}
	c.mu.Unlock()
	if ok {
		c.obs.add(max(at.Sub(from), 0))
	}
}

// inFlight is how many messages have been seen on one side only.
func (c *commitLatency) inFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.from) + len(c.handled)
}

// quantiles summarises a set of durations.
type quantiles struct {
	n             int
	p50, p99, max time.Duration
}

// quantilesOf sorts v in place and summarises it.
func quantilesOf(v []time.Duration) quantiles {
	if len(v) == 0 {
		return quantiles{}
	}
	slices.Sort(v)
	at := func(q float64) time.Duration { return v[int(q*float64(len(v)-1)+0.5)] }
	return quantiles{n: len(v), p50: at(0.50), p99: at(0.99), max: v[len(v)-1]}
}
