// Command outboxgen manages outbox tables from the command line and from
// go generate.
//
// Usage:
//
//	outboxgen migrate up|down|down-to N|reset|status [-yes] [-lock-timeout D] [-lock-retry-for D]
//	    [-dsn DSN] [-schema S] [-table T]
//	outboxgen migrations -dir DIR [-schema S] [-table T] [-check]
//	outboxgen inspect [-queue Q] [-json] [-dsn DSN] [-schema S] [-table T]
//	outboxgen health [-listen-dsn DSN] [-notify-timeout D] [-json] [-dsn DSN] [-schema S] [-table T]
//	outboxgen dlq list|show ID|replay|purge [-queue Q] [-reason R] [-older-than D] [-limit N] [-after ID]
//	    [-drop-timer-ids] [-dry-run] [-yes] [-json] [-dsn DSN] [-schema S] [-table T]
//	outboxgen queue pause Q [-reason TEXT] | resume Q | paused [-json] [-dsn DSN] [-schema S] [-table T]
//	outboxgen subscribers [-json] [-dsn DSN] [-schema S] [-table T]
//	outboxgen rows -queue Q [-state S | -key K] [-newest] [-limit N] [-after CURSOR] [-json] [-dsn DSN] [-schema S] [-table T]
//	outboxgen row show|retry|cancel|dead-letter ID [-note TEXT] [-yes] [-json] [-dsn DSN] [-schema S] [-table T]
//	outboxgen grants [-publisher ROLE] [-subscriber ROLE] [-apply] [-dsn DSN] [-schema S] [-table T]
//	outboxgen bind [-dir DIR] [-out FILE] [-asyncapi FILE] [-format yaml|json]
//	outboxgen console [-listen ADDR] [-actions] [-user NAME] [-allow-host NAME] [-dsn DSN]
//
// Flags may come before, between or after a command's arguments:
// "migrate -schema s up" and "migrate up -schema s" are the same.
//
// migrate applies, rolls back (one step, as in goose; to 0 or dropping
// rows only with -yes) or lists the outbox's embedded migrations against
// DATABASE_URL (or -dsn, or PostgreSQL's client defaults); each step
// waits at most -lock-timeout for a lock and is retried for up to
// -lock-retry-for, printing what held the lock. migrations writes them,
// rendered for the schema and table, into a repository's goose
// migrations directory.
// inspect shows each queue's state; health checks the conditions that
// break PostgreSQL queues and exits with status 1 when it finds one.
// queue pauses and resumes a queue's subscribers; subscribers lists the
// running subscribers of every process; rows lists a queue's rows by
// state, and row shows one row or acts on it.
// grants prints, or runs, what a publishing and a subscribing role must
// be granted. bind
// writes typed constructors and an AsyncAPI document for the types
// annotated //outbox:message queue=NAME [type=TYPENAME]; type= also
// generates the type's OutboxMessageType method. console serves the web
// console (package console) on loopback, read-only unless -actions; on
// another address it needs -user and $OUTBOXGEN_CONSOLE_PASSWORD; without
// -user it answers only loopback host names and those -allow-host adds. Exit status is 2 for a
// usage error and 1 when the command fails.
//
// Environment (a flag wins over its variable):
//
//	DATABASE_URL   database of migrate, inspect, health, dlq, queue, subscribers, rows, row, console,
//	               rebase and grants -apply (-dsn);
//	               when unset, PostgreSQL's client defaults (PGHOST, PGPORT,
//	               PGDATABASE, PGUSER, PGPASSWORD, ...), as psql uses them
//	OUTBOX_SCHEMA  schema of the outbox tables, default public (-schema)
//	OUTBOX_TABLE   name of the outbox table, default outbox (-table)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// errUsage marks an error the user can fix by changing the command line.
var errUsage = errors.New("usage error")

// errHelp reports that a command printed its help: exit 0, nothing more.
var errHelp = errors.New("help printed")

