package console

import (
	"context"
	"html"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/outbox"
)

func (s *site) countDead(f outbox.DeadLetterFilter) int64 {
	s.t.Helper()
	n, err := s.ob.CountDeadLetters(s.t.Context(), f)
	if err != nil {
		s.t.Fatal(err)
	}
	return n
}

func TestActionsAreOffUnlessEnabled(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{})
	s.fixture()
	for _, p := range []string{s.base + "/dead", s.base + "/dead/-1", s.base + "/row?q=orders&timer=remind-7"} {
		body := s.page(p)
		for _, id := range []string{"replay-filter", "replay-selected", "delete-filter", "replay-one", "delete-one", "cancel-timer",
			"retry-now", "cancel-row", "dead-letter-row", "pause", "resume"} {
			if strings.Contains(body, `id="`+id+`"`) {
				t.Errorf("%s of a read-only console shows #%s", p, id)
			}
		}
	}
	for _, p := range []string{"/dead/replay", "/dead/delete", "/timer/cancel", "/queue/pause", "/queue/resume", "/row/retry", "/row/cancel",
		"/row/dead-letter"} {
		code, body := s.post(s.base+p, url.Values{"scope": {"filter"}, "step": {"confirm"}, "q": {"orders"}, "timer": {"remind-7"}, "id": {"1"}})
		if code != http.StatusForbidden || !strings.Contains(errorText(body), "actions are turned off") {
			t.Errorf("POST %s = %d %q, want 403", p, code, errorText(body))
		}
	}
	if n := s.countDead(outbox.DeadLetterFilter{}); n != 3 {
		t.Errorf("the dead-letter table holds %d rows, want the 3 it had", n)
	}
	if _, ok, _ := s.ob.RowByTimer(t.Context(), "orders", "remind-7"); !ok {
		t.Error("the timer was cancelled")
	}
}

func TestActionsRefuseFormsFromElsewhere(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{Actions: true})
	s.fixture()
	s.page(s.base + "/dead") // the cookie
	form := url.Values{"scope": {"filter"}, "step": {"confirm"}}
	for name, c := range map[string]struct {
		token  string
		header [2]string
	}{
		"no token":       {"", [2]string{}},
		"another token":  {strings.Repeat("A", 43), [2]string{}},
		"another site":   {"page", [2]string{"Sec-Fetch-Site", "cross-site"}},
		"another origin": {"page", [2]string{"Origin", "https://evil.example"}},
	} {
		f := url.Values{}
		for k, v := range form {
			f[k] = v
		}
		tok := c.token
		if tok == "page" {
			tok = csrfRE.FindStringSubmatch(s.page(s.base + "/dead"))[1]
		}
		f.Set("csrf", tok)
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.srv.URL+s.base+"/dead/delete", strings.NewReader(f.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if c.header[0] != "" {
			req.Header.Set(c.header[0], c.header[1])
		}
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		code, body := read(t, resp)
		if code != http.StatusForbidden {
			t.Errorf("%s: %d %q, want 403", name, code, errorText(body))
		}
	}
	if n := s.countDead(outbox.DeadLetterFilter{}); n != 3 {
		t.Errorf("the dead-letter table holds %d rows, want the 3 it had", n)
	}
}

