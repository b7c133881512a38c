// Package console is a web console for operators of outboxes: the
// outboxes a database holds, each queue's depth with a chart of it over
// time, the ordering keys held back by their head, the dead letters (to
// filter, page through, open, and, when enabled, replay or delete), one
// row by id or timer id, and the outbox's health.
//
// [New] returns an [http.Handler]: mount it in a service behind the
// service's own authentication, or run it with `outboxgen console`. Pages
// are rendered on the server with html/template; every value that came
// from the database (payloads, headers, queue names, keys, error texts)
// is escaped, and the pages forbid inline script.
//
// Every read the console makes is bounded by an index and a limit, so a
// page costs about the same on an outbox of a thousand rows and of
// millions: counts stop at a cap and say so, and lists are pages of a
// fixed size walked along an index.
//
// The console answers only requests that name a loopback host (localhost,
// 127.0.0.1, [::1]) unless [Config.AllowedHosts] names others: a web page
// that made a browser resolve its own name to the console's address (DNS
// rebinding) is refused, reads as well as actions.
//
// Actions (replaying dead letters, deleting them, cancelling a timer,
// pausing and resuming a queue, retrying, cancelling or dead-lettering a
// row) are off unless [Config.Actions] is set. Each is a POST carrying a
// token from the console's own page (a cookie, signed with a key of the
// console's own, that the page's form must repeat) from the console's own
// origin, goes through a count, a dry run and a confirmation, and is
// logged with who asked for it, through which host and from which origin,
// and what it did. Every refused request is logged as well.
package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/outbox"
)

// Config configures the console.
type Config struct {
	// Pool is the database the console reads. Required. The console
	// discovers the outboxes in it; its role needs to read them (and, for
	// actions, to write the dead-letter and outbox tables).
	Pool *pgxpool.Pool

	// Actions enables replaying and deleting dead letters, cancelling
	// timers, pausing and resuming queues, and retrying, cancelling and
	// dead-lettering rows. Default false: the console only reads.
	Actions bool

	// Path is the URL path the handler is mounted at, without a trailing
	// slash ("" for the root): the console builds its links with it. Mount
	// the handler with http.StripPrefix(Path, h).
	Path string

	// AllowedHosts are the host names (or IP addresses), besides loopback
	// ones, that the console answers: a request whose Host header names
	// another is refused with 421 Misdirected Request (and an action
	// whose Origin is not its Host, with 403). Default none: only localhost,
	// names under .localhost, 127.0.0.0/8 and ::1, with any port. Name
	// the host without a scheme or a port ("console.example.com"); it is
	// matched case-insensitively with any port. [AnyHost] ("*") answers
	// every host: use it only behind a login (a service's own
	// authentication, or [BasicAuth]), which a page that rebound its
	// name to the console's address does not have.
	AllowedHosts []string

	// TokenKey signs the tokens the action forms carry, at least
	// TokenKeyMinSize (32) bytes of a secret. Default: a key drawn at
	// New, so that a form is accepted only by the console that rendered
	// it. Replicas behind one load balancer share one key, so that a form
	// rendered by one is accepted by another; keep it as secret as a
	// password (whoever has it can forge a token, though not a browser's
	// cookie on the console's origin).
	TokenKey []byte

	// User names who made a request, for the action log. Default: the
	// basic-auth user name when the request carries one, else
	// "unauthenticated loopback" when it comes from a loopback address,
	// else its remote address.
	User func(*http.Request) string

	// Logger receives one record per action (who, from which address,
	// through which Host, from which Origin, what, on which outbox, the
	// ids a selection named, and the outcome) and one per refused request
	// (the same attribution, and why). Default slog.Default().
	Logger *slog.Logger

	// Refresh is how often the outbox and queue pages reload their
	// counts while they are visible. Default 5 seconds; negative turns
	// auto-refresh off.
	Refresh time.Duration

	// History is how many depth samples each outbox's chart keeps. The
	// console takes a sample when a page shows the depths, at most one per
	// Refresh. Default 720 (an hour at 5 seconds).
	History int

	// Timeout bounds each request's reads and actions: past it, the
	// page shows the error. Default 30 seconds.
	Timeout time.Duration

	// DepthCap is where each count stops ([outbox.DepthOptions.Cap]).
	// Default DepthCapDefault.
	DepthCap int64
}

// DepthCapDefault is the default [Config.DepthCap]: each count the
// Queues and Queue pages show stops at 5,000. A page reads at most that
// many index entries per count and the first that many keyed rows of each
// queue, about 40 ms on an outbox of 1,000,000 rows on a 2-core machine
// (70 ms at outbox.DepthCapDefault, 10,000).
const DepthCapDefault = 5_000

