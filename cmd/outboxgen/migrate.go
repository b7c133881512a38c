package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgen/outboxgen/outbox"
)

const migrateUsage = `Usage: outboxgen migrate up|down|down-to N|reset|status [flags]

Applies the outbox's migrations (up), rolls back all of them (down, or its
alias reset), rolls back those above version N (down-to N), or lists them
(status), in the database at DATABASE_URL or -dsn.

Examples:
  DATABASE_URL=postgres://localhost/app outboxgen migrate up -schema billing -table events
  OUTBOX_SCHEMA=billing OUTBOX_TABLE=events outboxgen migrate status

Flags:
`

func migrateCmd(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := newFlags("migrate", migrateUsage, stderr)
	conn := connFlags(fs)
	pos, err := parseFlags(fs, args, "migrate")
	if err != nil {
		return err
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
	case len(pos) != 1:
		return fmt.Errorf("%w: migrate %s: unexpected arguments %q", errUsage, action, pos[1:])
	case action != "up" && action != "down" && action != "reset" && action != "status":
		return fmt.Errorf("%w: migrate: unknown action %q (want up, down, down-to N, reset or status)", errUsage, action)
	}
	ob, closeDB, err := conn.open(ctx, "migrate", getenv)
	if err != nil {
		return err
	}
	defer closeDB()

	switch action {
	case "up":
		return migrateUp(ctx, ob, stdout)
	case "down", "reset", "down-to":
		if err := ob.MigrateDownTo(ctx, target); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "outbox %s.%s rolled back to version %d\n", ob.Schema(), ob.Table(), target)
	case "status":
		st, err := ob.MigrationStatus(ctx)
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "VERSION\tNAME\tAPPLIED AT")
		for _, s := range st {
			at := "pending"
			switch {
			case s.Applied && s.AppliedAt.IsZero():
				at = "applied by another tool"
			case s.Applied:
				at = s.AppliedAt.Format("2006-01-02 15:04:05")
			}
			fmt.Fprintf(w, "%d\t%s\t%s\n", s.Version, s.Name, at)
		}
		return w.Flush()
	}
	return nil
}

// migrateUp applies the pending migrations and says which it applied, or
// that there were none.
func migrateUp(ctx context.Context, ob *outbox.Outbox, stdout io.Writer) error {
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
	if err := ob.Migrate(ctx); err != nil {
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

// plural returns "s" unless n is 1.
func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
