package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/outboxgen/outboxgen/outbox"
)

const inspectUsage = `Usage: outboxgen inspect [-queue Q] [-json] [flags]

Shows, per queue: rows ready now, scheduled for later, leased, leased past
their lease expiry (their subscriber stalled or died), the oldest row's age, and
rows in the dead-letter table.

Example:
  DATABASE_URL=postgres://localhost/app outboxgen inspect -schema billing
  outboxgen inspect -queue orders.created -json | jq .

Flags:
`

func inspectCmd(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := newFlags("inspect", inspectUsage, stderr)
	conn := connFlags(fs)
	queue := fs.String("queue", "", "show only this queue")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	pos, err := parseFlags(fs, args, "inspect")
	if err != nil {
		return err
	}
	if err := noArgs(pos, "inspect"); err != nil {
		return err
	}
	ob, closeDB, err := conn.open(ctx, "inspect", getenv)
	if err != nil {
		return err
	}
	defer closeDB()
	if err := ob.Check(ctx); err != nil {
		return err
	}
	stats, err := ob.QueueStats(ctx)
	if err != nil {
		return err
	}
	if *queue != "" {
		var only []outbox.QueueStats
		for _, s := range stats {
			if s.Queue == *queue {
				only = append(only, s)
			}
		}
		stats = only
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if stats == nil {
			stats = []outbox.QueueStats{}
		}
		return enc.Encode(stats)
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "QUEUE\tREADY\tSCHEDULED\tLEASED\tEXPIRED\tOLDEST\tDEAD-LETTERED\t")
	for _, s := range stats {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%s\t%d\t\n", s.Queue, s.Ready, s.Scheduled, s.Leased, s.Expired,
			s.OldestAge.Round(time.Second), s.DeadLettered)
	}
	if len(stats) == 0 {
		fmt.Fprintln(w, "(no rows)\t\t\t\t\t\t\t")
	}
	return w.Flush()
}