// Console is the console's http.Handler.
type Console struct {
	cfg   Config
	mux   *http.ServeMux
	pages map[string]*template.Template
	// probe is an outbox of the default name, through which the console
	// lists the outboxes in the database.
	probe *outbox.Outbox

	hosts hostRule
	// tokenKey signs the forms' tokens: Config.TokenKey, else drawn at
	// New, so that a token is this console's only.
	tokenKey    []byte
	crossOrigin *http.CrossOriginProtection
	// actionStep, when positive, replaces half of Config.Timeout as how
	// long one request of a large action works (tests set it).
	actionStep time.Duration

	mu       sync.Mutex
	outboxes map[outbox.OutboxName]*outboxState
	listed   []outbox.OutboxName
	listedAt time.Time
}

// outboxState is what the console keeps of one outbox.
type outboxState struct {
	ob      *outbox.Outbox
	history *history
}

// maxOutboxes bounds the outboxes the console keeps state for.
const maxOutboxes = 256

// listTTL is how long the list of outboxes is reused before it is read
// again.
const listTTL = 30 * time.Second

// New returns a console for cfg.
func New(cfg Config) (*Console, error) {
	if cfg.Pool == nil {
		return nil, &outbox.ConfigError{Field: "Config.Pool", Value: "<nil>", Rule: "must not be nil"}
	}
	if cfg.Path != "" && (!strings.HasPrefix(cfg.Path, "/") || strings.HasSuffix(cfg.Path, "/")) {
		return nil, &outbox.ConfigError{Field: "Config.Path", Value: cfg.Path,
			Rule: `must start with "/" and not end with one (or be empty)`}
	}
	if cfg.History < 0 || cfg.DepthCap < 0 || cfg.Timeout < 0 {
		return nil, &outbox.ConfigError{Field: "Config.History/DepthCap/Timeout",
			Value: fmt.Sprint(cfg.History, cfg.DepthCap, cfg.Timeout), Rule: "must not be negative"}
	}
	hosts, err := newHostRule(cfg.AllowedHosts)
	if err != nil {
		return nil, err
	}
	if cfg.TokenKey != nil && len(cfg.TokenKey) < TokenKeyMinSize {
		return nil, &outbox.ConfigError{Field: "Config.TokenKey", Value: fmt.Sprintf("%d bytes", len(cfg.TokenKey)),
			Rule: fmt.Sprintf("must hold at least %d bytes of a secret, or be nil for a key drawn at New", TokenKeyMinSize)}
	}
	tokenKey := cfg.TokenKey
	if tokenKey == nil {
		tokenKey = newTokenKey()
	}
	if cfg.User == nil {
		cfg.User = defaultUser
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	cfg.Refresh = cmp.Or(cfg.Refresh, 5*time.Second)
	cfg.History = cmp.Or(cfg.History, 720)
	cfg.DepthCap = cmp.Or(cfg.DepthCap, DepthCapDefault)
	cfg.Timeout = cmp.Or(cfg.Timeout, 30*time.Second)
	probe, err := outbox.New(cfg.Pool, nil)
	if err != nil {
		return nil, err
	}
	pages, err := parsePages(cfg.Path)
	if err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, pages: pages, probe: probe, outboxes: map[outbox.OutboxName]*outboxState{},
		hosts: hosts, tokenKey: tokenKey, crossOrigin: http.NewCrossOriginProtection()}
	c.routes()
	return c, nil
}

// ServeHTTP serves the console's pages.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "+
		"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	// same-origin, not no-referrer: under no-referrer a browser sends
	// the console's own forms with Origin: null, which checkOrigin
	// refuses. Other sites still get neither the URL nor the origin.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cache-Control", "no-store")
	if err := c.checkHost(r); err != nil {
		c.refuse(w, r, nil, http.StatusMisdirectedRequest, refusedHost, err)
		return
	}
	if err := c.checkOrigin(r); err != nil {
		c.refuse(w, r, nil, http.StatusForbidden, refusedOrigin, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), c.cfg.Timeout)
	defer cancel()
	c.mux.ServeHTTP(w, r.WithContext(ctx))
}

