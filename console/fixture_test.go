package console

import (
	"bytes"
	"context"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/outbox"
)

// The large outbox the console's quality bars are measured on: 1,000,000
// outbox rows over four queues and 100,000 dead letters.
//
// bench/cmd/consoleload builds the same outbox from a copy of these
// declarations, which TestConsoleloadBuildsTheSameOutbox holds equal to
// them: a change here belongs there too.
const (
	fixtureRounds   = 10     // rounds of inserts, each a slice of the id range
	fixturePlain    = 80_000 // rows without an ordering key, per round
	fixtureKeys     = 1_000  // ordering keys per round
	fixturePerKey   = 20     // rows per key: its head and the rows behind it
	fixtureDead     = 100_000
	fixtureRows     = fixtureRounds * (fixturePlain + fixtureKeys*fixturePerKey)
	fixtureFirstRow = 150_001 // ids below it are the dead letters' (and gaps)
)

// fixtureQueues are the fixture's queues, by name. Of every ten rows and
// dead letters, four are of orders, three of emails, two of webhooks and
// one of billing.
var fixtureQueues = []string{"billing", "emails", "orders", "webhooks"}

// fixtureQueue is the SQL expression of the queue of row n.
func fixtureQueue(n string) string {
	return `(ARRAY['orders','orders','orders','orders','emails','emails','emails','webhooks','webhooks','billing'])[1 + ` + n + ` % 10]`
}

