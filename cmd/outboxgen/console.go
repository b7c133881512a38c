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
	"time"

	"github.com/outboxgen/outboxgen/console"
)

const consoleUsage = `usage: outboxgen console [-listen ADDR] [-actions] [-user NAME] [-dsn DSN]

Serves the web console: the outboxes in the database, each queue's depth
with a chart, held ordering keys, dead letters, a row by id or timer id,
and health. It reads only, unless -actions enables replaying and
deleting dead letters and cancelling timers (each a form in three steps:
count, dry run, confirm; each logged to stderr with who asked).

It shows every outbox in the database; -schema and -table (or
$OUTBOX_SCHEMA and $OUTBOX_TABLE) name the one whose page it prints the
address of.

It listens on loopback unless told otherwise. On any other address it
needs -user, and the password in $OUTBOXGEN_CONSOLE_PASSWORD: browsers
then ask for them (HTTP basic authentication; put TLS in front of it).

Example:
  outboxgen console -listen 127.0.0.1:8080
  OUTBOXGEN_CONSOLE_PASSWORD=s3cret outboxgen console -listen :8080 -user ops -actions
`

// consoleShutdown bounds how long the console waits for requests in
// flight when it stops.
const consoleShutdown = 5 * time.Second

func consoleCmd(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := newFlags("console", consoleUsage, stderr)
	conn := connFlags(fs)
	listen := fs.String("listen", "127.0.0.1:8080", "address to listen on (host:port)")
	actions := fs.Bool("actions", false, "enable replaying and deleting dead letters and cancelling timers")
	user := fs.String("user", "", "user name of HTTP basic authentication (password: $OUTBOXGEN_CONSOLE_PASSWORD)")
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
	log := slog.New(slog.NewTextHandler(stderr, nil))
	c, err := console.New(console.Config{Pool: t.pool, Actions: *actions, Logger: log})
	if err != nil {
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
