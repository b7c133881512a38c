package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxgen/outboxgen/outbox"
)

const subscribersUsage = `Usage: outboxgen subscribers [flags]

Lists the subscribers of the outbox, in every process, as their presence
records show them (schema 14): each writes its record as it starts and
every 5 s, and deletes it when it stops. For each: its name, host and
process id, its queues, its claim path (lock or lease), whether its
claims find rows (claiming) or not (asleep) and since when, its handlers
busy of its workers, the rows it holds, its last claim and its record's
age. A subscriber whose record is 15 s old is shown GONE: its process
was killed, froze or lost the database. Records gone for an hour are
deleted.

Example:
  outboxgen subscribers
  outboxgen subscribers -json

Flags:
`

func subscribersCmd(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := newFlags("subscribers", subscribersUsage, stderr)
	conn := connFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parseFlags(fs, args, "subscribers")
	if err != nil {
		return err
	}
	if err := noArgs(pos, "subscribers"); err != nil {
		return err
	}
	t, err := conn.openOutbox(ctx, "subscribers", getenv, stdout, stderr, *asJSON)
	if err != nil {
		return err
	}
	defer t.close()
	subs, err := t.ob.Subscribers(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, subs)
	}
	if len(subs) == 0 {
		fmt.Fprintln(stdout, "no subscriber is running (none has written a presence record in the last hour)")
		return nil
	}
	now := time.Now()
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tHOST\tPID\tQUEUES\tPATH\tSTATE\tBUSY\tIN FLIGHT\tLAST CLAIM\tSEEN")
	for _, s := range subs {
		queues := make([]string, len(s.Queues))
		for i, q := range s.Queues {
			queues[i] = cell(q)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%d/%d\t%d\t%s\t%s\n", cell(s.Name), cell(s.Host), s.PID, strings.Join(queues, ","),
			s.ClaimPath, state(s, now), s.Busy, s.Workers, s.InFlight, ago(s.LastClaimAt, now), ago(s.SeenAt, now))
	}
	return w.Flush()
}

// state is the STATE cell: gone, or the state and for how long.
func state(s outbox.SubscriberInfo, now time.Time) string {
	if s.Gone {
		return "GONE"
	}
	return fmt.Sprintf("%s for %s", s.State, now.Sub(s.StateSince).Round(time.Second))
}

// ago says how long before now t was, or "-" for the zero time.
func ago(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return now.Sub(t).Round(100*time.Millisecond).String() + " ago"
}
