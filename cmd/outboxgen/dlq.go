package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/outboxgen/outboxgen/outbox"
)

const dlqUsage = `Usage: outboxgen dlq list|show ID|replay|purge|causes [flags]

Operates on the outbox's dead-letter table:
  list     rows in id order, filtered by -queue, -reason, -cause, -older-than;
           -limit rows a page, the next page with -after the last id
  show ID  one row in full, payload included
  replay   moves the matching rows back into the outbox (new ids, attempts
           reset, headers kept, plus replayed-from: the dead letter's id,
           and first-failed-at: when it first failed); a row is always in
           exactly one table. A row whose timer id is live in the outbox
           stays and is listed; -drop-timer-ids replays it without its
           timer id instead. Needs -queue, -reason, -cause or -older-than, or -yes
           to replay every row
  purge    deletes the matching rows; needs -older-than or -yes
  causes   why the newest -sample dead letters (of -queue) failed: groups
           by queue, reason and last error with numbers and ids as #,
           the largest first (-limit groups), each with its newest row;
           -cause with a group's cause (-json prints it whole) lists,
           replays or purges every dead letter of that cause

replay and purge work in batches (500 and 1,000 rows) in id order, each
committed on its own, with progress on stderr: interrupted, they have
done a part for good, and the same command again goes on with the rest.
-dry-run says what they would do and changes nothing: it only reads, so
it locks no row and leaves nothing to vacuum. It prints the bound of the
rows it matched (-up-to ID -expect N): given to the command it confirms,
that acts on none of the rows dead-lettered since with higher ids, and
says so when the set it found differs from the dry run's.

With -json, list and show print a payload that is UTF-8 text as text
("payload"), any other in base64 ("payload_base64").

Examples:
  outboxgen dlq list -queue orders.created -reason decode_error
  outboxgen dlq list -limit 50 -after 4211
  outboxgen dlq replay -queue orders.created -reason retry_exhausted -dry-run
  outboxgen dlq replay -queue orders.created -reason retry_exhausted -up-to 90412 -expect 2499
  outboxgen dlq purge -older-than 720h
  outboxgen dlq causes -queue orders.created
  outboxgen dlq replay -queue orders.created -reason retry_exhausted -cause 'order # timed out after #s' -dry-run

Flags:
`

// maxListLimit bounds dlq list's -limit: a page is held in memory.
const maxListLimit = 100000

