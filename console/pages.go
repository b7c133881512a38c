package console

import (
	"bytes"
	"cmp"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outboxgen/outboxgen/outbox"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticRoot embed.FS

// staticFS holds the style sheet and the script.
var staticFS, _ = fs.Sub(staticRoot, "static")

// pageNames are the pages, each a template of its own beside the layout.
var pageNames = []string{"overview", "outbox", "queue", "keys", "rows", "dead", "deadletter", "row", "health", "action", "error"}

// parsePages parses each page with the layout, its links built under
// path.
func parsePages(path string) (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"num":      num,
		"count":    count,
		"est":      estimated,
		"dur":      dur,
		"stamp":    stamp,
		"presence": func() string { return dur(outbox.SubscriberPresenceInterval) },
		"clip":     clip,
		"preview":  preview,
		"deadPreview": func(d outbox.DeadLetter) string {
			return previewOf(d.Payload, d.PayloadSize, deadPreviewChars)
		},
		"root":  func() string { return path },
		"q":     url.QueryEscape,
		"neg":   func(d time.Duration) time.Duration { return -d },
		"pct":   func(f float64) float64 { return f * 100 },
		"size":  func(n int) string { return plural(int64(n), "byte", "bytes") },
		"upper": strings.ToUpper,
	}
	out := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, err
		}
		out[name] = t
	}
	return out, nil
}

// view is what the layout renders around a page.
type view struct {
	Title   string
	Root    string
	Outbox  *outbox.OutboxName
	Base    string
	Nav     string
	Refresh int
	CSRF    string
	Actions bool
	// Took is the server time the page took to read and render.
	Took string
	Data any
}

// render writes page with v.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, page string, v view, start time.Time) {
	v.Root = c.cfg.Path
	v.Actions = c.cfg.Actions
	if v.Took == "" {
		v.Took = dur(time.Since(start))
	}
	var b bytes.Buffer
	if err := c.pages[page].Execute(&b, v); err != nil {
		slog.ErrorContext(r.Context(), "console: render", "page", page, "err", err)
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// fail renders an error page.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, rq *request, status int, err error) {
	v := view{Title: http.StatusText(status), Data: err.Error()}
	start := time.Now()
	if rq != nil {
		v.Outbox, v.Base, v.CSRF, start = &rq.name, rq.base, rq.csrf, rq.start
	}
	c.render(w, r, status, "error", v, start)
}

