package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgen/outboxgen/outbox"
)

const migrateUsage = `Usage: outboxgen migrate up|down|down-to N|reset|status [-yes] [flags]

Applies the outbox's pending migrations (up), rolls back the latest one
(down), rolls back those above version N (down-to N) or all of them
(reset), or lists them (status), in the database at -dsn, else
DATABASE_URL, else PostgreSQL's client defaults (PGHOST, PGPORT,
PGDATABASE, PGUSER, ...). As in goose, down is one step.

A rollback to version 0, or one that drops the outbox table or the
dead-letter table while they hold rows, refuses unless -yes is given, and
says how many rows and dead letters it would drop. Stop the outbox's
publishers and subscribers before such a rollback: rows they write after
the count are dropped too.

Each step (up or down) waits at most -lock-timeout for each lock it
takes, so that the service's publishers and claims never queue long
behind a schema change waiting for a long transaction. A step that times
out is rolled back and tried again, with growing waits in between, for
up to -lock-retry-for; each retry prints to stderr which sessions held
the lock (pid, application_name, state, transaction age, statement).

Examples:
  DATABASE_URL=postgres://localhost/app outboxgen migrate up -schema billing -table events
  OUTBOX_SCHEMA=billing OUTBOX_TABLE=events outboxgen migrate status
  outboxgen migrate down -schema billing -table events
  outboxgen migrate reset -yes -schema billing -table events
  outboxgen migrate up -lock-timeout 500ms -lock-retry-for 30m

Flags:
`

var migrateActions = []string{"up", "down", "down-to", "reset", "status"}

func migrateCmd(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := newFlags("migrate", migrateUsage, stderr)
	conn := connFlags(fs)
	yes := fs.Bool("yes", false, "down, down-to, reset: roll back also when that drops the outbox or rows")
	lockTimeout := fs.Duration("lock-timeout", outbox.MigrationLockTimeoutDefault,
		"how long each step waits for a lock before it is rolled back and retried")
	retryFor := fs.Duration("lock-retry-for", outbox.MigrationRetryBudgetDefault,
		"how long a step whose lock is not granted is retried before migrate gives up")
	pos, err := parseFlags(fs, args, "migrate")
	if err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"-lock-timeout", *lockTimeout}, {"-lock-retry-for", *retryFor}} {
		if f.d < 0 {
			return fmt.Errorf("%w: migrate: %s %v: must be positive, or 0 for the default", errUsage, f.name, f.d)
		}
	}
	opts := []outbox.MigrateOption{
		outbox.MigrateLockTimeout(*lockTimeout),
		outbox.MigrateRetryBudget(*retryFor),
		outbox.MigrateLogger(stderrLogger(stderr)),
	}
	if len(pos) == 0 {
		fs.Usage()
		return fmt.Errorf("%w: migrate: want one of up, down, down-to N, reset, status", errUsage)
	}
	action := pos[0]
	var target int64
	switch {
	case action == "down-to" && len(pos) == 2:
		v, err := strconv.ParseInt(pos[1], 10, 64)
		if err != nil || v < 0 {
			return fmt.Errorf("%w: migrate down-to: version %q is not a number >= 0", errUsage, pos[1])
		}
		target = v
	case action == "down-to":
		return fmt.Errorf("%w: migrate down-to: want one version number", errUsage)
	case !contains(migrateActions, action):
		return fmt.Errorf("%w: migrate: unknown action %q%s (want up, down, down-to N, reset or status)",
			errUsage, action, suggest(action, migrateActions))
	case len(pos) != 1:
		return fmt.Errorf("%w: migrate %s: unexpected arguments %q", errUsage, action, pos[1:])
	}
	t, err := conn.open(ctx, "migrate "+action, getenv)
	if err != nil {
		return err
	}
	defer t.close()
	t.header(stdout, stderr, false)

	switch action {
	case "up":
		return migrateUp(ctx, t, stdout, opts)
	case "status":
		return migrateStatus(ctx, t, stdout)
	case "reset":
		return migrateDown(ctx, t, "reset", 0, *yes, stdout, opts)
	case "down-to":
		return migrateDown(ctx, t, "down-to", target, *yes, stdout, opts)
	default: // down: one step, the latest migration this tool applied.
		st, err := t.ob.MigrationStatus(ctx)
		if err != nil {
			return err
		}
		top := -1
		for i, s := range st {
			if s.Applied && !s.AppliedAt.IsZero() {
				top = i
			}
		}
		if top < 0 {
			fmt.Fprintf(stdout, "nothing to roll back: %s\n", notApplied(st))
			return nil
		}
		var prev int64
		if top > 0 {
			prev = st[top-1].Version
		}
		return migrateDown(ctx, t, "down", prev, *yes, stdout, opts)
	}
}

// notApplied says why an outbox has nothing this tool can roll back.
func notApplied(st []outbox.MigrationState) string {
	for _, s := range st {
		if s.Applied {
			return "its migrations were applied by another tool (a repository's goose, say), which rolls them back"
		}
	}
	return "no migration is applied"
}