func dlqCmd(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := newFlags("dlq", dlqUsage, stderr)
	conn := connFlags(fs)
	queue := fs.String("queue", "", "only rows of this queue")
	reason := fs.String("reason", "", "only rows with this reason: max_deliveries, retry_exhausted, rejected, decode_error")
	cause := fs.String("cause", "", "list, replay, purge: only rows whose last error is this cause, as causes prints it (numbers and ids as #; '' for none)")
	olderThan := fs.Duration("older-than", 0, "only rows dead-lettered at least this long ago")
	limit := fs.Int("limit", 100, "list: at most this many rows; causes: at most this many groups")
	after := fs.Int64("after", 0, "list: only rows with ids above this one (the next page after -limit rows); default: from the lowest id")
	asJSON := fs.Bool("json", false, "list, show, replay: print JSON")
	dropTimerIDs := fs.Bool("drop-timer-ids", false, "replay: replay rows whose timer id is live in the outbox without it, instead of skipping them")
	yes := fs.Bool("yes", false, "purge: without -older-than, purge every matching row; replay: without a filter, replay every row")
	dryRun := fs.Bool("dry-run", false, "replay, purge: say what it would do, reading only, and change nothing")
	sample := fs.Int("sample", outbox.DeadLetterCauseSampleDefault, "causes: how many of the newest dead letters to group")
	errorContains := fs.String("contains", "", "causes: group only the sampled dead letters whose last error holds this text (any case)")
	upTo := fs.Int64("up-to", 0, "replay, purge, list: only rows with ids up to this one (the bound a -dry-run printed)")
	expect := fs.Int64("expect", -1, "replay, purge: with -up-to, how many rows the dry run matched; the command says so when the set changed")
	pos, err := parseFlags(fs, args, "dlq")
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		fs.Usage()
		return fmt.Errorf("%w: dlq: want list, show ID, replay or purge", errUsage)
	}
	sub, rest := pos[0], pos[1:]
	if !contains(dlqCommands, sub) {
		return fmt.Errorf("%w: dlq: unknown command %q%s (want list, show, replay, purge or causes)", errUsage, sub, suggest(sub, dlqCommands))
	}
	var id int64
	if sub == "show" {
		if len(rest) == 0 {
			return fmt.Errorf("%w: dlq show: want a row id", errUsage)
		}
		v, err := strconv.ParseInt(rest[0], 10, 64)
		if err != nil {
			return fmt.Errorf("%w: dlq show: id %q is not a number", errUsage, rest[0])
		}
		id, rest = v, rest[1:]
	}
	if err := noArgs(rest, "dlq "+sub); err != nil {
		return err
	}
	filter := outbox.DeadLetterFilter{Queue: *queue, Reason: *reason, OlderThan: *olderThan}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "up-to":
			filter.UpToID = upTo
		case "cause": // -cause '' is the dead letters without a last error
			filter.Cause = cause
		}
	})
	if sub == "purge" && *olderThan == 0 && !*yes {
		return fmt.Errorf("%w: dlq purge: pass -older-than D, or -yes to purge every matching row", errUsage)
	}
	if sub == "replay" && *queue == "" && *reason == "" && filter.Cause == nil && *olderThan == 0 && !*yes && !*dryRun {
		return fmt.Errorf("%w: dlq replay: pass -queue, -reason, -cause or -older-than to choose rows, -dry-run to count them, or -yes to replay every dead-lettered row", errUsage)
	}
	if *errorContains != "" && sub != "causes" {
		return fmt.Errorf("%w: dlq %s: -contains is causes'", errUsage, sub)
	}
	if *dryRun && sub != "replay" && sub != "purge" {
		return fmt.Errorf("%w: dlq %s: -dry-run is replay's and purge's", errUsage, sub)
	}
	if *expect >= 0 && filter.UpToID == nil {
		return fmt.Errorf("%w: dlq %s: -expect needs -up-to (both as the dry run printed them)", errUsage, sub)
	}
	if *limit <= 0 || *limit > maxListLimit {
		return fmt.Errorf("%w: dlq: -limit must be between 1 and %d", errUsage, maxListLimit)
	}
	// Without -after the list starts at the lowest id: rows other clients
	// wrote may have ids of zero or below.
	from := int64(math.MinInt64)
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "after" {
			from = *after
		}
	})
	if *olderThan < 0 {
		return fmt.Errorf("%w: dlq: -older-than must not be negative", errUsage)
	}
	if r := *reason; r != "" && !contains(reasons, r) {
		return fmt.Errorf("%w: dlq: -reason %q is not one of %s%s", errUsage, r, strings.Join(reasons, ", "), suggest(r, reasons))
	}
	t, err := conn.openOutbox(ctx, "dlq "+sub, getenv, stdout, stderr, *asJSON)
	if err != nil {
		return err
	}
	defer t.close()
	ob := t.ob

	switch sub {
	case "causes":
		if *reason != "" || filter.Cause != nil || *olderThan != 0 {
			return fmt.Errorf("%w: dlq causes: groups the newest dead letters of -queue (or every queue); -reason, -cause and -older-than are not its", errUsage)
		}
		groups := min(*limit, outbox.DeadLetterCauseLimitMax)
		causes, sampled, err := ob.DeadLetterCauses(ctx, &outbox.DeadLetterCauseOptions{Queue: *queue, Sample: *sample, Limit: groups,
			Contains: *errorContains})
		if err != nil {
			return usageIfInput(err)
		}
		if *asJSON {
			return printJSON(stdout, map[string]any{"sampled": sampled, "causes": causes})
		}
		if len(causes) == 0 {
			if *errorContains != "" {
				fmt.Fprintf(stdout, "no dead letter among the newest %d holds %s in its last error\n", *sample, strconv.Quote(*errorContains))
			} else {
				fmt.Fprintln(stdout, "no dead letter")
			}
			return nil
		}
		if *errorContains != "" {
			fmt.Fprintf(stdout, "of the newest %d dead letters, those whose last error holds %s, by cause:\n", sampled, strconv.Quote(*errorContains))
		} else {
			fmt.Fprintf(stdout, "the newest %d dead letters, by cause:\n", sampled)
		}
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ROWS\tQUEUE\tREASON\tCAUSE\tNEWEST")
		for _, c := range causes {
			cause, _, _ := strings.Cut(c.Cause, "\n")
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d (%s)\n", c.Rows, cell(c.Queue), cell(c.Reason), clip(lastErrorCell(cause), 80), c.NewestID,
				c.NewestFailedAt.Format(time.RFC3339))
		}
		if err := w.Flush(); err != nil {
			return err
		}
		c := causes[0]
		fmt.Fprintf(stdout, "a group's dead letters, all of them: dlq list|replay|purge -queue %s -reason %s -cause %s (-json prints each cause whole)\n",
			shellQuote(c.Queue), c.Reason, shellQuote(c.Cause))
		return nil
	case "list":
		// One row more than asked says whether another page exists.
		rows, err := ob.DeadLetters(ctx, filter, from, *limit+1)
		if err != nil {
			return usageIfInput(err)
		}
		more := len(rows) > *limit
		rows = rows[:min(len(rows), *limit)]
		hint := ""
		if more {
			hint = fmt.Sprintf("more rows: rerun with -after %d\n", rows[len(rows)-1].ID)
		}
		if *asJSON {
			// stdout stays one JSON document.
			fmt.Fprint(stderr, hint)
			out := make([]deadLetterJSON, len(rows))
			for i, r := range rows {
				out[i] = jsonOf(r)
			}
			return printJSON(stdout, out)
		}
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tQUEUE\tREASON\tFAILED AT\tDELIVERIES\tLAST ERROR")
		for _, r := range rows {
			last, _, _ := strings.Cut(r.LastError, "\n")
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%s\n", r.ID, cell(r.Queue), cell(r.Reason), r.FailedAt.Format(time.RFC3339), r.Deliveries, clip(lastErrorCell(last), 80))
		}
		if err := w.Flush(); err != nil {
			return err
		}
		fmt.Fprint(stdout, hint)
		return nil
	case "show":
		rows, err := ob.DeadLetters(ctx, outbox.DeadLetterFilter{}, id-1, 1)
		if err != nil {
			return err
		}
		if len(rows) == 0 || rows[0].ID != id {
			return fmt.Errorf("dlq show: no dead-lettered row %d", id)
		}
		if *asJSON {
			return printJSON(stdout, jsonOf(rows[0]))
		}
		return printDeadLetter(stdout, rows[0])
	case "replay":
		if *dryRun {
			res, err := ob.ReplayDeadLetters(ctx, filter, &outbox.ReplayOpts{DryRun: true, DropConflictingTimerIDs: *dropTimerIDs})
			if err != nil {
				return usageIfInput(err)
			}
			if *asJSON {
				return printJSON(stdout, struct {
					DryRun            bool                   `json:"dry_run"`
					WouldReplay       int64                  `json:"would_replay"`
					Matched           int64                  `json:"matched"`
					UpToID            int64                  `json:"up_to_id"`
					WouldSkip         []outbox.TimerConflict `json:"would_skip,omitempty"`
					WouldDropTimerIDs []outbox.TimerConflict `json:"would_drop_timer_ids,omitempty"`
				}{true, res.Replayed, res.Matched, res.UpToID, res.Skipped, res.TimerIDsDropped})
			}
			fmt.Fprintf(stdout, "dry run: would replay %d dead-lettered row%s into the outbox; nothing was changed\n", res.Replayed, plural(int(res.Replayed)))
			if err := printConflicts(stdout, res, true); err != nil {
				return err
			}
			printBound(stdout, res.Matched, res.UpToID)
			return nil
		}
		bar := newProgress(stderr, "replay")
		res, err := ob.ReplayDeadLetters(ctx, filter, &outbox.ReplayOpts{
			DropConflictingTimerIDs: *dropTimerIDs, Progress: bar.update})
		bar.done()
		setChanged(stderr, *expect, res.Matched, filter)
		if *asJSON {
			if perr := printJSON(stdout, res); perr != nil {
				return perr
			}
		} else if perr := printReplay(stdout, res); perr != nil {
			return perr
		}
		return usageIfInput(err)
	default: // purge
		if *dryRun {
			res, err := ob.PurgeDeadLetters(ctx, filter, &outbox.PurgeOpts{DryRun: true})
			if err != nil {
				return usageIfInput(err)
			}
			if *asJSON {
				return printJSON(stdout, struct {
					DryRun bool `json:"dry_run"`
					outbox.PurgeResult
				}{true, res})
			}
			fmt.Fprintf(stdout, "dry run: would purge %d dead-lettered row%s; nothing was changed\n", res.Matched, plural(int(res.Matched)))
			printBound(stdout, res.Matched, res.UpToID)
			return nil
		}
		bar := newProgress(stderr, "purge")
		res, err := ob.PurgeDeadLetters(ctx, filter, &outbox.PurgeOpts{Progress: bar.update})
		bar.done()
		setChanged(stderr, *expect, res.Matched, filter)
		if *asJSON {
			if perr := printJSON(stdout, res); perr != nil {
				return perr
			}
		} else {
			fmt.Fprintf(stdout, "purged %d dead-lettered rows\n", res.Deleted)
		}
		return usageIfInput(err)
	}
}