func TestReplayCountsThenDryRunsThenReplays(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{Actions: true, User: func(*http.Request) string { return "alice" }})
	s.fixture()
	filter := url.Values{"scope": {"filter"}, "q": {"orders"}}

	step := func(name, want string) string {
		t.Helper()
		f := url.Values{"step": {name}}
		for k, v := range filter {
			f[k] = v
		}
		code, body := s.post(s.base+"/dead/replay", f)
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Fatalf("step %s: %d, %q; want %q", name, code, errorText(body), want)
		}
		return body
	}
	count := step("count", `<p id="count" class="message">The dead letters of queue &#34;orders&#34;: 2 rows.</p>`)
	if !strings.Contains(count, `id="dry-run"`) || !strings.Contains(count, `name="step" value="dry-run"`) {
		t.Error("the count step offers no dry run")
	}
	dry := step("dry-run", `<p id="dry-result" class="message">Dry run: 2 rows would go back to the outbox, 0 rows would stay`)
	if !strings.Contains(dry, `id="confirm"`) {
		t.Error("the dry run offers no confirmation")
	}
	if n := s.countDead(outbox.DeadLetterFilter{Queue: "orders"}); n != 2 {
		t.Fatalf("after the dry run %d dead letters of orders, want 2", n)
	}
	if strings.Contains(s.log.String(), "console action") {
		t.Error("a count or a dry run was logged as an action")
	}
	step("confirm", `<p id="result" class="message">Replayed 2 dead letters; 0 rows stayed`)
	if n := s.countDead(outbox.DeadLetterFilter{}); n != 1 {
		t.Errorf("after the replay %d dead letters, want the 1 of mail", n)
	}
	log := s.log.String()
	for _, want := range []string{`"msg":"console action"`, `"who":"alice"`, `"action":"replay dead letters"`, `"replayed":2`,
		`"target":"the dead letters of queue \"orders\""`, `"outbox":"` + s.d.Schema + `.outbox"`} {
		if !strings.Contains(log, want) {
			t.Errorf("the action log lacks %s:\n%s", want, log)
		}
	}
}

func TestDeleteSelectionAndCancelTimer(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{Actions: true})
	s.fixture()
	sel := url.Values{"scope": {"selection"}, "id": {"-1", "-3"}, "step": {"confirm"}}
	if code, body := s.post(s.base+"/dead/delete", sel); code != 200 || !strings.Contains(body, "Deleted 2 dead letters.") {
		t.Errorf("delete: %d %q", code, errorText(body))
	}
	if n := s.countDead(outbox.DeadLetterFilter{}); n != 1 {
		t.Errorf("%d dead letters left, want 1", n)
	}
	if code, body := s.post(s.base+"/dead/delete", url.Values{"scope": {"selection"}, "step": {"confirm"}}); code != http.StatusBadRequest {
		t.Errorf("an empty selection: %d %q, want 400", code, errorText(body))
	}
	timer := url.Values{"q": {"orders"}, "timer": {"remind-7"}}
	if code, body := s.post(s.base+"/timer/cancel", timer); code != 200 || !strings.Contains(body, "scheduled, due") {
		t.Errorf("cancel count step: %d %q", code, errorText(body))
	}
	timer.Set("step", "confirm")
	if code, body := s.post(s.base+"/timer/cancel", timer); code != 200 || !strings.Contains(body, "Cancelled timer") {
		t.Errorf("cancel: %d %q", code, errorText(body))
	}
	if _, ok, _ := s.ob.RowByTimer(t.Context(), "orders", "remind-7"); ok {
		t.Error("the timer's row is still in the outbox")
	}
	if code, body := s.post(s.base+"/timer/cancel", timer); code != 200 || !strings.Contains(body, "Nothing to cancel") {
		t.Errorf("cancel again: %d %q", code, errorText(body))
	}
	if code, _ := s.post(s.base+"/dead/replay", url.Values{"scope": {"filter"}, "step": {"later"}}); code != http.StatusBadRequest {
		t.Errorf("an unknown step: %d, want 400", code)
	}
}

var hiddenRE = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)

// nextForm is the fields of the form an action's page offers next.
func nextForm(t *testing.T, body string) url.Values {
	t.Helper()
	i := strings.Index(body, `id="action-form"`)
	if i < 0 {
		t.Fatalf("the page offers no next step:\n%s", errorText(body))
	}
	f := url.Values{}
	for _, m := range hiddenRE.FindAllStringSubmatch(body[i:], -1) {
		f.Add(m[1], html.UnescapeString(m[2]))
	}
	return f
}

var resultRE = regexp.MustCompile(`id="(?:result|changed)" class="message">([^<]*)<|<li>([^<]*)</li>`)

// said is what an action's page says: its result, whether the set
// changed, and its details.
func said(body string) []string {
	var out []string
	for _, m := range resultRE.FindAllStringSubmatch(body, -1) {
		out = append(out, html.UnescapeString(m[1]+m[2]))
	}
	return out
}