// migrateDown rolls the outbox back to version, refusing without yes when
// that drops the outbox or rows, and says what it rolled back.
func migrateDown(ctx context.Context, t *target, action string, version int64, yes bool, stdout io.Writer, opts []outbox.MigrateOption) error {
	before, err := t.ob.MigrationStatus(ctx)
	if err != nil {
		return err
	}
	var current int64
	for _, s := range before {
		if s.Applied {
			current = max(current, s.Version)
		}
	}
	if current <= version {
		fmt.Fprintf(stdout, "nothing to roll back: outbox %s.%s is at version %d\n", t.ob.Schema(), t.ob.Table(), current)
		return nil
	}
	if !yes {
		loss, err := t.ob.MigrateDownLoss(ctx, version)
		if err != nil {
			return err
		}
		if version == 0 || loss.Rows > 0 || loss.DeadLetters > 0 {
			return fmt.Errorf("%w: migrate %s: rolling %s back to version %d %s; pass -yes to roll back anyway (nothing was changed)",
				errUsage, action, t.where(), version, describeLoss(current, version, loss))
		}
	}
	if err := t.ob.MigrateDownTo(ctx, version, opts...); err != nil {
		return err
	}
	after, err := t.ob.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	var n int
	for i := len(before) - 1; i >= 0; i-- {
		if s := before[i]; s.Applied && s.Version > after {
			n++
			fmt.Fprintf(stdout, "rolled back %s\n", s.Name)
		}
	}
	fmt.Fprintf(stdout, "outbox %s.%s: rolled back %d migration%s, now at version %d\n",
		t.ob.Schema(), t.ob.Table(), n, plural(n), after)
	if after > version {
		fmt.Fprintf(stdout, "migrations up to version %d were applied by another tool, which rolls them back\n", after)
	}
	return nil
}

// describeLoss says what a rollback from version current to version (0
// or 1) drops.
func describeLoss(current, version int64, loss outbox.RollbackLoss) string {
	var parts []string
	if version < 1 {
		parts = append(parts, fmt.Sprintf("the outbox table with its %d row%s", loss.Rows, plural(int(loss.Rows))))
	}
	if version < 2 && current >= 2 {
		parts = append(parts, fmt.Sprintf("the dead-letter table with its %d dead letter%s", loss.DeadLetters, plural(int(loss.DeadLetters))))
	}
	return "drops " + strings.Join(parts, " and ")
}

// migrateStatus lists the migrations and, when the outbox does not exist,
// says so and names the outboxes that do.
func migrateStatus(ctx context.Context, t *target, stdout io.Writer) error {
	st, err := t.ob.MigrationStatus(ctx)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "VERSION\tNAME\tAPPLIED AT")
	applied := false
	for _, s := range st {
		at := "pending"
		switch {
		case s.Applied && s.AppliedAt.IsZero():
			at = "applied by another tool"
		case s.Applied:
			at = s.AppliedAt.Format("2006-01-02 15:04:05")
		}
		applied = applied || s.Applied
		fmt.Fprintf(w, "%d\t%s\t%s\n", s.Version, s.Name, at)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if !applied {
		fmt.Fprintf(stdout, "outbox %s.%s does not exist; %s\n", t.ob.Schema(), t.ob.Table(), t.others(ctx))
	}
	return nil
}

// migrateUp applies the pending migrations and says which it applied, or
// that there were none.
func migrateUp(ctx context.Context, t *target, stdout io.Writer, opts []outbox.MigrateOption) error {
	ob := t.ob
	before, err := ob.MigrationStatus(ctx)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "3F000" {
		// invalid_schema_name: the schema does not exist yet, so nothing
		// is applied; Migrate creates it.
		before, err = nil, nil
	}
	if err != nil {
		return err
	}
	if v, err := ob.SchemaVersion(ctx); err == nil && v == 0 {
		// A new outbox: say which others the database holds, in case
		// -schema or -table was forgotten.
		if all, err := ob.Outboxes(ctx); err == nil && len(all) > 0 {
			fmt.Fprintf(stdout, "creating outbox %s.%s; the database also holds %s\n", ob.Schema(), ob.Table(), joinNames(all))
		}
	}
	if err := ob.Migrate(ctx, opts...); err != nil {
		return err
	}
	after, err := ob.MigrationStatus(ctx)
	if err != nil {
		return err
	}
	had := map[int64]bool{}
	for _, m := range before {
		had[m.Version] = m.Applied
	}
	var applied int
	var version int64
	for _, m := range after {
		if !m.Applied {
			continue
		}
		version = max(version, m.Version)
		if !had[m.Version] {
			applied++
			fmt.Fprintf(stdout, "applied %s\n", m.Name)
		}
	}
	if applied == 0 {
		fmt.Fprintf(stdout, "outbox %s.%s is already up to date (version %d)\n", ob.Schema(), ob.Table(), version)
		return nil
	}
	fmt.Fprintf(stdout, "outbox %s.%s: applied %d migration%s, now at version %d\n",
		ob.Schema(), ob.Table(), applied, plural(applied), version)
	return nil
}

// stderrLogger prints the library's migration logs (a retry of a step
// whose lock was not granted, and what held it) to stderr, one line each,
// without timestamps.
func stderrLogger(stderr io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{}
			}
			return a
		},
	}))
}

// joinNames lists outboxes, at most maxListed of them.
func joinNames(all []outbox.OutboxName) string {
	var parts []string
	for i, n := range all {
		if i == maxListed {
			parts = append(parts, fmt.Sprintf("and %d more", len(all)-maxListed))
			break
		}
		parts = append(parts, n.String())
	}
	return strings.Join(parts, ", ")
}

// plural returns "s" unless n is 1.
func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