// printBound says how to act on exactly the rows a dry run matched.
func printBound(w io.Writer, matched, upTo int64) {
	if matched > 0 {
		fmt.Fprintf(w, "to act on these %d row%s and none dead-lettered since with higher ids, add: -up-to %d -expect %d\n",
			matched, plural(int(matched)), upTo, matched)
	}
}

// setChanged says on w when the rows an action matched within its bound
// are not as many as its dry run's.
func setChanged(w io.Writer, expect, matched int64, f outbox.DeadLetterFilter) {
	if expect >= 0 && f.UpToID != nil && matched != expect {
		fmt.Fprintf(w, "the set changed since the dry run: %d row%s matched up to id %d, where the dry run matched %d\n",
			matched, plural(int(matched)), *f.UpToID, expect)
	}
}

// reasons are the dead letters' failure reasons.
var reasons = []string{outbox.ReasonMaxDeliveries, outbox.ReasonRetryExhausted, outbox.ReasonRejected, outbox.ReasonDecodeError}

// dlqCommands are dlq's sub-commands, for suggestions.
var dlqCommands = []string{"list", "show", "replay", "purge", "causes"}

// deadLetterJSON is a dead letter as dlq list and show print it: a payload
// that is UTF-8 text as text, any other in base64.
type deadLetterJSON struct {
	outbox.DeadLetter
	// Payload shadows the embedded field, whose JSON is base64.
	Payload       *string `json:"payload,omitempty"`
	PayloadBase64 []byte  `json:"payload_base64,omitempty"`
}