// The confirmation carries the dry run's bound: it acts on none of the
// rows dead-lettered since, says they were left, and says when the set
// within the bound changed.
func TestConfirmActsWithinTheDryRunsBoundAndSaysWhenTheSetChanged(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		path, dry, done string
	}{
		{"/dead/replay", "Dry run: 3 rows would go back to the outbox, 0 rows would stay in the dead-letter table.",
			"Replayed 2 dead letters; 0 rows stayed in the dead-letter table."},
		{"/dead/delete", "Dry run: 3 dead letters would be deleted for good.", "Deleted 2 dead letters."},
	} {
		t.Run(c.path, func(t *testing.T) {
			t.Parallel()
			s := newSite(t, Config{Actions: true})
			s.fixture()
			code, body := s.post(s.base+c.path, url.Values{"scope": {"filter"}, "step": {"dry-run"}})
			if code != http.StatusOK || !strings.Contains(body, c.dry) {
				t.Fatalf("dry run: %d %q, want %q", code, errorText(body), c.dry)
			}
			confirm := nextForm(t, body)
			// Two dead-lettered after the dry run; one of its rows taken.
			s.exec(`INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason)
				VALUES (10, 'orders', 'late', 1, 1, now(), 'rejected'), (11, 'mail', 'late', 1, 1, now(), 'rejected')`)
			s.exec(`DELETE FROM outbox_dlq WHERE id = -2`)
			code, body = s.post(s.base+c.path, confirm)
			want := []string{c.done, "The set changed since the dry run: 2 rows now match within its bound, where it showed 3.",
				"2 dead letters matching the filter came after the dry run and were left."}
			if diff := cmp.Diff(want, said(body)); code != http.StatusOK || diff != "" {
				t.Errorf("confirm: %d (-want +got):\n%s", code, diff)
			}
			if n := s.countDead(outbox.DeadLetterFilter{}); n != 2 {
				t.Errorf("%d dead letters left, want the 2 of after the dry run", n)
			}
		})
	}
}

// A large action does a bounded share of its rows per request, each in
// batches that commit, and its page offers to go on until it is done.
func TestLargeActionGoesOnOverRequests(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{Actions: true})
	s.c.actionStep = time.Nanosecond // one batch a request
	s.exec(`INSERT INTO outbox_dlq (id, queue, payload, ordering_key, deliveries_count, attempts_count, created_at, failure_reason)
		SELECT i, 'bulk', 'p', 'k-' || (i % 7), 1, 1, now(), 'rejected' FROM generate_series(1, 1200) AS i`)
	code, body := s.post(s.base+"/dead/replay", url.Values{"scope": {"filter"}, "q": {"bulk"}, "step": {"dry-run"}})
	if code != http.StatusOK {
		t.Fatalf("dry run: %d %q", code, errorText(body))
	}
	form := nextForm(t, body)
	var got []string
	for range 10 {
		code, body = s.post(s.base+"/dead/replay", form)
		if code != http.StatusOK {
			t.Fatalf("confirm: %d %q", code, errorText(body))
		}
		got = append(got, said(body)...)
		if !strings.Contains(body, `id="continue"`) {
			break
		}
		form = nextForm(t, body)
	}
	want := []string{
		"Replayed 500 dead letters so far, of 1,200; this page stopped to stay within its time. Continue to replay the rest: the rows replayed are no longer dead letters.",
		"Replayed 1,000 dead letters so far, of 1,200; this page stopped to stay within its time. Continue to replay the rest: the rows replayed are no longer dead letters.",
		"Replayed 1,200 dead letters; 0 rows stayed in the dead-letter table.",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("pages (-want +got):\n%s", diff)
	}
	var inOutbox int
	if err := s.d.Pool.QueryRow(t.Context(), "SELECT count(*) FROM outbox WHERE queue = 'bulk'").Scan(&inOutbox); err != nil {
		t.Fatal(err)
	}
	if n := s.countDead(outbox.DeadLetterFilter{}); n != 0 || inOutbox != 1200 {
		t.Errorf("%d dead letters left and %d in the outbox, want 0 and 1200", n, inOutbox)
	}
	if n := strings.Count(s.log.String(), `"msg":"console action"`); n != 3 {
		t.Errorf("%d action log records, want one a request:\n%s", n, s.log.String())
	}
}