func (c *Console) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", c.overview)
	m.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(staticFS)))
	m.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	o := "/o/{schema}/{table}"
	m.HandleFunc("GET "+o+"/{$}", c.withOutbox(c.outboxPage))
	m.HandleFunc("GET "+o+"/queue", c.withOutbox(c.queuePage))
	m.HandleFunc("GET "+o+"/keys", c.withOutbox(c.keysPage))
	m.HandleFunc("GET "+o+"/rows", c.withOutbox(c.rowsPage))
	m.HandleFunc("GET "+o+"/dead", c.withOutbox(c.deadPage))
	m.HandleFunc("GET "+o+"/dead/{id}", c.withOutbox(c.deadLetterPage))
	m.HandleFunc("GET "+o+"/row", c.withOutbox(c.rowPage))
	m.HandleFunc("GET "+o+"/health", c.withOutbox(c.healthPage))
	m.HandleFunc("POST "+o+"/dead/replay", c.withOutbox(c.action(replayDeadLetters)))
	m.HandleFunc("POST "+o+"/dead/delete", c.withOutbox(c.action(deleteDeadLetters)))
	m.HandleFunc("POST "+o+"/timer/cancel", c.withOutbox(c.action(cancelTimer)))
	m.HandleFunc("POST "+o+"/queue/pause", c.withOutbox(c.action(pauseQueue)))
	m.HandleFunc("POST "+o+"/queue/resume", c.withOutbox(c.action(resumeQueue)))
	m.HandleFunc("POST "+o+"/row/retry", c.withOutbox(c.action(retryRow)))
	m.HandleFunc("POST "+o+"/row/cancel", c.withOutbox(c.action(cancelRow)))
	m.HandleFunc("POST "+o+"/row/dead-letter", c.withOutbox(c.action(deadLetterRow)))
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, nil, http.StatusNotFound, errors.New("no such page"))
	})
	c.mux = m
}

// list returns the outboxes in the database, read at most once per listTTL.
func (c *Console) list(ctx context.Context) ([]outbox.OutboxName, error) {
	c.mu.Lock()
	if c.listed != nil && time.Since(c.listedAt) < listTTL {
		defer c.mu.Unlock()
		return c.listed, nil
	}
	c.mu.Unlock()
	names, err := c.probe.Outboxes(ctx)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.listed, c.listedAt = names, time.Now()
	return names, nil
}

// state returns the console's state for the named outbox, which must be
// one the database holds.
func (c *Console) state(ctx context.Context, name outbox.OutboxName) (*outboxState, error) {
	c.mu.Lock()
	s, ok := c.outboxes[name]
	c.mu.Unlock()
	if ok {
		return s, nil
	}
	names, err := c.list(ctx)
	if err != nil {
		return nil, err
	}
	found := false
	for _, n := range names {
		found = found || n == name
	}
	if !found {
		c.mu.Lock()
		c.listed = nil // read again: it may have been created since
		c.mu.Unlock()
		return nil, errNoOutbox{name}
	}
	ob, err := outbox.New(c.cfg.Pool, &outbox.Config{Schema: name.Schema, Table: name.Table})
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.outboxes[name]; ok {
		return s, nil
	}
	if len(c.outboxes) >= maxOutboxes {
		for k := range c.outboxes {
			delete(c.outboxes, k)
			break
		}
	}
	s = &outboxState{ob: ob, history: newHistory(c.cfg.History)}
	c.outboxes[name] = s
	return s, nil
}

type errNoOutbox struct{ name outbox.OutboxName }

func (e errNoOutbox) Error() string {
	return fmt.Sprintf("the database holds no outbox %s", e.name)
}

// request is what a page handler gets: the outbox it is about, and its
// links.
type request struct {
	name  outbox.OutboxName
	st    *outboxState
	ob    *outbox.Outbox
	base  string // the outbox's URL path, without a trailing slash
	csrf  string
	start time.Time
	// read is the depths the page read, at readAt.
	read   []outbox.QueueDepth
	readAt time.Time
}

func (c *Console) withOutbox(page func(http.ResponseWriter, *http.Request, *request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name := outbox.OutboxName{Schema: r.PathValue("schema"), Table: r.PathValue("table")}
		st, err := c.state(r.Context(), name)
		if err != nil {
			var no errNoOutbox
			status := http.StatusInternalServerError
			if errors.As(err, &no) {
				status = http.StatusNotFound
			}
			c.fail(w, r, nil, status, err)
			return
		}
		page(w, r, &request{
			name: name, st: st, ob: st.ob, base: c.outboxPath(name),
			csrf: c.csrfToken(w, r), start: time.Now(),
		})
	}
}

// outboxPath is the URL path of an outbox's pages.
func (c *Console) outboxPath(n outbox.OutboxName) string {
	return c.cfg.Path + "/o/" + url.PathEscape(n.Schema) + "/" + url.PathEscape(n.Table)
}