// fixtureSQL are the statements that fill a freshly migrated outbox (its
// schema first on the search path), in order, each with its arguments.
//
// Rows without a key, by their number i, of every 1,000 values of i / 10
// (so that every queue, i % 10, has rows in every state): 855 ready (due
// since they were created), 50 scheduled for the next two hours, 20
// scheduled with a timer id for the next day, 60 retrying (an attempt or
// more, a last error, half of them due again), 12 leased with a live lease
// and 3 leased with a lease that expired minutes ago. Rows with a key come
// as 20 per key, inserted head first: the ordering trigger leaves a key's
// lowest id unblocked and blocks every later row of it. Heads, by key k,
// of every 20 values of k / 10: 10 ready, 3 leased, 1 leased past its
// expiry, 3 retrying and 3 scheduled, these due later; the rows behind
// them are due. Rows are created 50 ms apart, the oldest about 14 hours
// ago. Dead letters take the ids below fixtureFirstRow (with gaps, the
// rows delivered between them), spread over the four queues and the four
// reasons, one failing every 25 seconds over the last 29 days. The inserts
// fire the triggers (the ordering trigger per keyed row, the wake-up per
// statement) as publishers' inserts do; nothing is dropped to speed them.
func fixtureSQL() []fixtureStmt {
	stmts := []fixtureStmt{
		{SQL: `SELECT setval('outbox_id_seq', $1::bigint - 1)`, Args: []any{fixtureFirstRow}},
		{SQL: `INSERT INTO outbox_dlq (id, queue, payload, headers, ordering_key, timer_id, deliveries_count,
				attempts_count, created_at, failed_at, failure_reason, last_error)
			SELECT g.j + (g.j - 1) / 2, ` + fixtureQueue("g.j") + `,
			       convert_to(format('{"order":%s,"customer":"customer-%s","total":%s,"items":["tea","cake","scones"]}',
			                         g.j, g.j % 5000, 100 + g.j % 9900), 'UTF8'),
			       '{"content-type":"application/json","source":"checkout"}'::jsonb,
			       CASE WHEN g.j % 5 = 0 THEN 'customer-' || g.j % 10000 END,
			       CASE WHEN g.j % 50 = 0 THEN 'timer-dead-' || g.j END,
			       CASE WHEN r.reason = 'max_deliveries' THEN 10 ELSE 5 END,
			       CASE WHEN r.reason IN ('max_deliveries', 'decode_error') THEN 0 ELSE 5 END,
			       f.failed - interval '10 minutes', f.failed, r.reason,
			       CASE r.reason WHEN 'retry_exhausted' THEN format('handler: POST https://hooks.example.com/%s: 503 Service Unavailable', g.j % 100)
			                     WHEN 'rejected' THEN 'handler: customer ' || g.j % 5000 || ' is closed'
			                     WHEN 'decode_error' THEN 'decode: unexpected end of JSON input' END
			FROM generate_series(1, $1::int) AS g(j)
			CROSS JOIN LATERAL (SELECT now() - ($1::int - g.j) * interval '25 seconds' AS failed) AS f
			CROSS JOIN LATERAL (SELECT (ARRAY['max_deliveries','retry_exhausted','rejected','decode_error'])[1 + (g.j / 10) % 4] AS reason) AS r`,
			Args: []any{fixtureDead}},
	}
	plain := `INSERT INTO outbox (queue, payload, headers, timer_id, created_at, next_attempt_at, attempts_count,
			deliveries_count, first_attempt_at, last_attempt_at, acquired_at, acquired_token, lease_expires_at, last_error)
		SELECT ` + fixtureQueue("g.i") + `,
		       convert_to(format('{"order":%s,"customer":"customer-%s","total":%s,"items":["tea","cake","scones"]}',
		                         g.i, g.i % 5000, 100 + g.i % 9900), 'UTF8'),
		       '{"content-type":"application/json","source":"checkout"}'::jsonb,
		       CASE WHEN s.st = 'timer' THEN 'timer-' || g.i END,
		       c.created,
		       CASE s.st WHEN 'scheduled' THEN now() + (1 + g.i % 7200) * interval '1 second'
		                 WHEN 'timer' THEN now() + (1 + g.i % 86400) * interval '1 second'
		                 WHEN 'retrying' THEN now() + (g.i % 1800 - 900) * interval '1 second'
		                 ELSE c.created END,
		       CASE WHEN s.st = 'retrying' THEN 1 + g.i % 5 ELSE 0 END,
		       CASE WHEN s.st = 'retrying' THEN 1 + g.i % 5 WHEN s.st IN ('leased', 'expired') THEN 1 ELSE 0 END,
		       CASE WHEN s.st = 'retrying' THEN c.created + interval '1 second' ELSE l.acquired END,
		       CASE WHEN s.st = 'retrying' THEN now() - (900 + g.i % 600) * interval '1 second' ELSE l.acquired END,
		       l.acquired,
		       CASE WHEN l.acquired IS NOT NULL THEN md5(g.i::text)::uuid END,
		       l.acquired + interval '30 seconds',
		       CASE WHEN s.st = 'retrying' THEN format('handler: POST https://hooks.example.com/%s: 503 Service Unavailable', g.i % 100) END
		FROM generate_series($1::int, $2::int) AS g(i)
		CROSS JOIN LATERAL (SELECT g.i / 10 % 1000 AS n) AS n
		CROSS JOIN LATERAL (SELECT CASE WHEN n.n < 855 THEN 'ready' WHEN n.n < 905 THEN 'scheduled'
		                                WHEN n.n < 925 THEN 'timer' WHEN n.n < 985 THEN 'retrying'
		                                WHEN n.n < 997 THEN 'leased' ELSE 'expired' END AS st) AS s
		CROSS JOIN LATERAL (SELECT now() - ($3::int - $4::int - g.i) * interval '50 ms' AS created) AS c
		CROSS JOIN LATERAL (SELECT CASE s.st WHEN 'leased' THEN now() - (g.i % 20) * interval '1 second'
		                                     WHEN 'expired' THEN now() - (300 + g.i % 600) * interval '1 second' END AS acquired) AS l
		ORDER BY g.i`
	keyed := `INSERT INTO outbox (queue, payload, headers, ordering_key, created_at, next_attempt_at, attempts_count,
			deliveries_count, first_attempt_at, last_attempt_at, acquired_at, acquired_token, lease_expires_at, last_error)
		SELECT ` + fixtureQueue("k.k") + `,
		       convert_to(format('{"customer":"customer-%s","event":%s,"status":"updated"}', k.k, p.p), 'UTF8'),
		       '{"content-type":"application/json","source":"accounts"}'::jsonb,
		       'customer-' || k.k,
		       c.created,
		       CASE s.st WHEN 'retrying' THEN now() + (60 + k.k % 1800) * interval '1 second'
		                 WHEN 'scheduled' THEN now() + (60 + k.k % 7200) * interval '1 second'
		                 ELSE c.created END,
		       CASE WHEN s.st = 'retrying' THEN 1 + k.k % 5 ELSE 0 END,
		       CASE WHEN s.st = 'retrying' THEN 1 + k.k % 5 WHEN s.st IN ('leased', 'expired') THEN 1 ELSE 0 END,
		       CASE WHEN s.st = 'retrying' THEN c.created + interval '1 second' ELSE l.acquired END,
		       CASE WHEN s.st = 'retrying' THEN now() - (k.k % 600) * interval '1 second' ELSE l.acquired END,
		       l.acquired,
		       CASE WHEN l.acquired IS NOT NULL THEN md5('key' || k.k)::uuid END,
		       l.acquired + interval '30 seconds',
		       CASE WHEN s.st = 'retrying' THEN 'handler: customer ' || k.k || ': account is locked' END
		FROM generate_series(0, $3::int - 1) AS p(p)
		CROSS JOIN generate_series($1::int, $2::int) AS k(k)
		CROSS JOIN LATERAL (SELECT k.k / 10 % 20 AS n) AS n
		CROSS JOIN LATERAL (SELECT CASE WHEN p.p > 0 THEN 'behind' WHEN n.n < 10 THEN 'ready'
		                                WHEN n.n < 13 THEN 'leased' WHEN n.n = 13 THEN 'expired'
		                                WHEN n.n < 17 THEN 'retrying' ELSE 'scheduled' END AS st) AS s
		CROSS JOIN LATERAL (SELECT now() - ($4::int - p.p * $5::int - k.k % $5::int) * interval '50 ms' AS created) AS c
		CROSS JOIN LATERAL (SELECT CASE s.st WHEN 'leased' THEN now() - (k.k % 20) * interval '1 second'
		                                     WHEN 'expired' THEN now() - (300 + k.k % 600) * interval '1 second' END AS acquired) AS l
		ORDER BY p.p, k.k`
	// Each round's keyed rows are created after its plain ones; a key's
	// rows follow one another every keys-of-the-round rows. A round takes
	// one advisory lock per key (the ordering trigger's), held to its end:
	// a thousand keys stay well inside the server's lock table.
	perRound := fixturePlain + fixtureKeys*fixturePerKey
	for r := range fixtureRounds {
		first := r*fixturePlain + 1
		stmts = append(stmts,
			fixtureStmt{SQL: plain, Args: []any{first, first + fixturePlain - 1, fixtureRows, r * (perRound - fixturePlain)}},
			fixtureStmt{SQL: keyed, Args: []any{r * fixtureKeys, (r+1)*fixtureKeys - 1, fixturePerKey,
				fixtureRows - r*perRound - fixturePlain, fixtureKeys}})
	}
	// Statistics, as autovacuum's analyze would gather them; no vacuum.
	// The tables stay as a burst of inserts leaves them: no page marked
	// all-visible, so every index-only scan checks the table too. That is
	// the harder case for the plans (the test database runs with
	// autovacuum off, so nothing vacuums them during the test either).
	return append(stmts, fixtureStmt{SQL: "ANALYZE outbox, outbox_dlq"})
}