// The queue page of a console with actions offers a pause; the pause goes
// through its count, its dry run and its confirmation, with its reason;
// the queues page and the queue page then show the queue paused, a
// paused queue without rows included, and offer the resume, which wakes
// the queue. A read-only console shows neither form and refuses both.
func TestPauseAndResumeAQueue(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{Actions: true})
	s.fixture()
	queue := s.page(s.base + "/queue?q=orders")
	if !strings.Contains(queue, `id="pause"`) || strings.Contains(queue, `id="resume"`) || strings.Contains(queue, `id="paused"`) {
		t.Fatalf("the queue page of a running queue:\n%s", queue)
	}
	form := url.Values{"q": {"orders"}, "reason": {"payments <down>"}}
	code, body := s.post(s.base+"/queue/pause", form)
	if code != 200 || !strings.Contains(body, "runs: ") {
		t.Fatalf("pause, count: %d %q", code, errorText(body))
	}
	code, body = s.post(s.base+"/queue/pause", nextForm(t, body))
	if code != 200 || !strings.Contains(body, "Dry run: ") {
		t.Fatalf("pause, dry run: %d %q", code, errorText(body))
	}
	if ps, err := s.ob.PausedQueues(t.Context()); err != nil || len(ps) != 0 {
		t.Fatalf("paused by the dry run: %+v, %v", ps, err)
	}
	code, body = s.post(s.base+"/queue/pause", nextForm(t, body))
	if code != 200 || !strings.Contains(body, "is paused since") {
		t.Fatalf("pause, confirm: %d %q", code, errorText(body))
	}
	ps, err := s.ob.PausedQueues(t.Context())
	if err != nil || len(ps) != 1 || ps[0].Queue != "orders" || ps[0].Reason != "payments <down>" {
		t.Fatalf("PausedQueues after the pause: %+v, %v", ps, err)
	}
	if _, err := s.ob.PauseQueue(t.Context(), "idle", ""); err != nil {
		t.Fatal(err)
	}
	queues := s.page(s.base + "/")
	for _, q := range []string{"orders", "idle"} {
		if !regexp.MustCompile(`data-queue="` + q + `">\s*<td><a class="queue-link"[^>]*>` + q + `</a> <span class="paused warn">paused</span>`).MatchString(queues) {
			t.Errorf("the queues page does not show %s paused:\n%s", q, queues)
		}
	}
	queue = s.page(s.base + "/queue?q=orders")
	if !strings.Contains(queue, `id="paused"`) || !strings.Contains(queue, ": payments &lt;down&gt;.") || !strings.Contains(queue, `id="resume"`) {
		t.Fatalf("the queue page of a paused queue:\n%s", queue)
	}
	resume := url.Values{"q": {"orders"}, "step": {"confirm"}}
	if code, body := s.post(s.base+"/queue/resume", resume); code != 200 || !strings.Contains(body, "Resumed the queue") {
		t.Fatalf("resume: %d %q", code, errorText(body))
	}
	if code, body := s.post(s.base+"/queue/resume", resume); code != 200 || !strings.Contains(body, "Nothing to resume") {
		t.Fatalf("resume again: %d %q", code, errorText(body))
	}
	if code, body := s.post(s.base+"/queue/pause", url.Values{"step": {"confirm"}}); code != http.StatusBadRequest {
		t.Errorf("a pause naming no queue: %d %q, want 400", code, errorText(body))
	}

	ro := newSite(t, Config{})
	ro.fixture()
	if body := ro.page(ro.base + "/queue?q=orders"); strings.Contains(body, `id="pause"`) || strings.Contains(body, `id="resume"`) {
		t.Errorf("a read-only console's queue page offers a pause or a resume")
	}
	for _, p := range []string{"/queue/pause", "/queue/resume"} {
		if code, body := ro.post(ro.base+p, url.Values{"q": {"orders"}, "step": {"confirm"}}); code != http.StatusForbidden {
			t.Errorf("POST %s to a read-only console = %d %q, want 403", p, code, errorText(body))
		}
	}
	if ps, err := ro.ob.PausedQueues(t.Context()); err != nil || len(ps) != 0 {
		t.Errorf("a read-only console paused: %+v, %v", ps, err)
	}
}

