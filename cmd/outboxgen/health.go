package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/outboxgen/outboxgen/outbox"
)

const healthUsage = `Usage: outboxgen health [-listen-dsn DSN] [-json] [flags]

Checks what breaks PostgreSQL queues in production: the schema's version
against this release's, whether a NOTIFY reaches a LISTEN connection (give
-listen-dsn the subscribers' ListenDSN when they have one), how full the
server's notification queue is, what holds back vacuum in the cluster,
the outbox table's dead rows and transaction-id age, and queues whose
ready rows wait: past -ready-wait, or past -unclaimed with no running
subscriber of theirs (paused queues wait by choice). Prints the report
and exits with status 1 when it found a problem.

Example:
  DATABASE_URL=postgres://localhost/app outboxgen health -schema billing
  outboxgen health -json | jq .problems

Flags:
`

func healthCmd(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := newFlags("health", healthUsage, stderr)
	conn := connFlags(fs)
	listenDSN := fs.String("listen-dsn", "", "connection string of the LISTEN connection (default: -dsn's)")
	timeout := fs.Duration("notify-timeout", 2*time.Second, "how long to wait for the NOTIFY probe")
	asJSON := fs.Bool("json", false, "print JSON instead of text")
	readyWait := fs.Duration("ready-wait", outbox.HealthReadyWait, "a problem when a queue's oldest ready row has waited this long")
	unclaimed := fs.Duration("unclaimed", outbox.HealthUnclaimed, "a problem when a queue has had ready rows this long and no running subscriber of it")
	pos, err := parseFlags(fs, args, "health")
	if err != nil {
		return err
	}
	if err := noArgs(pos, "health"); err != nil {
		return err
	}
	// A table that does not exist has no dead rows and no vacuum to
	// report: say which outboxes the database holds instead.
	t, err := conn.openOutbox(ctx, "health", getenv, stdout, stderr, *asJSON)
	if err != nil {
		return err
	}
	defer t.close()
	h, err := t.ob.Health(ctx, &outbox.HealthOptions{ListenDSN: *listenDSN, NotifyTimeout: *timeout, ReadyWait: *readyWait,
		Unclaimed: *unclaimed})
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if h.Problems == nil {
			h.Problems = []string{}
		}
		if err := enc.Encode(h); err != nil {
			return err
		}
	} else {
		printHealth(stdout, &h, *listenDSN != "")
	}
	if n := len(h.Problems); n > 0 {
		return fmt.Errorf("health: %d problem(s) found", n)
	}
	return nil
}

// printHealth prints h as text; listenDSN says whether -listen-dsn gave
// the LISTEN connection.
func printHealth(w io.Writer, h *outbox.Health, listenDSN bool) {
	fmt.Fprintf(w, "schema version        %d (this release: %d)\n", h.SchemaVersion, h.LibraryVersion)
	switch {
	case h.NotifyHeard:
		fmt.Fprintf(w, "NOTIFY                heard in %v\n", h.NotifyTook.Round(time.Microsecond*10))
	case !listenDSN:
		fmt.Fprintf(w, "NOTIFY                not heard: %s\n", cell(h.NotifyError))
		fmt.Fprintln(w, "                      LISTEN through PgBouncer in transaction mode never hears: give the subscribers a direct")
		fmt.Fprintln(w, "                      connection to the server in SubscriberConfig.ListenDSN, and check it with -listen-dsn")
	default:
		fmt.Fprintf(w, "NOTIFY                not heard on -listen-dsn: %s\n", cell(h.NotifyError))
	}
	fmt.Fprintf(w, "notification queue    %.4f%% used\n", 100*h.NotificationQueueUsage)
	if x := h.OldestXmin; x != nil {
		if x.Hidden {
			fmt.Fprintf(w, "oldest xmin           %s %s: %d transactions, open for how long this role may not read (grant it pg_read_all_stats)\n", x.Kind, cell(x.Name), x.Age)
		} else {
			fmt.Fprintf(w, "oldest xmin           %s %s (%s): %d transactions, open %v\n", x.Kind, cell(x.Name), x.State, x.Age, x.Open.Round(time.Second))
		}
	} else {
		fmt.Fprintln(w, "oldest xmin           none")
	}
	vacuumed := "never"
	if h.SinceVacuum >= 0 {
		vacuumed = h.SinceVacuum.Round(time.Second).String() + " ago"
	}
	fmt.Fprintf(w, "table                 %d live, %d dead row versions; vacuumed %s; oldest unfrozen row %d transactions old\n",
		h.LiveTuples, h.DeadTuples, vacuumed, h.XidAge)
	if r := h.Ring; r != nil {
		next := "empty"
		if !r.NextEmptied {
			lanes := fmt.Sprint(len(r.Behind))
			if len(r.Behind) == 5 {
				lanes = "5 or more" // Health lists five at most
			}
			next = fmt.Sprintf("not emptied: %s lanes have not read it, %d sessions hold a lock on it", lanes, len(r.Locks))
		}
		fmt.Fprintf(w, "ring                  writers in partition %d for %v; the next %s\n", r.Partition, r.WritingFor.Round(time.Second), next)
	}
	for _, p := range h.Paused {
		why := ""
		if p.Reason != "" {
			why = ": " + cell(p.Reason)
		}
		fmt.Fprintf(w, "paused                queue %s since %s by %s%s\n", cell(p.Queue), p.PausedAt.UTC().Format(time.RFC3339), cell(p.PausedBy), why)
	}
	if len(h.Problems) == 0 {
		fmt.Fprintln(w, "problems              none")
		return
	}
	fmt.Fprintln(w, "problems:")
	for _, p := range h.Problems {
		fmt.Fprintln(w, "  - "+p)
	}
}
