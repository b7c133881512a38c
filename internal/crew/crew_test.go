package crew

import (
	"testing"
	"time"
)

// A forced stop abandons the workers inside a handler, and Done closes
// once the others have exited; a worker that enters after the stop is
// told so, and is not counted as abandoned.
func TestAbandonCountsOnlyWorkersInAHandler(t *testing.T) {
	t.Parallel()
	var c Crew
	inside := make(chan struct{})
	stuck := make(chan struct{})
	defer close(stuck)
	late := make(chan Entry, 1)
	proceed := make(chan struct{})
	c.Hire(3, func(w *Worker) {
		select {
		case inside <- struct{}{}: // one worker runs a handler that never returns
			w.Enter()
			<-stuck
			w.Leave()
		case <-proceed: // the others enter only after the stop
			late <- w.Enter()
		}
	})
	<-inside
	// Enter runs after the send; wait until the worker is inside.
	deadline := time.Now().Add(5 * time.Second)
	for c.workers[0].state.Load() != workerBusy && c.workers[1].state.Load() != workerBusy && c.workers[2].state.Load() != workerBusy {
		if time.Now().After(deadline) {
			t.Fatal("no worker entered its handler")
		}
		time.Sleep(time.Millisecond)
	}
	if n := c.Abandon(); n != 1 {
		t.Fatalf("Abandon() = %d; want 1", n)
	}
	proceed <- struct{}{}
	if e := <-late; e != Stopped {
		t.Errorf("Enter after the stop = %d; want Stopped", e)
	}
	proceed <- struct{}{}
	<-late
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed after the abandoned worker and the two that exited")
	}
}

// A crew of no workers is done at once.
func TestEmptyCrewIsDone(t *testing.T) {
	t.Parallel()
	var c Crew
	c.Hire(0, func(*Worker) {})
	select {
	case <-c.Done():
	default:
		t.Fatal("Done not closed for a crew of none")
	}
}