// The Queues page lists the running subscribers, and a queue's page
// those of the queue; with none, each says so.
func TestPagesListTheRunningSubscribers(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{})
	s.fixture()
	if body := s.page(s.base + "/"); !strings.Contains(body, `id="no-subscribers"`) {
		t.Fatalf("the Queues page with no subscriber running:\n%s", body)
	}
	sub, err := outbox.NewSubscriber(s.ob, []string{"orders"}, func(context.Context, *outbox.Message[[]byte]) error { return nil },
		&outbox.SubscriberConfig[[]byte]{Name: "order-mailer", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.RunUntilEnd(t, sub.Run)
	row := regexp.MustCompile(`<tr class="subscriber" data-name="order-mailer">\s*<td class="name mono">order-mailer</td>`)
	var body string
	for deadline := time.Now().Add(time.Minute); !row.MatchString(body); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the Queues page does not list the subscriber:\n%s", body)
		}
		body = s.page(s.base + "/")
	}
	if body := s.page(s.base + "/queue?q=orders"); !row.MatchString(body) {
		t.Errorf("the orders queue's page does not list its subscriber:\n%s", body)
	}
	if body := s.page(s.base + "/queue?q=invoices"); row.MatchString(body) || !strings.Contains(body, `id="no-subscribers"`) {
		t.Errorf("the invoices queue's page lists another queue's subscriber:\n%s", body)
	}
}