// newFlags returns the flag set of cmd; its usage text is usage followed
// by the flags.
func newFlags(cmd, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args into fs and returns the positional arguments.
// Flags may come before, between and after them ("migrate -schema s up"
// and "migrate up -schema s" are the same), and "--" ends the flags. It
// returns errHelp after -h, a usage error naming cmd for anything it
// cannot parse.
func parseFlags(fs *flag.FlagSet, args []string, cmd string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, errHelp
			}
			return nil, fmt.Errorf("%w: %s: %v", errUsage, cmd, err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if len(rest) < len(args) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// noArgs rejects positional arguments.
func noArgs(pos []string, cmd string) error {
	if len(pos) > 0 {
		return fmt.Errorf("%w: %s: unexpected arguments %q", errUsage, cmd, pos)
	}
	return nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// run executes one command line and returns the process's exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	err := dispatch(ctx, args, stdout, stderr, getenv)
	switch {
	case err == nil, errors.Is(err, errHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintln(stderr, "outboxgen:", err)
		return 2
	default:
		fmt.Fprintln(stderr, "outboxgen:", err)
		return 1
	}
}

const usage = `outboxgen manages transactional outbox tables.

Commands:
  migrate      apply, roll back or list the outbox migrations (up, down, down-to N, reset, status)
  migrations   write the outbox's goose migrations into a repository's directory
  inspect      show each queue's depth, leases, age, dead letters and held ordering keys
  health       check NOTIFY, the notification queue, what holds back vacuum, dead rows and the schema version
  dlq          list, show, replay or purge dead-lettered rows
  queue        pause or resume a queue, or list the paused ones
  subscribers  the running subscribers, in every process: queues, state, busy workers, last claim
  rows         a queue's rows by state, or a key's rows, a page at a time
  row          one row by id: show it, retry it now, cancel it or move it to the dead letters
  grants       print (or -apply) the GRANT statements of a publishing and a subscribing role
  bind         generate typed bindings and an AsyncAPI document (for go:generate)
  console      serve the web console: queues, held keys, dead letters, rows, health
  rebase       make the ring of an outbox restored from a dump readable (-yes)

Flags may come before or after a command's arguments. Run
"outboxgen COMMAND -h" for a command's flags and an example.

Environment (a flag wins over its variable):
  DATABASE_URL   database of migrate, inspect, health, dlq, queue, subscribers, rows, row, console, rebase and grants -apply (-dsn);
                 when unset, PostgreSQL's client defaults (PGHOST, PGPORT,
                 PGDATABASE, PGUSER, PGPASSWORD, ...), as psql uses them
  OUTBOX_SCHEMA  schema of the outbox tables, default public (-schema)
  OUTBOX_TABLE   name of the outbox table, default outbox (-table)

Every command that reads the database names it (user@host:port/database)
and the outbox first; one pointed at an outbox that does not exist lists
the outboxes the database holds.
`

// commands are the command names, for suggestions.
var commands = []string{"migrate", "migrations", "inspect", "health", "dlq", "queue", "subscribers", "rows", "row", "grants", "bind", "console", "rebase", "help"}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("%w: no command given", errUsage)
	}
	switch args[0] {
	case "migrate":
		return migrateCmd(ctx, args[1:], stdout, stderr, getenv)
	case "migrations":
		return migrationsCmd(ctx, args[1:], stdout, stderr, getenv)
	case "inspect":
		return inspectCmd(ctx, args[1:], stdout, stderr, getenv)
	case "health":
		return healthCmd(ctx, args[1:], stdout, stderr, getenv)
	case "dlq":
		return dlqCmd(ctx, args[1:], stdout, stderr, getenv)
	case "queue":
		return queueCmd(ctx, args[1:], stdout, stderr, getenv)
	case "subscribers":
		return subscribersCmd(ctx, args[1:], stdout, stderr, getenv)
	case "rows":
		return rowsCmd(ctx, args[1:], stdout, stderr, getenv)
	case "row":
		return rowCmd(ctx, args[1:], stdout, stderr, getenv)
	case "grants":
		return grantsCmd(ctx, args[1:], stdout, stderr, getenv)
	case "bind":
		return bindCmd(ctx, args[1:], stdout, stderr, getenv)
	case "console":
		return consoleCmd(ctx, args[1:], stdout, stderr, getenv)
	case "rebase":
		return rebaseCmd(ctx, args[1:], stdout, stderr, getenv)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		if hint := suggest(args[0], commands); hint != "" {
			return fmt.Errorf("%w: unknown command %q%s (outboxgen help lists the commands)", errUsage, args[0], hint)
		}
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("%w: unknown command %q", errUsage, args[0])
	}
}