// statusOf is the status an error of a read gives: 400 for bad input.
func statusOf(err error) int {
	var in *outbox.InputError
	var cf *outbox.ConfigError
	if errors.As(err, &in) || errors.As(err, &cf) {
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

func (rq *request) view(title, nav string, data any) view {
	return view{Title: title, Outbox: &rq.name, Base: rq.base, Nav: nav, CSRF: rq.csrf, Data: data}
}

// overviewRow is one outbox on the overview.
type overviewRow struct {
	Name    outbox.OutboxName
	Link    string
	Version int64
	Latest  int64
	Err     string
}

// maxOverview is how many outboxes the overview lists (each costs it a
// read of the outbox's schema version).
const maxOverview = 200

type overviewData struct {
	Rows []overviewRow
	// More counts the outboxes past maxOverview, not listed.
	More int
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	names, err := c.list(r.Context())
	if err != nil {
		c.fail(w, r, nil, http.StatusInternalServerError, err)
		return
	}
	more := max(0, len(names)-maxOverview)
	names = names[:len(names)-more]
	rows := make([]overviewRow, len(names))
	for i, n := range names {
		rows[i] = overviewRow{Name: n, Link: c.outboxPath(n) + "/"}
		st, err := c.state(r.Context(), n)
		if err == nil {
			rows[i].Latest = st.ob.LatestSchemaVersion()
			rows[i].Version, err = st.ob.SchemaVersion(r.Context())
		}
		if err != nil {
			rows[i].Err = err.Error()
		}
	}
	c.render(w, r, http.StatusOK, "overview", view{Title: "Outboxes", Nav: "overview", CSRF: c.csrfToken(w, r),
		Data: overviewData{Rows: rows, More: more}}, start)
}

// depthRow is one queue's counts as the pages show them.
type depthRow struct {
	outbox.QueueDepth
	Link string
	Cap  int64
	// Paused is the queue's pause; nil while it runs.
	Paused *outbox.QueuePause
}

func (c *Console) depths(r *http.Request, rq *request) ([]depthRow, error) {
	ds, err := rq.ob.QueueDepths(r.Context(), &outbox.DepthOptions{Cap: c.cfg.DepthCap, Blocked: true, Estimate: true})
	if err != nil {
		return nil, err
	}
	rq.readAt, rq.read = time.Now(), ds
	rq.st.history.add(rq.readAt, ds, c.refresh())
	paused, err := rq.ob.PausedQueues(r.Context())
	if err != nil {
		return nil, err
	}
	out := make([]depthRow, 0, len(ds)+len(paused))
	for _, d := range ds {
		out = append(out, depthRow{QueueDepth: d})
	}
	// A paused queue is listed even when it has no rows.
	for _, p := range paused {
		i, found := slices.BinarySearchFunc(out, p.Queue, func(d depthRow, q string) int { return strings.Compare(d.Queue, q) })
		if !found {
			out = slices.Insert(out, i, depthRow{QueueDepth: outbox.QueueDepth{Queue: p.Queue}})
		}
		out[i].Paused = &p
	}
	for i := range out {
		out[i].Link, out[i].Cap = rq.base+"/queue?q="+url.QueryEscape(out[i].Queue), c.cfg.DepthCap
	}
	return out, nil
}

// refresh is the pages' refresh period, which paces the samples too.
func (c *Console) refresh() time.Duration {
	if c.cfg.Refresh < 0 {
		return 5 * time.Second
	}
	return c.cfg.Refresh
}

func (c *Console) refreshSeconds() int {
	if c.cfg.Refresh < 0 {
		return 0
	}
	return max(1, int(c.cfg.Refresh.Round(time.Second)/time.Second))
}

type outboxData struct {
	Queues []depthRow
	Chart  chart
	Cap    int64
	// Subscribers are the running subscribers' presence records.
	Subscribers []outbox.SubscriberInfo
}

func (c *Console) outboxPage(w http.ResponseWriter, r *http.Request, rq *request) {
	ds, err := c.depths(r, rq)
	if err != nil {
		c.fail(w, r, rq, statusOf(err), err)
		return
	}
	subs, err := rq.ob.Subscribers(r.Context())
	if err != nil {
		c.fail(w, r, rq, statusOf(err), err)
		return
	}
	v := rq.view(rq.name.String(), "queues", outboxData{Queues: ds, Chart: outboxChart(rq.st.history.withCurrent(rq.readAt, rq.read)),
		Cap: c.cfg.DepthCap, Subscribers: subs})
	v.Refresh = c.refreshSeconds()
	c.render(w, r, http.StatusOK, "outbox", v, rq.start)
}

type queueData struct {
	Queue    string
	Depth    depthRow
	Found    bool
	Chart    chart
	Keys     []outbox.HeldKey
	DeadLink string
	KeysLink string
	// Paused is the queue's pause; nil while it runs.
	Paused *outbox.QueuePause
	// Subscribers are the presence records of the queue's subscribers.
	Subscribers []outbox.SubscriberInfo
	// RowStates are the states the rows page lists.
	RowStates []string
}

// keysOnQueuePage is how many held keys the queue page lists.
const keysOnQueuePage = 20

func (c *Console) queuePage(w http.ResponseWriter, r *http.Request, rq *request) {
	q := r.URL.Query().Get("q")
	if q == "" {
		c.fail(w, r, rq, http.StatusBadRequest, errors.New("name a queue: ?q=name"))
		return
	}
	ds, err := c.depths(r, rq)
	if err != nil {
		c.fail(w, r, rq, statusOf(err), err)
		return
	}
	d := queueData{Queue: q, Chart: queueChart(rq.st.history.withCurrent(rq.readAt, rq.read), q),
		RowStates: []string{outbox.RowReady, outbox.RowScheduled, outbox.RowLeased, outbox.RowExpired},
		DeadLink:  rq.base + "/dead?q=" + url.QueryEscape(q), KeysLink: rq.base + "/keys?q=" + url.QueryEscape(q)}
	for _, row := range ds {
		if row.Queue == q {
			d.Depth, d.Found, d.Paused = row, true, row.Paused
		}
	}
	subs, err := rq.ob.Subscribers(r.Context())
	if err != nil {
		c.fail(w, r, rq, statusOf(err), err)
		return
	}
	for _, s := range subs {
		if slices.Contains(s.Queues, q) {
			d.Subscribers = append(d.Subscribers, s)
		}
	}
	if d.Found {
		if d.Keys, err = rq.ob.HeldKeys(r.Context(), &outbox.HeldKeyOptions{Queues: []string{q}, Limit: keysOnQueuePage}); err != nil {
			c.fail(w, r, rq, statusOf(err), err)
			return
		}
	}
	v := rq.view("Queue "+q, "queues", d)
	v.Refresh = c.refreshSeconds()
	c.render(w, r, http.StatusOK, "queue", v, rq.start)
}

type keysData struct {
	Queue string
	Keys  []outbox.HeldKey
	Limit int
	// Scan is how many heads of each state HeldKeys looks at per queue.
	Scan int64
}

// keysPerPage is how many held keys the keys page lists.
const keysPerPage = 100

// heldKeysScan is how many heads of each state the keys page looks at
// per queue (outbox.HeldKeyOptions.Scan).
const heldKeysScan = 1000

func (c *Console) keysPage(w http.ResponseWriter, r *http.Request, rq *request) {
	q := r.URL.Query().Get("q")
	opts := &outbox.HeldKeyOptions{Limit: keysPerPage, Scan: heldKeysScan}
	if q != "" {
		opts.Queues = []string{q}
	}
	keys, err := rq.ob.HeldKeys(r.Context(), opts)
	if err != nil {
		c.fail(w, r, rq, statusOf(err), err)
		return
	}
	c.render(w, r, http.StatusOK, "keys", rq.view("Held keys", "keys", keysData{Queue: q, Keys: keys, Limit: keysPerPage, Scan: heldKeysScan}), rq.start)
}

type rowsData struct {
	Queue, State, Key string
	// Type, Older and Newer are the message type and age filters, as the
	// URL holds them; Filtered says one is set, and Scan how many rows a
	// filtered page reads at most.
	Type, Older, Newer string
	Filtered           bool
	Scan               int64
	OlderChoices       []struct{ Value, Label string }
	NewerChoices       []struct{ Value, Label string }
	Newest             bool
	States             []string
	Rows               []outbox.RowSummary
	Next               string
	Link               func(int64) string
}

// Ages the rows page's filters offer: published over (older) or within
// (newer) a time ago.
var (
	rowsOlderChoices = []struct{ Value, Label string }{
		{"", "any time"}, {"5m", "over 5 minutes ago"}, {"1h", "over an hour ago"}, {"24h", "over a day ago"},
	}
	rowsNewerChoices = []struct{ Value, Label string }{
		{"", "any time"}, {"5m", "in the last 5 minutes"}, {"1h", "in the last hour"}, {"24h", "in the last day"},
	}
)

// age parses an age filter of the URL (the rows page's, the dead
// letters'): "" is none.
func age(field, s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, &outbox.InputError{Field: field, Rule: "must be a duration such as 1h"}
	}
	return d, nil
}

// rowsPerPage is how many rows the rows page lists.
const rowsPerPage = 50

// rowsPage lists a queue's rows in one state, or a key's rows
// (outbox.Rows), a page at a time; every filter is in the URL.
func (c *Console) rowsPage(w http.ResponseWriter, r *http.Request, rq *request) {
	v := r.URL.Query()
	d := rowsData{Queue: v.Get("q"), State: cmp.Or(v.Get("state"), outbox.RowReady), Key: v.Get("key"), Newest: v.Get("order") == "newest",
		States: []string{outbox.RowReady, outbox.RowScheduled, outbox.RowRetrying, outbox.RowLeased, outbox.RowExpired},
		Link:   func(id int64) string { return rq.base + "/row?id=" + strconv.FormatInt(id, 10) }}
	if d.Queue == "" {
		c.fail(w, r, rq, http.StatusBadRequest, errors.New("name a queue: ?q=name"))
		return
	}
	d.Type, d.Older, d.Newer, d.Scan = v.Get("type"), v.Get("older"), v.Get("newer"), outbox.RowsScan
	d.OlderChoices, d.NewerChoices = rowsOlderChoices, rowsNewerChoices
	q := outbox.RowQuery{Queue: d.Queue, State: d.State, Key: d.Key, MessageType: d.Type, Newest: d.Newest, Limit: rowsPerPage}
	var err error
	if q.OlderThan, err = age("older", d.Older); err == nil {
		q.NewerThan, err = age("newer", d.Newer)
	}
	if s := v.Get("after"); s != "" && err == nil {
		q.After, err = outbox.ParseRowCursor("after", s)
	}
	if err != nil {
		c.fail(w, r, rq, http.StatusBadRequest, err)
		return
	}
	d.Filtered = q.Filtered()
	rows, next, err := rq.ob.Rows(r.Context(), q)
	if err != nil {
		c.fail(w, r, rq, statusOf(err), err)
		return
	}
	d.Rows = rows
	if next != nil {
		nv := maps.Clone(v)
		nv.Set("after", next.String())
		d.Next = rq.base + "/rows?" + nv.Encode()
	}
	title := fmt.Sprintf("Rows of %s", d.Queue)
	c.render(w, r, http.StatusOK, "rows", rq.view(title, "queues", d), rq.start)
}

// deadPerPage is how many dead letters a page lists.
const deadPerPage = 50

// olderChoices are the ages the dead-letter filter offers.
var olderChoices = []struct{ Value, Label string }{
	{"", "any time"}, {"1h", "over an hour ago"}, {"24h", "over a day ago"}, {"168h", "over a week ago"},
}

// reasons are the dead-letter reasons the filter offers.
var reasons = []string{outbox.ReasonMaxDeliveries, outbox.ReasonRetryExhausted, outbox.ReasonRejected, outbox.ReasonDecodeError}

// deadPreviewChars is how many characters of each payload the dead-letter
// list shows.
const deadPreviewChars = 80

type deadData struct {
	Filter filterForm
	// Causes group the newest deadCauseSample dead letters (of the
	// filter's queue) by why they failed, on the first page; Sampled is
	// how many they grouped.
	Causes  []causeRow
	Sampled int64
	// Contains is the search within the sample's last errors (error=),
	// and SampleSize how many of the newest dead letters it searches.
	Contains   string
	SampleSize int64
	// Search is the rest of the page's filter, for the search's form.
	Search  [][2]string
	Rows    []outbox.DeadLetter
	Next    string
	Older   []struct{ Value, Label string }
	Reasons []string
	Queues  []string
	Link    func(int64) string
}

// causeRow is a cause of dead letters, with the links to its rows and to
// its newest dead letter.
type causeRow struct {
	outbox.DeadLetterCause
	Rows, Newest string
}

// deadCauseSample and deadCauses bound the dead letters page's causes:
// the newest 2,000 dead letters, the 10 largest groups.
const (
	deadCauseSample = 2000
	deadCauses      = 10
)

// filterForm is a dead-letter filter as its form fields hold it.
type filterForm struct {
	Queue, Reason, Older string
	// Cause is the cause a group of "Why they failed" links, when
	// HasCause ("" is the dead letters without a last error); Uncaused
	// links the same filter without it.
	Cause    string
	HasCause bool
	Uncaused string
	IDs      []int64
}

// filter parses the form fields of a dead-letter filter.
func parseFilter(v url.Values) (filterForm, outbox.DeadLetterFilter, error) {
	ff := filterForm{Queue: v.Get("q"), Reason: v.Get("reason"), Older: v.Get("older"), Cause: v.Get("cause"), HasCause: v.Has("cause")}
	f := outbox.DeadLetterFilter{Queue: ff.Queue, Reason: ff.Reason}
	if ff.HasCause {
		f.Cause = &ff.Cause
		u := url.Values{}
		for _, k := range []string{"q", "reason", "older"} {
			if x := v.Get(k); x != "" {
				u.Set(k, x)
			}
		}
		ff.Uncaused = "?" + u.Encode()
	}
	var err error
	if f.OlderThan, err = age("older", ff.Older); err != nil {
		return ff, f, err
	}
	for _, s := range v["id"] {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return ff, f, &outbox.InputError{Field: "id", Rule: "must be a whole number"}
		}
		ff.IDs = append(ff.IDs, id)
	}
	f.IDs = ff.IDs
	return ff, f, nil
}