// The row page of a console with actions offers retry now (for a
// scheduled row), cancel and move to the dead letters, each through its
// count, dry run and confirmation; a leased row's page offers none.
func TestRowActions(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{Actions: true})
	s.fixture()
	pub, err := outbox.NewPublisher[[]byte](s.ob, "ops", nil)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int64, 3)
	for i := range ids {
		if ids[i], err = pub.Publish(t.Context(), s.d.Pool, []byte(`{}`), &outbox.PublishOpts{Delay: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	page := s.page(s.base + "/row?id=" + strconv.FormatInt(ids[0], 10))
	for _, id := range []string{"retry-now", "cancel-row", "dead-letter-row"} {
		if !strings.Contains(page, `id="`+id+`"`) {
			t.Errorf("the scheduled row's page lacks #%s", id)
		}
	}
	act := func(path string, id int64, note string) string {
		t.Helper()
		form := url.Values{"id": {strconv.FormatInt(id, 10)}, "note": {note}}
		code, body := s.post(s.base+path, form)
		if code != 200 || !strings.Contains(body, "is scheduled") {
			t.Fatalf("%s, count: %d %q", path, code, errorText(body))
		}
		code, body = s.post(s.base+path, nextForm(t, body))
		if code != 200 || !strings.Contains(body, "Dry run: ") {
			t.Fatalf("%s, dry run: %d %q", path, code, errorText(body))
		}
		code, body = s.post(s.base+path, nextForm(t, body))
		if code != 200 {
			t.Fatalf("%s, confirm: %d %q", path, code, errorText(body))
		}
		return strings.Join(said(body), " ")
	}
	if got := act("/row/retry", ids[0], ""); got != "Done: retry a row now." {
		t.Errorf("retry now said %q", got)
	}
	if got := act("/row/cancel", ids[1], ""); got != "Done: cancel a row." {
		t.Errorf("cancel said %q", got)
	}
	if got := act("/row/dead-letter", ids[2], "ops: bad order"); got != "Done: move a row to the dead letters." {
		t.Errorf("dead-letter said %q", got)
	}
	row, ok, err := s.ob.Row(t.Context(), ids[0])
	if err != nil || !ok || row.State != outbox.RowReady {
		t.Errorf("the retried row: %+v, %v, %v; want it ready", row, ok, err)
	}
	if _, ok, _ := s.ob.Row(t.Context(), ids[1]); ok {
		t.Error("the cancelled row is still in the outbox")
	}
	if d, ok, err := s.ob.DeadLetter(t.Context(), ids[2]); err != nil || !ok || d.LastError != "ops: bad order" {
		t.Errorf("the dead-lettered row: %+v, %v, %v", d, ok, err)
	}
	// Again: nothing to do, and it says so.
	form := url.Values{"id": {strconv.FormatInt(ids[1], 10)}, "step": {"confirm"}}
	if code, body := s.post(s.base+"/row/cancel", form); code != 200 || !strings.Contains(strings.Join(said(body), " "), "Nothing done") {
		t.Errorf("cancel of a gone row: %d %q", code, said(body))
	}
}

// The rows page lists a queue's rows in the state asked, with links to
// each row and to the next page, and a key's rows; the queue page links
// it.
func TestRowsPage(t *testing.T) {
	t.Parallel()
	s := newSite(t, Config{})
	s.fixture()
	pub, err := outbox.NewPublisher[[]byte](s.ob, "ops", nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for range rowsPerPage + 1 {
		id, err := pub.Publish(t.Context(), s.d.Pool, []byte(`{}`), &outbox.PublishOpts{Delay: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if body := s.page(s.base + "/queue?q=ops"); !strings.Contains(body, `href="`+s.base+`/rows?q=ops&amp;state=scheduled"`) {
		t.Fatalf("the queue page does not link its scheduled rows:\n%s", body)
	}
	body := s.page(s.base + "/rows?q=ops&state=scheduled")
	rowRE := regexp.MustCompile(`<tr class="row" data-id="(\d+)">`)
	got := rowRE.FindAllStringSubmatch(body, -1)
	next := regexp.MustCompile(`id="next" href="([^"]+)"`).FindStringSubmatch(body)
	if len(got) != rowsPerPage || got[0][1] != strconv.FormatInt(ids[0], 10) || next == nil {
		t.Fatalf("the first page lists %d rows, next %v:\n%s", len(got), next, body)
	}
	body = s.page(html.UnescapeString(next[1]))
	if got := rowRE.FindAllStringSubmatch(body, -1); len(got) != 1 || got[0][1] != strconv.FormatInt(ids[rowsPerPage], 10) {
		t.Errorf("the second page lists %v", got)
	}
	if body := s.page(s.base + "/rows?q=ops"); !strings.Contains(body, `id="no-rows"`) {
		t.Errorf("the ready rows of a queue whose rows are all scheduled:\n%s", body)
	}
	if code, _ := s.get(s.base + "/rows?q=ops&after=nonsense"); code != http.StatusBadRequest {
		t.Errorf("a bad cursor: %d, want 400", code)
	}
	// Filtered by message type and age, the filters kept in the form and
	// the URL.
	var refund int64
	if err := s.d.Pool.QueryRow(t.Context(), `INSERT INTO outbox (queue, payload, headers, next_attempt_at)
		VALUES ('ops', 'r', '{"message-type": "shop.Refund"}', now() + interval '2 hours') RETURNING id`).Scan(&refund); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		query string
		want  []string
	}{
		{"&type=shop.Refund", []string{strconv.FormatInt(refund, 10)}},
		{"&type=shop.Refund&newer=1h", []string{strconv.FormatInt(refund, 10)}},
		{"&type=shop.Refund&older=1h", nil},
		{"&older=5m", nil},
	} {
		body := s.page(s.base + "/rows?q=ops&state=scheduled" + c.query)
		var got []string
		for _, m := range rowRE.FindAllStringSubmatch(body, -1) {
			got = append(got, m[1])
		}
		if diff := cmp.Diff(c.want, got); diff != "" || (c.want == nil) != strings.Contains(body, `id="no-rows"`) {
			t.Errorf("rows %s (-want +got):\n%s", c.query, diff)
		}
		if strings.Contains(c.query, "type=") && !strings.Contains(body, `name="type" value="shop.Refund"`) {
			t.Errorf("rows %s: the form lost the type filter", c.query)
		}
	}
	// Retrying: the scheduled rows an attempt of which failed.
	var failed int64
	if err := s.d.Pool.QueryRow(t.Context(), `INSERT INTO outbox (queue, payload, next_attempt_at, attempts_count, last_error)
		VALUES ('ops', 'f', now() + interval '3 hours', 1, 'boom') RETURNING id`).Scan(&failed); err != nil {
		t.Fatal(err)
	}
	retrying := rowRE.FindAllStringSubmatch(s.page(s.base+"/rows?q=ops&state=retrying"), -1)
	if len(retrying) != 1 || retrying[0][1] != strconv.FormatInt(failed, 10) {
		t.Errorf("the retrying rows: %v; want only %d", retrying, failed)
	}
	if code, _ := s.get(s.base + "/rows?q=ops&older=yesterday"); code != http.StatusBadRequest {
		t.Errorf("a bad age: %d, want 400", code)
	}
}
