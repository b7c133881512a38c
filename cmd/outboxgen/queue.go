package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

const queueUsage = `Usage: outboxgen queue pause QUEUE [-reason TEXT] | resume QUEUE | paused [flags]

Pauses and resumes a queue (schema 14):
  pause QUEUE   every subscriber of QUEUE, in every process, stops claiming
                its rows at its next claim; rows already claimed finish;
                publishing goes on and the rows wait in the outbox. The
                pause is kept in the database: it outlives restarts of
                subscribers and of the database. Pausing a paused queue
                keeps its first pause
  resume QUEUE  the queue's subscribers claim it again at once
  paused        lists the paused queues: since when, by which role, why

Pausing and resuming need the subscriber (operator) role's grants
(outboxgen grants -subscriber); a publisher role may not.

Examples:
  outboxgen queue pause orders.created -reason "payments API down"
  outboxgen queue paused
  outboxgen queue resume orders.created

Flags:
`

var queueCommands = []string{"pause", "resume", "paused"}

func queueCmd(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := newFlags("queue", queueUsage, stderr)
	conn := connFlags(fs)
	reason := fs.String("reason", "", "pause: why the queue is paused, kept with the pause and shown by paused")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parseFlags(fs, args, "queue")
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		fs.Usage()
		return fmt.Errorf("%w: queue: want pause QUEUE, resume QUEUE or paused", errUsage)
	}
	sub, rest := pos[0], pos[1:]
	if !contains(queueCommands, sub) {
		return fmt.Errorf("%w: queue: unknown command %q%s (want pause, resume or paused)", errUsage, sub, suggest(sub, queueCommands))
	}
	var name string
	if sub != "paused" {
		if len(rest) == 0 {
			return fmt.Errorf("%w: queue %s: want a queue name", errUsage, sub)
		}
		name, rest = rest[0], rest[1:]
	}
	if err := noArgs(rest, "queue "+sub); err != nil {
		return err
	}
	if *reason != "" && sub != "pause" {
		return fmt.Errorf("%w: queue %s: -reason is pause's", errUsage, sub)
	}
	t, err := conn.openOutbox(ctx, "queue "+sub, getenv, stdout, stderr, *asJSON)
	if err != nil {
		return err
	}
	defer t.close()
	switch sub {
	case "pause":
		p, err := t.ob.PauseQueue(ctx, name, *reason)
		if err != nil {
			return usageIfInput(err)
		}
		if *asJSON {
			return printJSON(stdout, p)
		}
		fmt.Fprintf(stdout, "queue %s is paused (since %s, by %s", cell(p.Queue), p.PausedAt.UTC().Format(time.RFC3339), cell(p.PausedBy))
		if p.Reason != "" {
			fmt.Fprintf(stdout, ": %s", cell(p.Reason))
		}
		fmt.Fprintln(stdout, "); its subscribers claim none of its rows until `outboxgen queue resume`")
	case "resume":
		resumed, err := t.ob.ResumeQueue(ctx, name)
		if err != nil {
			return usageIfInput(err)
		}
		if *asJSON {
			return printJSON(stdout, map[string]any{"queue": name, "resumed": resumed})
		}
		if resumed {
			fmt.Fprintf(stdout, "queue %s resumed; its subscribers were woken\n", cell(name))
		} else {
			fmt.Fprintf(stdout, "queue %s was not paused\n", cell(name))
		}
	case "paused":
		ps, err := t.ob.PausedQueues(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, ps)
		}
		if len(ps) == 0 {
			fmt.Fprintln(stdout, "no queue is paused")
			return nil
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "QUEUE\tPAUSED SINCE\tBY\tREASON")
		for _, p := range ps {
			why := "-"
			if p.Reason != "" {
				why = cell(p.Reason)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", cell(p.Queue), p.PausedAt.UTC().Format(time.RFC3339), cell(p.PausedBy), why)
		}
		return tw.Flush()
	}
	return nil
}
