package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxgen/outboxgen/outbox"
)

const rowsUsage = `Usage: outboxgen rows -queue Q [-state S | -key K] [-type T] [-older-than D] [-newer-than D] [-newest] [-limit N] [-json] [flags]
       outboxgen row show|retry|cancel|dead-letter ID [-note TEXT] [-yes] [flags]

rows lists a queue's rows in one state (-state ready, the default,
scheduled, retrying: the scheduled rows an attempt of which failed,
leased or expired), oldest first (-newest: newest first), or an
ordering key's rows in every state in the key's order (-key), a page of
-limit rows; the last line gives the flag of the next page (-after).
Each page is one index range, however many rows the queue holds.
-type, -older-than and -newer-than list only the rows of a message type
or created that long ago. With them, or -state retrying, a page reads
at most 5,000 rows of its range, and may list fewer than -limit, or
none, and still go on.

row acts on one row of the outbox by id:
  show          the row: state, times, attempts, lease, key, last error,
                headers and payload
  retry         makes a row that waits for a later time due now
  cancel        deletes a row no subscriber holds (-yes required)
  dead-letter   moves a row no subscriber holds to the dead letters with
                reason rejected and -note as its last error (-yes required)
A row a subscriber holds is left to its handler.

Examples:
  outboxgen rows -queue orders.created -state scheduled
  outboxgen rows -queue orders.created -key customer-42
  outboxgen rows -queue orders.created -type shop.OrderPlaced -older-than 1h
  outboxgen row retry 4211
  outboxgen row dead-letter 4211 -note "customer closed the account" -yes

Flags:
`