func (c *Console) deadPage(w http.ResponseWriter, r *http.Request, rq *request) {
	ff, f, err := parseFilter(r.URL.Query())
	if err != nil {
		c.fail(w, r, rq, http.StatusBadRequest, err)
		return
	}
	before := int64(math.MaxInt64)
	if s := r.URL.Query().Get("before"); s != "" {
		if before, err = strconv.ParseInt(s, 10, 64); err != nil {
			c.fail(w, r, rq, http.StatusBadRequest, &outbox.InputError{Field: "before", Rule: "must be a whole number"})
			return
		}
	}
	// The page shows a payload's first deadPreviewChars characters: the
	// database sends no more than they can take.
	rows, err := rq.ob.NewestDeadLetterPreviews(r.Context(), f, before, deadPerPage+1, previewBytes(deadPreviewChars))
	if err != nil {
		c.fail(w, r, rq, statusOf(err), err)
		return
	}
	d := deadData{Filter: ff, Older: olderChoices, Reasons: reasons,
		Link: func(id int64) string { return rq.base + "/dead/" + strconv.FormatInt(id, 10) }}
	if len(rows) > deadPerPage {
		rows = rows[:deadPerPage]
		next := r.URL.Query()
		next.Set("before", strconv.FormatInt(rows[len(rows)-1].ID, 10))
		d.Next = rq.base + "/dead?" + next.Encode()
	}
	d.Rows = rows
	if r.URL.Query().Get("before") == "" {
		d.Contains, d.SampleSize = r.URL.Query().Get("error"), deadCauseSample
		for _, k := range []string{"q", "reason", "cause", "older"} {
			if r.URL.Query().Has(k) { // an empty cause is one: no last error
				d.Search = append(d.Search, [2]string{k, r.URL.Query().Get(k)})
			}
		}
		causes, sampled, err := rq.ob.DeadLetterCauses(r.Context(), &outbox.DeadLetterCauseOptions{Queue: ff.Queue, Sample: deadCauseSample,
			Limit: deadCauses, Contains: d.Contains})
		if err != nil {
			c.fail(w, r, rq, statusOf(err), err)
			return
		}
		d.Sampled = sampled
		for _, cs := range causes {
			q := url.Values{"q": {cs.Queue}, "reason": {cs.Reason}, "cause": {cs.Cause}}
			d.Causes = append(d.Causes, causeRow{DeadLetterCause: cs, Rows: rq.base + "/dead?" + q.Encode(), Newest: d.Link(cs.NewestID)})
		}
	}
	queues := map[string]bool{}
	for _, row := range rows {
		queues[row.Queue] = true
	}
	d.Queues = slices.Sorted(maps.Keys(queues))
	c.render(w, r, http.StatusOK, "dead", rq.view("Dead letters", "dead", d), rq.start)
}

