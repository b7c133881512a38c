package console

import (
	"context"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/internal/bigoutbox"
	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/outbox"
)

// fixture is the large outbox of a test or benchmark.
type fixture struct {
	db *pgtest.DB
	// Present is a row id the outbox holds, Dead one the dead-letter table
	// holds, Absent one neither does.
	Present, Dead, Absent int64
	// TimerQueue and Timer name a row published with a timer id.
	TimerQueue, Timer string
	// Took is how long building it took.
	Took time.Duration
}

// newFixture builds the large outbox in a schema of tb's own, dropped when
// tb ends.
func newFixture(tb testing.TB) *fixture {
	tb.Helper()
	ctx := context.Background()
	start := time.Now()
	d := pgtest.New(tb)
	ob, err := outbox.New(d.Pool, &outbox.Config{Schema: d.Schema})
	if err != nil {
		tb.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		tb.Fatal(err)
	}
	if err := bigoutbox.Fill(ctx, d.Pool); err != nil {
		tb.Fatal(err)
	}
	fx := &fixture{db: d, Absent: 3}
	err = d.Pool.QueryRow(ctx, `SELECT (SELECT max(id) FROM outbox), (SELECT max(id) FROM outbox_dlq),
			(SELECT queue FROM outbox WHERE timer_id IS NOT NULL ORDER BY id DESC LIMIT 1),
			(SELECT timer_id FROM outbox WHERE timer_id IS NOT NULL ORDER BY id DESC LIMIT 1)`).
		Scan(&fx.Present, &fx.Dead, &fx.TimerQueue, &fx.Timer)
	if err != nil {
		tb.Fatal(err)
	}
	fx.Took = time.Since(start)
	tb.Logf("fixture: %d outbox rows, %d dead letters, built in %v", bigoutbox.Rows, bigoutbox.DeadLetters, fx.Took.Round(time.Millisecond))
	return fx
}

// page is one page the quality bars load.
type page struct {
	Name string
	URL  string
	// Want is a string the page must hold (an element's id).
	Want string
}

// pages returns every page of the fixture's outbox, with realistic
// parameters. The next page of dead letters is the first page's link to
// it, read through h.
func (fx *fixture) pages(tb testing.TB, h http.Handler) []page {
	tb.Helper()
	base := "/o/" + url.PathEscape(fx.db.Schema) + "/outbox"
	id := func(n int64) string { return strconv.FormatInt(n, 10) }
	ps := []page{
		{"overview", "/", `id="outboxes"`},
		{"outbox", base + "/", `id="queues"`},
	}
	for _, q := range bigoutbox.Queues {
		ps = append(ps, page{"queue/" + q, base + "/queue?q=" + q, `id="depth"`})
	}
	ps = append(ps,
		page{"keys", base + "/keys", `id="keys"`},
		page{"keys/orders", base + "/keys?q=orders", `id="keys"`},
		page{"rows/ready", base + "/rows?q=orders", `id="rows-filter"`},
		page{"rows/ready/newest", base + "/rows?q=orders&order=newest", `id="rows-filter"`},
		page{"rows/scheduled", base + "/rows?q=orders&state=scheduled", `id="rows-filter"`},
		page{"rows/scheduled/newest", base + "/rows?q=orders&state=scheduled&order=newest", `id="rows-filter"`},
		page{"rows/leased", base + "/rows?q=orders&state=leased", `id="rows-filter"`},
		page{"rows/expired/newest", base + "/rows?q=orders&state=expired&order=newest", `id="rows-filter"`},
		page{"rows/key", base + "/rows?q=orders&key=customer-7", `id="rows-filter"`},
		// A type no row has: the page reads its most, RowsScan rows.
		page{"rows/ready/type", base + "/rows?q=orders&type=shop.Refunded", `id="no-rows-yet"`},
		page{"rows/scheduled/newer", base + "/rows?q=orders&state=scheduled&newer=5m&order=newest", `id="rows-filter"`},
		page{"rows/ready/older", base + "/rows?q=orders&older=1h", `id="rows-filter"`},
		page{"dead", base + "/dead", `id="next"`},
		page{"dead/queue", base + "/dead?q=emails", `id="next"`},
	)
	for _, r := range reasons {
		ps = append(ps, page{"dead/reason/" + r, base + "/dead?reason=" + r, `id="next"`})
	}
	for _, o := range olderChoices[1:] {
		ps = append(ps, page{"dead/older/" + o.Value, base + "/dead?older=" + o.Value, `id="next"`})
	}
	ps = append(ps, page{"dead/queue+reason+older", base + "/dead?q=billing&reason=decode_error&older=168h", `id="next"`})
	first := get(tb, h, base+"/dead", `id="next"`)
	next := regexp.MustCompile(`id="next" href="([^"]+)"`).FindStringSubmatch(first)
	if next == nil {
		tb.Fatal("the first page of dead letters links no next page")
	}
	// The largest cause's and the smallest's dead letters, as their links
	// in "Why they failed" give them.
	causes := regexp.MustCompile(`<td class="rows num"><a href="([^"]+)"`).FindAllStringSubmatch(first, -1)
	if len(causes) < 2 {
		tb.Fatal("the first page of dead letters links fewer than two causes")
	}
	ps = append(ps,
		page{"dead/cause/largest", html.UnescapeString(causes[0][1]), `id="dead"`},
		page{"dead/cause/smallest", html.UnescapeString(causes[len(causes)-1][1]), `id="dead"`},
		page{"dead/next", html.UnescapeString(next[1]), `id="dead"`},
		page{"deadletter", base + "/dead/" + id(fx.Dead), `id="meta"`},
		page{"row/present", base + "/row?id=" + id(fx.Present), `id="row"`},
		page{"row/absent", base + "/row?id=" + id(fx.Absent), `id="not-found"`},
		page{"row/dead", base + "/row?id=" + id(fx.Dead), `id="row-dead"`},
		page{"row/timer", base + "/row?q=" + url.QueryEscape(fx.TimerQueue) + "&timer=" + url.QueryEscape(fx.Timer), `id="row"`},
		page{"health", base + "/health", `id="health"`},
	)
	return ps
}

// get serves a GET of target with h, fails tb unless it answers 200 with
// want in the page, and returns the page.
func get(tb testing.TB, h http.Handler, target, want string) string {
	tb.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, target, nil)
	req.Host = "localhost" // a name the console answers
	h.ServeHTTP(rec, req)
	body, _ := io.ReadAll(rec.Result().Body)
	if rec.Code != http.StatusOK || !strings.Contains(string(body), want) {
		tb.Fatalf("GET %s: %d, want 200 with %s:\n%s", target, rec.Code, want, body)
	}
	return string(body)
}