func jsonOf(d outbox.DeadLetter) deadLetterJSON {
	j := deadLetterJSON{DeadLetter: d}
	if utf8.Valid(d.Payload) {
		text := string(d.Payload)
		j.Payload = &text
	} else {
		j.PayloadBase64 = d.Payload
	}
	return j
}

// printReplay says what a replay did, naming each row whose timer id was
// live in the outbox.
func printReplay(w io.Writer, res outbox.ReplayResult) error {
	fmt.Fprintf(w, "replayed %d row%s into the outbox\n", res.Replayed, plural(int(res.Replayed)))
	return printConflicts(w, res, false)
}

// printConflicts names each row whose timer id was live in the outbox,
// skipped or replayed without it (in a dry run: that would be).
func printConflicts(w io.Writer, res outbox.ReplayResult, dry bool) error {
	would := map[bool]string{true: "would be ", false: ""}[dry]
	rows := res.Skipped
	switch {
	case len(res.Skipped) > 0:
		fmt.Fprintf(w, "%sskipped %d row%s whose timer id is live in the outbox, left in the dead-letter table (-drop-timer-ids replays without it):\n",
			would, len(rows), plural(len(rows)))
	case len(res.TimerIDsDropped) > 0:
		rows = res.TimerIDsDropped
		fmt.Fprintf(w, "%d %sreplayed without the timer id, which is live in the outbox:\n", len(rows), would)
	default:
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tQUEUE\tTIMER ID")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%s\n", r.ID, cell(r.Queue), cell(r.TimerID))
	}
	return tw.Flush()
}

