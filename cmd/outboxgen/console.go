package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/outboxgen/outboxgen/console"
	"github.com/outboxgen/outboxgen/outbox"
)

const consoleUsage = `usage: outboxgen console [-listen ADDR] [-actions] [-user NAME] [-allow-host NAME] [-dsn DSN]

Serves the web console: the outboxes in the database, each queue's depth
with a chart, held ordering keys, dead letters, a row by id or timer id,
and health. It reads only, unless -actions enables replaying and
deleting dead letters, cancelling timers, and pausing and resuming
queues (each a form in three steps:
count, dry run, confirm; each logged to stderr with who asked, through
which host and from which origin; every refused request is logged too).

It shows every outbox in the database; -schema and -table (or
$OUTBOX_SCHEMA and $OUTBOX_TABLE) name the one whose page it prints the
address of.

It listens on loopback unless told otherwise. On any other address it
needs -user, and the password in $OUTBOXGEN_CONSOLE_PASSWORD: browsers
then ask for them (HTTP basic authentication; put TLS in front of it).

Without -user it answers only requests for a loopback host (localhost,
*.localhost, 127.0.0.0/8, [::1], any port), so that a web page cannot
reach it by pointing a name of its own at 127.0.0.1 (DNS rebinding).
-allow-host adds a name it is reached by, such as a reverse proxy's
(which must pass the Host header through). With -user it answers any
host, unless -allow-host names some: then those and loopback ones.

Example:
  outboxgen console -listen 127.0.0.1:8080
  OUTBOXGEN_CONSOLE_PASSWORD=s3cret outboxgen console -listen :8080 -user ops -actions
  outboxgen console -allow-host console.internal.example.com
`

// consoleShutdown bounds how long the console waits for requests in
// flight when it stops.
const consoleShutdown = 5 * time.Second

func consoleCmd(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := newFlags("console", consoleUsage, stderr)
	conn := connFlags(fs)
	listen := fs.String("listen", "127.0.0.1:8080", "address to listen on (host:port)")
	actions := fs.Bool("actions", false, "enable replaying and deleting dead letters, cancelling timers, and pausing and resuming queues")
	user := fs.String("user", "", "user name of HTTP basic authentication (password: $OUTBOXGEN_CONSOLE_PASSWORD)")
	var allowHosts []string
	fs.Func("allow-host", "a host `NAME` to answer besides loopback ones, without scheme or port (repeat it, or separate names with commas)", func(v string) error {
		for h := range strings.SplitSeq(v, ",") {
			if h = strings.TrimSpace(h); h != "" {
				allowHosts = append(allowHosts, h)
			}
		}
		return nil
	})
	pos, err := parseFlags(fs, args, "console")
	if err != nil {
		return err
	}
	if err := noArgs(pos, "console"); err != nil {
		return err
	}
	password := getenv("OUTBOXGEN_CONSOLE_PASSWORD")
	switch {
	case *user != "" && password == "":
		return fmt.Errorf("%w: console: -user needs the password in $OUTBOXGEN_CONSOLE_PASSWORD", errUsage)
	case *user == "" && password != "":
		return fmt.Errorf("%w: console: $OUTBOXGEN_CONSOLE_PASSWORD is set: pass -user too", errUsage)
	}
	loopback, err := isLoopback(*listen)
	if err != nil {
		return fmt.Errorf("%w: console: -listen %q: %v", errUsage, *listen, err)
	}
	if !loopback && *user == "" {
		return fmt.Errorf("%w: console: -listen %s is reachable from other machines: pass -user and set $OUTBOXGEN_CONSOLE_PASSWORD, or listen on 127.0.0.1", errUsage, *listen)
	}
	t, err := conn.open(ctx, "console", getenv)
	if err != nil {
		return err
	}
	defer t.close()
	// A login keeps a rebinding page out (a browser sends the login only
	// to the name it was given for): with -user, any host unless
	// -allow-host narrows it.
	if *user != "" && len(allowHosts) == 0 {
		allowHosts = []string{console.AnyHost}
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	c, err := console.New(console.Config{Pool: t.pool, Actions: *actions, Logger: log, AllowedHosts: allowHosts})
	if err != nil {
		var ce *outbox.ConfigError
		if errors.As(err, &ce) && ce.Field == "Config.AllowedHosts" {
			return fmt.Errorf("%w: console: -allow-host %q: %s", errUsage, ce.Value, ce.Rule)
		}
		return err
	}
	var h http.Handler = c
	if *user != "" {
		h = console.BasicAuth(*user, password, c)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      time.Minute,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	mode := "read-only"
	if *actions {
		mode = "actions enabled"
	}
	fmt.Fprintf(stdout, "outboxgen console on http://%s/ (%s, database %s)\n", ln.Addr(), mode, t.db)
	schema, table := conn.resolve(getenv)
	fmt.Fprintf(stdout, "outbox %s.%s: http://%s/o/%s/%s/\n", schema, table, ln.Addr(), url.PathEscape(schema), url.PathEscape(table))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("console: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), consoleShutdown)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("console: %w", err)
	}
	return nil
}

// isLoopback reports whether addr (host:port) listens on loopback only.
// An empty host listens on every interface.
func isLoopback(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, err
	}
	if host == "localhost" {
		return true, nil
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
}