func rowsCmd(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := newFlags("rows", rowsUsage, stderr)
	conn := connFlags(fs)
	queue := fs.String("queue", "", "the queue (required)")
	state := fs.String("state", outbox.RowReady, "ready, scheduled, retrying (scheduled after a failed attempt), leased or expired")
	key := fs.String("key", "", "the rows of this ordering key, in every state, instead of -state")
	msgType := fs.String("type", "", "only rows of this message type (its message-type header)")
	olderThan := fs.Duration("older-than", 0, "only rows created at least this long ago")
	newerThan := fs.Duration("newer-than", 0, "only rows created less than this long ago")
	newest := fs.Bool("newest", false, "newest first")
	limit := fs.Int("limit", outbox.RowsLimitDefault, "rows a page")
	after := fs.String("after", "", "the next page: the value the page before printed")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parseFlags(fs, args, "rows")
	if err != nil {
		return err
	}
	if err := noArgs(pos, "rows"); err != nil {
		return err
	}
	if *queue == "" {
		return fmt.Errorf("%w: rows: -queue is required", errUsage)
	}
	q := outbox.RowQuery{Queue: *queue, State: *state, Key: *key, MessageType: *msgType, OlderThan: *olderThan, NewerThan: *newerThan,
		Newest: *newest, Limit: *limit}
	if *after != "" {
		if q.After, err = outbox.ParseRowCursor("-after", *after); err != nil {
			return usageIfInput(err)
		}
	}
	t, err := conn.openOutbox(ctx, "rows", getenv, stdout, stderr, *asJSON)
	if err != nil {
		return err
	}
	defer t.close()
	rows, next, err := t.ob.Rows(ctx, q)
	if err != nil {
		return usageIfInput(err)
	}
	hint := ""
	if next != nil {
		hint = fmt.Sprintf("more rows: rerun with -after %s\n", next)
	}
	if *asJSON {
		fmt.Fprint(stderr, hint)
		if rows == nil {
			rows = []outbox.RowSummary{}
		}
		return printJSON(stdout, rows)
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tSTATE\tTYPE\tKEY\tDUE\tATTEMPTS\tLAST ERROR")
	for _, r := range rows {
		last, _, _ := strings.Cut(r.LastError, "\n")
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%d\t%s\n", r.ID, r.State, cell(r.MessageType), lastErrorCell(r.OrderingKey),
			r.NextAttemptAt.UTC().Format(time.RFC3339), r.Attempts, clip(lastErrorCell(last), 60))
	}
	if len(rows) == 0 {
		if next != nil {
			fmt.Fprintf(w, "(no match among the %d rows read)\n", outbox.RowsScan)
		} else {
			fmt.Fprintln(w, "(no rows)")
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprint(stdout, hint)
	return nil
}

var rowCommands = []string{"show", "retry", "cancel", "dead-letter"}

func rowCmd(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := newFlags("row", rowsUsage, stderr)
	conn := connFlags(fs)
	note := fs.String("note", "", "dead-letter: why, kept as the dead letter's last error")
	yes := fs.Bool("yes", false, "cancel, dead-letter: act (the row is gone from the outbox)")
	asJSON := fs.Bool("json", false, "show: print JSON")
	pos, err := parseFlags(fs, args, "row")
	if err != nil {
		return err
	}
	if len(pos) < 2 {
		return fmt.Errorf("%w: row: want show, retry, cancel or dead-letter, and a row id", errUsage)
	}
	sub := pos[0]
	if !contains(rowCommands, sub) {
		return fmt.Errorf("%w: row: unknown command %q%s (want show, retry, cancel or dead-letter)", errUsage, sub, suggest(sub, rowCommands))
	}
	id, err := strconv.ParseInt(pos[1], 10, 64)
	if err != nil {
		return fmt.Errorf("%w: row %s: id %q is not a number", errUsage, sub, pos[1])
	}
	if err := noArgs(pos[2:], "row "+sub); err != nil {
		return err
	}
	if (sub == "cancel" || sub == "dead-letter") && !*yes {
		return fmt.Errorf("%w: row %s: pass -yes: the row leaves the outbox", errUsage, sub)
	}
	if sub == "dead-letter" && *note == "" {
		return fmt.Errorf("%w: row dead-letter: pass -note: why, kept as the dead letter's last error", errUsage)
	}
	t, err := conn.openOutbox(ctx, "row "+sub, getenv, stdout, stderr, *asJSON)
	if err != nil {
		return err
	}
	defer t.close()
	var done bool
	switch sub {
	case "show":
		r, ok, err := t.ob.Row(ctx, id)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("row show: the outbox holds no row %d: it was delivered, dead-lettered, cancelled, or never published", id)
		}
		if *asJSON {
			return printJSON(stdout, r)
		}
		printRow(stdout, r)
		return nil
	case "retry":
		done, err = t.ob.RetryRowNow(ctx, id)
	case "cancel":
		done, err = t.ob.CancelRow(ctx, id)
	case "dead-letter":
		done, err = t.ob.DeadLetterRow(ctx, id, *note)
	}
	if err != nil {
		return usageIfInput(err)
	}
	if !done {
		why := "it is gone, or a subscriber holds it"
		if sub == "retry" {
			why += ", or it does not wait for a later time"
		}
		return fmt.Errorf("row %s: nothing done to row %d: %s", sub, id, why)
	}
	fmt.Fprintf(stdout, "row %d: %s done\n", id, sub)
	return nil
}

// printRow shows one outbox row in full.
func printRow(w io.Writer, r outbox.Row) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	stamp := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	for _, f := range [][2]string{
		{"id", strconv.FormatInt(r.ID, 10)}, {"queue", cell(r.Queue)}, {"state", r.State},
		{"published", stamp(r.CreatedAt)}, {"due", stamp(r.NextAttemptAt)},
		{"attempts", strconv.Itoa(r.Attempts)}, {"deliveries", strconv.Itoa(r.Deliveries)},
		{"leased", stamp(r.LeasedAt)}, {"lease expires", stamp(r.LeaseExpiresAt)},
		{"ordering key", lastErrorCell(r.OrderingKey)}, {"timer id", lastErrorCell(r.TimerID)},
	} {
		fmt.Fprintf(tw, "%s\t%s\n", f[0], f[1])
	}
	_ = tw.Flush()
	for _, k := range slices.Sorted(maps.Keys(r.Headers)) {
		fmt.Fprintf(w, "header %s: %s\n", cell(k), cell(r.Headers[k]))
	}
	if r.LastError != "" {
		fmt.Fprintf(w, "last error:\n%s\n", block(r.LastError))
	}
	fmt.Fprintf(w, "payload (%d bytes):\n%s\n", len(r.Payload), block(string(r.Payload)))
}
