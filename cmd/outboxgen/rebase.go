package main

import (
	"context"
	"fmt"
	"io"
)

const rebaseUsage = `Usage: outboxgen rebase -yes [flags]

Makes the outbox's log tier (its ring, schema 13) readable in a cluster it
was restored into from a pg_dump, or reached by a cut-over to a logical
replica: the ring's rows keep the transaction ids of the cluster that
wrote them, and no snapshot here sees them until this cluster's counter
passes those. It deletes the ring's rows that subscribers had consumed,
gives the rest this cluster's transaction id, and has every lane read the
ring from its start; a row a claim held when the dump was taken is
delivered again. Run it once, connected as the outbox's owner, after the
restore and before writers and subscribers start. -yes is required. See
docs/operations.md, "Restoring from a dump".

Example:
  DATABASE_URL=postgres://migrator@localhost/app outboxgen rebase -yes

Flags:
`

func rebaseCmd(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := newFlags("rebase", rebaseUsage, stderr)
	conn := connFlags(fs)
	yes := fs.Bool("yes", false, "rebase the ring (it is meant for a restored outbox, before its subscribers start)")
	pos, err := parseFlags(fs, args, "rebase")
	if err != nil {
		return err
	}
	if err := noArgs(pos, "rebase"); err != nil {
		return err
	}
	if !*yes {
		return fmt.Errorf("%w: rebase: -yes is required: it is meant for an outbox restored from a dump, before its writers and subscribers start, and delivers again what a claim held", errUsage)
	}
	t, err := conn.openOutbox(ctx, "rebase", getenv, stdout, stderr, false)
	if err != nil {
		return err
	}
	defer t.close()
	r, err := t.ob.RebaseRing(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "rebased the ring: deleted %d rows its lanes had consumed, kept %d for every lane to read from the start\n", r.Consumed, r.Kept)
	return nil
}
