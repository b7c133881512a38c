package browser_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/outboxgen/outboxgen/console"
)

// The outbox page reloads its counts while it is visible, and not while
// the tab is hidden or its refresh is paused: a mark set on the live
// region survives only while no reload replaces the region.
func TestThePageRefreshesOnlyWhileVisibleAndNotPaused(t *testing.T) {
	chromiumPath(t)
	t.Parallel()
	f := newOutbox(t)
	publish(t, f, jsonBytes{}, "orders", []byte(`{"order":"o-1"}`), nil)
	h, err := console.New(console.Config{Pool: f.Pool, Logger: quiet, Refresh: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Each refresh takes 1.5 s on its way, and says when it arrives: the
	// pause below comes while one is in flight, and that one must not
	// replace what a paused page shows.
	refreshing := make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Console-Refresh") != "" {
			select {
			case refreshing <- struct{}{}:
			default:
			}
			time.Sleep(1500 * time.Millisecond)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p := newPage(t, srv.URL)
	p.open(outboxPath(f) + "/")

	mark := func() { eval[bool](p, `document.getElementById('live').dataset.mark = 'old', true`) }
	marked := func() bool { return eval[bool](p, `document.getElementById('live').dataset.mark === 'old'`) }
	reloads := func(what string) {
		t.Helper()
		mark()
		for deadline := time.Now().Add(8 * time.Second); marked(); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the live region was not reloaded within 8 s", what)
			}
		}
	}
	holds := func(what string) {
		t.Helper()
		mark()
		time.Sleep(3500 * time.Millisecond) // three refresh periods and more
		if !marked() {
			t.Errorf("%s: the live region was reloaded", what)
		}
	}
	hidden := func(v bool) {
		eval[bool](p, `Object.defineProperty(document, 'hidden', {get: () => `+map[bool]string{true: "true", false: "false"}[v]+`, configurable: true}), true`)
	}

	reloads("visible")
	pause := func() { p.do("clicking #pause-refresh", chromedp.Click(chromedp.CSS("#pause-refresh"))) }
	for len(refreshing) > 0 {
		<-refreshing
	}
	select {
	case <-refreshing:
	case <-time.After(10 * time.Second):
		t.Fatal("no refresh came within 10 s")
	}
	pause()
	holds("paused")
	pause()
	reloads("resumed")
	hidden(true)
	holds("hidden")
	hidden(false)
	reloads("visible again")
}