// usageIfInput marks the library's refusals of bad input (an
// *outbox.InputError, or an *outbox.ConfigError of a name given) as usage
// errors.
func usageIfInput(err error) error {
	var in *outbox.InputError
	var ce *outbox.ConfigError
	if errors.As(err, &in) || errors.As(err, &ce) {
		return fmt.Errorf("%w: %s", errUsage, libText(err))
	}
	return err
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printDeadLetter shows one row in full. Headers are sorted by key; headers
// that are not an object of strings are shown as stored, and a payload
// that is not printable text in hex.
func printDeadLetter(w io.Writer, r outbox.DeadLetter) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "id\t%d\nqueue\t%s\nreason\t%s\nfailed at\t%s\ncreated at\t%s\ndeliveries\t%d\nattempts\t%d\n",
		r.ID, cell(r.Queue), cell(r.Reason), r.FailedAt.Format(time.RFC3339Nano), r.CreatedAt.Format(time.RFC3339Nano), r.Deliveries, r.Attempts)
	if r.OrderingKey != "" {
		fmt.Fprintf(tw, "ordering key\t%s\n", cell(r.OrderingKey))
	}
	if r.TimerID != "" {
		fmt.Fprintf(tw, "timer id\t%s\n", cell(r.TimerID))
	}
	for _, k := range slices.Sorted(maps.Keys(r.Headers)) {
		fmt.Fprintf(tw, "header %s\t%s\n", cell(k), cell(r.Headers[k]))
	}
	if r.RawHeaders != nil {
		fmt.Fprintf(tw, "headers (not an object of strings)\t%s\n", block(string(r.RawHeaders)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if printable(string(r.Payload), "\n\t") {
		fmt.Fprintf(w, "payload (%d bytes):\n%s\n", len(r.Payload), r.Payload)
	} else {
		fmt.Fprintf(w, "payload (%d bytes, not printable UTF-8, in hex):\n%x\n", len(r.Payload), r.Payload)
	}
	fmt.Fprintf(w, "last error:\n%s\n", block(r.LastError))
	return nil
}

// lastErrorCell is the first line of an error for a table cell, quoted
// only when it holds what a table cannot show; an empty one stays empty.
func lastErrorCell(s string) string {
	if s == "" {
		return ""
	}
	return cell(s)
}

func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

// progress shows a bar on a terminal and a line per 10 % elsewhere.
type progress struct {
	w        io.Writer
	what     string
	terminal bool
	lastPct  int64
	shown    bool
}

func newProgress(w io.Writer, what string) *progress {
	p := &progress{w: w, what: what, lastPct: -1}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.terminal = true
		}
	}
	return p
}

func (p *progress) update(done, total int64) {
	if total <= 0 {
		return
	}
	pct := done * 100 / total
	p.shown = true
	if p.terminal {
		const width = 30
		fill := int(pct * width / 100)
		fmt.Fprintf(p.w, "\r[%s%s] %3d%% %s %d/%d", strings.Repeat("=", fill), strings.Repeat(" ", width-fill), pct, p.what, done, total)
		return
	}
	if pct/10 != p.lastPct/10 || done == total {
		fmt.Fprintf(p.w, "%s %d/%d (%d%%)\n", p.what, done, total, pct)
	}
	p.lastPct = pct
}

func (p *progress) done() {
	if p.terminal && p.shown {
		fmt.Fprintln(p.w)
	}
}