// message is a row's payload and headers as a page shows them.
type message struct {
	Payload payloadView
	Headers [][2]string
	// Raw holds headers that are not an object of strings, as stored.
	Raw string
}

func messageOf(payload []byte, headers map[string]string, raw []byte) message {
	return message{Payload: formatPayload(payload), Headers: sortedHeaders(headers), Raw: string(raw)}
}

type deadLetterData struct {
	DL      outbox.DeadLetter
	Message message
	// QueueLink links the queue's page.
	QueueLink string
	// FirstFailed is when it first failed: when an earlier replay of it
	// recorded that in a header, that time, else its FailedAt.
	FirstFailed string
}

func (c *Console) deadLetterPage(w http.ResponseWriter, r *http.Request, rq *request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		c.fail(w, r, rq, http.StatusBadRequest, &outbox.InputError{Field: "id", Rule: "must be a whole number"})
		return
	}
	dl, ok, err := rq.ob.DeadLetter(r.Context(), id)
	if err != nil {
		c.fail(w, r, rq, statusOf(err), err)
		return
	}
	if !ok {
		c.fail(w, r, rq, http.StatusNotFound, errors.New("the dead-letter table holds no row "+strconv.FormatInt(id, 10)+
			" (it may have been replayed or deleted)"))
		return
	}
	d := deadLetterData{DL: dl, Message: messageOf(dl.Payload, dl.Headers, dl.RawHeaders),
		QueueLink: rq.base + "/queue?q=" + url.QueryEscape(dl.Queue), FirstFailed: stamp(dl.FailedAt)}
	if t, err := time.Parse(time.RFC3339Nano, dl.Headers[outbox.HeaderFirstFailedAt]); err == nil {
		d.FirstFailed = stamp(t)
	}
	c.render(w, r, http.StatusOK, "deadletter", rq.view("Dead letter "+strconv.FormatInt(id, 10), "dead", d), rq.start)
}