// fixtureStmt is one statement of the fixture.
type fixtureStmt struct {
	SQL  string
	Args []any
}

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
	for i, s := range fixtureSQL() {
		if _, err := d.Pool.Exec(ctx, s.SQL, s.Args...); err != nil {
			tb.Fatalf("fixture statement %d: %v", i, err)
		}
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
	tb.Logf("fixture: %d outbox rows, %d dead letters, built in %v", fixtureRows, fixtureDead, fx.Took.Round(time.Millisecond))
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
	for _, q := range fixtureQueues {
		ps = append(ps, page{"queue/" + q, base + "/queue?q=" + q, `id="depth"`})
	}
	ps = append(ps,
		page{"keys", base + "/keys", `id="keys"`},
		page{"keys/orders", base + "/keys?q=orders", `id="keys"`},
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
	next := regexp.MustCompile(`id="next" href="([^"]+)"`).FindStringSubmatch(get(tb, h, base+"/dead", `id="next"`))
	if next == nil {
		tb.Fatal("the first page of dead letters links no next page")
	}
	ps = append(ps,
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
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
	body, _ := io.ReadAll(rec.Result().Body)
	if rec.Code != http.StatusOK || !strings.Contains(string(body), want) {
		tb.Fatalf("GET %s: %d, want 200 with %s:\n%s", target, rec.Code, want, body)
	}
	return string(body)
}

// consoleload is the program that measures the database's cost of a tab
// left open on the console, on a copy of the fixture.
const consoleload = "../bench/cmd/consoleload/main.go"

// fixtureNames are the declarations that make the fixture's outbox.
var fixtureNames = []string{"fixtureRounds", "fixturePlain", "fixtureKeys", "fixturePerKey", "fixtureDead",
	"fixtureRows", "fixtureFirstRow", "fixtureQueue", "fixtureSQL", "fixtureStmt"}

// fixtureDecls returns, by name, the source (without comments) of the
// declarations of fixtureNames in the file at path.
func fixtureDecls(t *testing.T, path string) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	keep := func(name string, node any) {
		if !slices.Contains(fixtureNames, name) {
			return
		}
		var b bytes.Buffer
		if err := printer.Fprint(&b, fset, node); err != nil {
			t.Fatal(err)
		}
		out[name] = b.String()
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				keep(d.Name.Name, d.Body)
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.ValueSpec:
					if len(s.Values) == 1 {
						keep(s.Names[0].Name, s.Values[0])
					}
				case *ast.TypeSpec:
					keep(s.Name.Name, s.Type)
				}
			}
		}
	}
	return out
}

// bench/cmd/consoleload measures on the same outbox as the plan test and
// the page benchmark: its copy of the fixture's declarations is this
// file's.
func TestConsoleloadBuildsTheSameOutbox(t *testing.T) {
	t.Parallel()
	ours, theirs := fixtureDecls(t, "fixture_test.go"), fixtureDecls(t, consoleload)
	for _, name := range fixtureNames {
		if ours[name] == "" {
			t.Errorf("fixture_test.go declares no %s", name)
		}
	}
	if diff := cmp.Diff(ours, theirs); diff != "" {
		t.Errorf("%s builds another outbox than fixture_test.go (-here +there):\n%s", consoleload, diff)
	}
}
