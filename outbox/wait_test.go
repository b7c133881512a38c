package outbox

import (
	"testing"
	"time"
)

// emptyClaims counts the claims rec saw find nothing.
func (r *events) emptyClaims() int {
	n := 0
	for _, ev := range r.named(EventFetched) {
		if ev.Count == 0 {
			n++
		}
	}
	return n
}

// idlePolls waits until the subscriber recording to rec has made n more
// claims that found nothing: it went through its idle loop n times.
func idlePolls(t *testing.T, rec *events, n int) {
	t.Helper()
	from := rec.emptyClaims()
	eventually(t, "idle polls", func() bool { return rec.emptyClaims() >= from+n })
}

// drains waits until left returns 0, for as long as it keeps falling: it
// fails when 20 s pass without it falling. A drain's pace is the
// machine's, not a promise; a drain that stopped is a failure.
func drains(t *testing.T, what string, left func() int) {
	t.Helper()
	last, since := left(), time.Now()
	for last > 0 {
		time.Sleep(10 * time.Millisecond)
		switch n := left(); {
		case n < last:
			last, since = n, time.Now()
		case time.Since(since) > 20*time.Second:
			t.Fatalf("%s: %d left, none gone for 20 s", what, n)
		}
	}
}