func sortedHeaders(h map[string]string) [][2]string {
	out := make([][2]string, 0, len(h))
	for _, k := range slices.Sorted(maps.Keys(h)) {
		out = append(out, [2]string{k, h[k]})
	}
	return out
}

type rowData struct {
	ID, Queue, Timer string
	Asked            bool
	Found            bool
	Row              outbox.Row
	Message          message
	// DeadLink links the dead letter of the id asked for, when the
	// dead-letter table holds it.
	DeadLink string
}

func (c *Console) rowPage(w http.ResponseWriter, r *http.Request, rq *request) {
	qv := r.URL.Query()
	d := rowData{ID: strings.TrimSpace(qv.Get("id")), Queue: qv.Get("q"), Timer: qv.Get("timer")}
	var err error
	switch {
	case d.ID != "":
		d.Asked = true
		id, perr := strconv.ParseInt(d.ID, 10, 64)
		if perr != nil {
			c.fail(w, r, rq, http.StatusBadRequest, &outbox.InputError{Field: "id", Rule: "must be a whole number"})
			return
		}
		if d.Row, d.Found, err = rq.ob.Row(r.Context(), id); err == nil && !d.Found {
			var dead bool
			if _, dead, err = rq.ob.DeadLetter(r.Context(), id); dead {
				d.DeadLink = rq.base + "/dead/" + strconv.FormatInt(id, 10)
			}
		}
	case d.Timer != "":
		d.Asked = true
		d.Row, d.Found, err = rq.ob.RowByTimer(r.Context(), d.Queue, d.Timer)
	}
	if err != nil {
		c.fail(w, r, rq, statusOf(err), err)
		return
	}
	if d.Found {
		d.Message = messageOf(d.Row.Payload, d.Row.Headers, d.Row.RawHeaders)
	}
	c.render(w, r, http.StatusOK, "row", rq.view("Find a row", "row", d), rq.start)
}

type healthData struct {
	H outbox.Health
}

func (c *Console) healthPage(w http.ResponseWriter, r *http.Request, rq *request) {
	h, err := rq.ob.Health(r.Context(), nil)
	if err != nil {
		c.fail(w, r, rq, statusOf(err), err)
		return
	}
	c.render(w, r, http.StatusOK, "health", rq.view("Health", "health", healthData{H: h}), rq.start)
}
