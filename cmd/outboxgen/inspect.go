package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxgen/outboxgen/outbox"
)

const inspectUsage = `Usage: outboxgen inspect [-queue Q] [-json] [flags]

Shows, per queue: rows ready now, scheduled for later, blocked behind an
earlier row of their ordering key, leased, leased past their lease expiry
(their subscriber stalled or died), the oldest row's age, and rows in the
dead-letter table; and the ordering keys whose head holds later rows back:
how many while it waits for its retry, how many while it waits for its
scheduled time, and the key whose rows have waited longest, with how long.

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
	t, err := conn.openOutbox(ctx, "inspect", getenv, stdout, stderr, *asJSON)
	if err != nil {
		return err
	}
	defer t.close()
	if err := t.ob.Check(ctx); err != nil {
		return err
	}
	stats, err := t.ob.QueueStats(ctx)
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
	columns := []string{"QUEUE", "READY", "SCHEDULED", "BLOCKED", "LEASED", "EXPIRED", "OLDEST", "DEAD-LETTERED",
		"HELD KEYS (retry/sched)", "OLDEST HELD KEY"}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, strings.Join(columns, "\t")+"\t")
	for _, s := range stats {
		name := cell(s.Queue)
		if s.Paused != nil {
			name += " (paused)"
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%d/%d\t%s\t\n", name, s.Ready, s.Scheduled, s.Blocked,
			s.Leased, s.Expired, oldest(s), s.DeadLettered,
			s.HeldKeysRetrying, s.HeldKeysScheduled, heldKey(s))
	}
	if len(stats) == 0 {
		fmt.Fprintln(w, "(no rows)"+strings.Repeat("\t", len(columns)))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, s := range stats {
		if p := s.Paused; p != nil {
			fmt.Fprintf(stdout, "queue %s paused since %s by %s", cell(p.Queue), p.PausedAt.UTC().Format(time.RFC3339), cell(p.PausedBy))
			if p.Reason != "" {
				fmt.Fprintf(stdout, ": %s", cell(p.Reason))
			}
			fmt.Fprintln(stdout, "; no subscriber claims its rows until `outboxgen queue resume`")
		}
	}
	return nil
}

// oldest is the OLDEST cell: the age of the queue's oldest row, or "-"
// when the queue has no row in the outbox (only dead letters).
func oldest(s outbox.QueueStats) string {
	if s.Ready+s.Scheduled+s.Blocked+s.Leased+s.Expired == 0 {
		return "-"
	}
	return s.OldestAge.Round(time.Second).String()
}

// heldKeyWidth caps the key shown in the table; -json carries it whole.
const heldKeyWidth = 40

// heldKey is the OLDEST HELD KEY cell: the key and how long its rows have
// waited, or "-" when no key is held. A key that is empty or holds
// characters a table cannot show (tabs, newlines) is quoted.
func heldKey(s outbox.QueueStats) string {
	if s.HeldKeysRetrying+s.HeldKeysScheduled == 0 {
		return "-"
	}
	return fmt.Sprintf("%s (%s)", clip(cell(s.OldestHeldKey), heldKeyWidth), s.OldestHeldAge.Round(time.Second))
}
