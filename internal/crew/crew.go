// Package crew runs a subscriber's workers: a fixed number of goroutines
// that each run handlers one at a time, and a forced stop that abandons a
// worker stuck in a handler instead of waiting for it. It knows nothing of
// rows or the database, and imports nothing of this module.
package crew

import "sync/atomic"

// Worker states.
const (
	workerIdle int32 = iota
	workerBusy
	workerAbandoned
)

// Worker is one of a crew's workers. Handlers run on the worker's own
// goroutine; a forced stop abandons a worker inside a handler that ignores
// its context rather than wait for it.
type Worker struct {
	crew  *Crew
	state atomic.Int32
}

// Crew is the workers of a subscriber's run and what the run waits
// for. The zero Crew is ready for Hire.
type Crew struct {
	workers []*Worker
	forced  atomic.Bool
	waiting atomic.Int64  // workers neither exited nor abandoned
	done    chan struct{} // closed when waiting reaches 0: see Done
}

// Hire starts n workers running work; call it once.
func (c *Crew) Hire(n int, work func(*Worker)) {
	c.done = make(chan struct{})
	c.workers = make([]*Worker, n)
	c.waiting.Store(int64(n))
	for i := range c.workers {
		c.workers[i] = &Worker{crew: c}
	}
	if n == 0 {
		close(c.done)
	}
	for _, w := range c.workers {
		go func() {
			defer w.exit()
			work(w)
		}()
	}
}

// Abandon stops waiting for the workers inside a handler, which must
// return without a further word, and returns how many it abandoned. Call
// it once, after the handlers' contexts are cancelled.
func (c *Crew) Abandon() int {
	c.forced.Store(true)
	n := 0
	for _, w := range c.workers {
		if w.state.CompareAndSwap(workerBusy, workerAbandoned) {
			n++
			c.release()
		}
	}
	return n
}

func (c *Crew) release() {
	if c.waiting.Add(-1) == 0 {
		close(c.done)
	}
}

// Entry is what Enter found.
type Entry int

// What Enter found.
const (
	Entered   Entry = iota // w is inside the handler
	Stopped                // the forced stop came first
	Abandoned              // the forced stop came first and abandoned w
)

// Enter marks w inside a handler, unless the forced stop came first.
func (w *Worker) Enter() Entry {
	w.state.Store(workerBusy)
	if !w.crew.forced.Load() {
		return Entered
	}
	if w.state.CompareAndSwap(workerBusy, workerIdle) {
		return Stopped
	}
	return Abandoned
}

// Leave marks w out of its handler; false means the forced stop abandoned
// w in it.
func (w *Worker) Leave() bool { return w.state.CompareAndSwap(workerBusy, workerIdle) }

// exit ends w: the run no longer waits for it, unless it was abandoned
// (and so released) already.
func (w *Worker) exit() {
	if w.state.Load() != workerAbandoned {
		w.crew.release()
	}
}

// Busy returns how many workers are inside a handler now.
func (c *Crew) Busy() int {
	n := 0
	for _, w := range c.workers {
		if w.state.Load() == workerBusy {
			n++
		}
	}
	return n
}

// Done is closed when every worker has exited or was abandoned.
func (c *Crew) Done() <-chan struct{} { return c.done }
