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

// idleSettles waits for the idle fetcher recording to rec to settle into
// its longest backoff, maxFetch: a window of 2 s in which it claims no
// more often than every maxFetch/2 (its jitter is a quarter), give or
// take one claim. A fetcher that claims in a loop never does: it makes
// hundreds of claims a second, dozens on a loaded machine. Before it
// settles, an idle fetcher may claim in quick succession for a while, as
// the writers in flight when it recorded its sleep end (see sleeper in
// internal/engine), so the test looks for such a window for up to 30 s.
func idleSettles(t *testing.T, rec *events, maxFetch time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		from, start := len(rec.named(EventFetched)), time.Now()
		time.Sleep(2 * time.Second)
		n, took := len(rec.named(EventFetched))-from, time.Since(start)
		if n <= 2+int(took/(maxFetch/2)) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: still %d claims in %v after 30 s; an idle fetcher settles into one every %v", what, n, took.Round(time.Millisecond), maxFetch)
			return
		}
	}
}
