package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/outboxgen/outboxgen/outbox"
)

const grantsUsage = `Usage: outboxgen grants [-publisher ROLE] [-subscriber ROLE] [-apply] [flags]

Prints the GRANT statements that give a publishing role and a subscribing
role what they need on the outbox, and nothing more: the publisher
publishes (keyed or not, at any isolation level) and cancels timers; the
subscriber runs subscribers, reads inspect's and health's figures and
operates the dead letters. The role that ran the migrations owns the
outbox and needs no grant. With -apply it runs them against DATABASE_URL
(or -dsn), connected as the outbox's owner, in one transaction. See
docs/operations.md, "Roles and privileges".

Example:
  outboxgen grants -schema billing -publisher app -subscriber worker
  DATABASE_URL=postgres://migrator@localhost/app outboxgen grants -publisher app -subscriber worker -apply

Flags:
`

func grantsCmd(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := newFlags("grants", grantsUsage, stderr)
	conn := connFlags(fs)
	publisher := fs.String("publisher", "", "role that publishes")
	subscriber := fs.String("subscriber", "", "role that subscribes and operates the outbox")
	apply := fs.Bool("apply", false, "run the statements instead of printing them")
	pos, err := parseFlags(fs, args, "grants")
	if err != nil {
		return err
	}
	if err := noArgs(pos, "grants"); err != nil {
		return err
	}
	schema, table := conn.resolve(getenv)
	stmts, err := outbox.Grants(&outbox.Config{Schema: schema, Table: table}, outbox.Roles{Publisher: *publisher, Subscriber: *subscriber})
	var ce *outbox.ConfigError
	if errors.As(err, &ce) {
		return fmt.Errorf("%w: grants: %s (-publisher, -subscriber)", errUsage, libText(err))
	}
	if err != nil {
		return err
	}
	if !*apply {
		for _, s := range stmts {
			fmt.Fprintln(stdout, s+";")
		}
		return nil
	}
	t, err := conn.open(ctx, "grants", getenv)
	if err != nil {
		return err
	}
	defer t.close()
	t.header(stdout, stderr, false)
	if err := t.requireOutbox(ctx, "grants -apply"); err != nil {
		return err
	}
	if err := t.ob.Grant(ctx, outbox.Roles{Publisher: *publisher, Subscriber: *subscriber}); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "granted: %d statements\n", len(stmts))
	return nil
}
