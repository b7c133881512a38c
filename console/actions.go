package console

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outboxgen/outboxgen/outbox"
)

// Steps of an action: each is a POST of the previous step's form.
const (
	stepCount   = "count"
	stepDryRun  = "dry-run"
	stepConfirm = "confirm"
)

// actionKind is one action: what each of its steps does.
type actionKind struct {
	name  string // in the action log
	title string
	// path is the action's URL under the outbox's.
	path string
	// parse reads the action's fields from the form, returning what its
	// steps act on and the fields to carry to the next step.
	parse func(form url.Values) (target, error)
	// count says what the action would act on now.
	count func(ctx context.Context, c *Console, rq *request, t target) (string, error)
	// dryRun says what it would do, doing nothing, and returns the bound
	// its confirmation carries.
	dryRun func(ctx context.Context, c *Console, rq *request, t target) (stepResult, error)
	// run does it, or as much of it as one request may, and says what it
	// did; its attrs go to the action log.
	run func(ctx context.Context, c *Console, rq *request, t target) (stepResult, error)
}

// stepResult is what a dry run or a confirmation says.
type stepResult struct {
	msg     string
	details []string
	attrs   []any
	// changed, when not empty, says the set the dry run showed changed
	// before the confirmation.
	changed string
	// carry are the fields the next step's form carries besides the
	// target's (the dry run's bound, how far the action got).
	carry url.Values
	// more says the action stopped at its request's budget with rows
	// left: the page offers to continue.
	more bool
}

// target is what an action acts on.
type target struct {
	filter outbox.DeadLetterFilter
	queue  string
	timer  string
	// reason is a pause's reason, or a row's note.
	reason string
	// row is the id of the row an action on one row acts on.
	row  int64
	drop bool
	// desc describes it for people and the action log.
	desc string
	// fields are the form fields that name it.
	fields url.Values
	// bounded says the form carries a dry run's bound: the action acts
	// on the ids up to filter.UpToID, and expect is how many matched.
	bounded bool
	expect  int64
	// done counts the rows earlier requests of the same confirmation
	// acted on (a large action goes on over several requests).
	done int64
}

func (t target) fieldList() [][2]string {
	var out [][2]string
	for _, k := range slices.Sorted(maps.Keys(t.fields)) {
		for _, v := range t.fields[k] {
			out = append(out, [2]string{k, v})
		}
	}
	return out
}

// maxSelection is how many dead letters one selection may name.
const maxSelection = 1000

// parseDeadTarget reads a dead-letter filter, or a selection of ids when
// the form's scope is "selection".
func parseDeadTarget(form url.Values) (target, error) {
	ff, f, err := parseFilter(form)
	if err != nil {
		return target{}, err
	}
	t := target{fields: url.Values{}, drop: form.Get("drop") == "on"}
	if err := parseBound(form, &t); err != nil {
		return t, err
	}
	if form.Get("scope") == "selection" {
		if len(ff.IDs) == 0 {
			return t, &outbox.InputError{Field: "id", Rule: "select at least one dead letter"}
		}
		if len(ff.IDs) > maxSelection {
			return t, &outbox.InputError{Field: "id", Rule: fmt.Sprintf("select at most %d dead letters at once", maxSelection)}
		}
		t.filter = outbox.DeadLetterFilter{IDs: ff.IDs, UpToID: t.filter.UpToID}
		t.fields["scope"] = []string{"selection"}
		for _, id := range ff.IDs {
			t.fields.Add("id", strconv.FormatInt(id, 10))
		}
		t.desc = fmt.Sprintf("the %d selected dead letters", len(ff.IDs))
		if len(ff.IDs) == 1 {
			t.desc = "dead letter " + strconv.FormatInt(ff.IDs[0], 10)
		}
		return t, nil
	}
	f.IDs, f.UpToID = nil, t.filter.UpToID
	t.filter = f
	t.fields["scope"] = []string{"filter"}
	var parts []string
	add := func(field, value, desc string) {
		t.fields.Set(field, value)
		parts = append(parts, fmt.Sprintf(desc, value))
	}
	if ff.Queue != "" {
		add("q", ff.Queue, "queue %q")
	}
	if ff.Reason != "" {
		add("reason", ff.Reason, "reason %s")
	}
	if ff.HasCause { // "" too: the dead letters without a last error
		add("cause", ff.Cause, "cause %q")
	}
	if ff.Older != "" {
		add("older", ff.Older, "failed over %s ago")
	}
	t.desc = "every dead letter"
	if len(parts) > 0 {
		t.desc = "the dead letters of " + strings.Join(parts, ", ")
	}
	return t, nil
}

// parseBound reads the bound a dry run gave its confirmation (upto, the
// highest id, and expect, how many matched) and how far earlier requests
// of the confirmation got (done), carrying the first two on.
func parseBound(form url.Values, t *target) error {
	up, expect, done := form.Get("upto"), form.Get("expect"), form.Get("done")
	if up == "" {
		return nil
	}
	id, err := strconv.ParseInt(up, 10, 64)
	if err != nil {
		return &outbox.InputError{Field: "upto", Rule: "must be a whole number (the highest id the dry run matched)"}
	}
	if t.expect, err = strconv.ParseInt(expect, 10, 64); err != nil || t.expect < 0 {
		return &outbox.InputError{Field: "expect", Rule: "must be a whole number (how many rows the dry run matched)"}
	}
	if done != "" {
		if t.done, err = strconv.ParseInt(done, 10, 64); err != nil || t.done < 0 {
			return &outbox.InputError{Field: "done", Rule: "must be a whole number (how many rows earlier requests acted on)"}
		}
	}
	t.filter.UpToID, t.bounded = &id, true
	t.fields.Set("upto", up)
	t.fields.Set("expect", expect)
	return nil
}

// boundFields are the fields that carry a dry run's bound to its
// confirmation.
// boundAttr is the action log's up_to_id: the highest id the action
// matched, left out when it matched none (the bound is then no id).
func boundAttr(matched, upTo int64) []any {
	if matched == 0 {
		return nil
	}
	return []any{"up_to_id", upTo}
}

func boundFields(upTo, matched int64) url.Values {
	return url.Values{"upto": {strconv.FormatInt(upTo, 10)}, "expect": {strconv.FormatInt(matched, 10)}}
}

// maxDetails bounds the lines of details a page lists.
const maxDetails = 100

// capDetails keeps the first maxDetails lines and says how many more
// there are.
func capDetails(lines []string) []string {
	if len(lines) <= maxDetails {
		return lines
	}
	return append(lines[:maxDetails:maxDetails], fmt.Sprintf("and %s more", num(int64(len(lines)-maxDetails))))
}

// budget returns ctx for one request's share of a large action and a
// progress function that ends it after the batch that passes the
// request's budget (half of Config.Timeout), so no batch is cut short,
// and stopped, which reports whether it was the budget that ended it.
func (c *Console) budget(ctx context.Context) (context.Context, func(done, total int64), func(error) bool, context.CancelFunc) {
	step := c.cfg.Timeout / 2
	if c.actionStep > 0 {
		step = c.actionStep
	}
	start := time.Now()
	ctx, cancel := context.WithCancelCause(ctx)
	progress := func(done, total int64) {
		if done < total && time.Since(start) >= step {
			cancel(errBudget)
		}
	}
	stopped := func(err error) bool { return err != nil && errors.Is(context.Cause(ctx), errBudget) }
	return ctx, progress, stopped, func() { cancel(nil) }
}

// errBudget ends a request's share of a large action.
var errBudget = errors.New("the request's share of the action is done")

// changedSince says how the set a confirmation acts on differs from what
// its dry run showed, on the confirmation's first request.
func changedSince(t target, matched int64) string {
	if !t.bounded || t.done > 0 || matched == t.expect {
		return ""
	}
	return fmt.Sprintf("The set changed since the dry run: %s now match within its bound, where it showed %s.",
		plural(matched, "row", "rows"), num(t.expect))
}

// leftAbove says how many rows matching t's filter have ids above the dry
// run's bound: dead-lettered since, and left.
func leftAbove(ctx context.Context, rq *request, t target) (string, error) {
	if !t.bounded {
		return "", nil
	}
	f := t.filter
	within, err := rq.ob.CountDeadLetters(ctx, f)
	if err != nil {
		return "", err
	}
	f.UpToID = nil
	all, err := rq.ob.CountDeadLetters(ctx, f)
	if err != nil || all <= within {
		return "", err
	}
	return fmt.Sprintf("%s matching the filter came after the dry run and %s left.",
		upper(plural(all-within, "dead letter", "dead letters")), map[bool]string{true: "was", false: "were"}[all-within == 1]), nil
}

func plural(n int64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return num(n) + " " + many
}

func countDead(ctx context.Context, _ *Console, rq *request, t target) (string, error) {
	n, err := rq.ob.CountDeadLetters(ctx, t.filter)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s: %s.", upper(t.desc), plural(n, "row", "rows")), nil
}

func upper(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func conflicts(res outbox.ReplayResult) []string {
	var out []string
	for _, c := range res.Skipped {
		out = append(out, fmt.Sprintf("dead letter %d stays: queue %q already holds a live row with timer id %q", c.ID, c.Queue, c.TimerID))
	}
	for _, c := range res.TimerIDsDropped {
		out = append(out, fmt.Sprintf("dead letter %d goes back without its timer id %q, which a live row of queue %q holds", c.ID, c.TimerID, c.Queue))
	}
	return out
}

var replayDeadLetters = actionKind{
	name: "replay dead letters", title: "Replay dead letters", path: "/dead/replay",
	parse: parseDeadTarget,
	count: countDead,
	dryRun: func(ctx context.Context, _ *Console, rq *request, t target) (stepResult, error) {
		res, err := rq.ob.ReplayDeadLetters(ctx, t.filter, &outbox.ReplayOpts{DryRun: true, DropConflictingTimerIDs: t.drop})
		if err != nil {
			return stepResult{}, err
		}
		return stepResult{
			msg: fmt.Sprintf("Dry run: %s would go back to the outbox, %s would stay in the dead-letter table.",
				plural(res.Replayed, "row", "rows"), plural(int64(len(res.Skipped)), "row", "rows")),
			details: capDetails(conflicts(res)),
			carry:   boundFields(res.UpToID, res.Matched),
		}, nil
	},
	run: func(ctx context.Context, c *Console, rq *request, t target) (stepResult, error) {
		bctx, progress, stopped, cancel := c.budget(ctx)
		defer cancel()
		res, err := rq.ob.ReplayDeadLetters(bctx, t.filter, &outbox.ReplayOpts{DropConflictingTimerIDs: t.drop, Progress: progress})
		r := stepResult{changed: changedSince(t, res.Matched),
			attrs: []any{"replayed", res.Replayed, "skipped", len(res.Skipped), "timer_ids_dropped", len(res.TimerIDsDropped),
				"matched", res.Matched}}
		r.attrs = append(r.attrs, boundAttr(res.Matched, res.UpToID)...)
		done := t.done + res.Replayed
		if stopped(err) {
			t.stoppedAt(&r, done, res.Matched, res.UpToID, "Replayed",
				"Continue to replay the rest: the rows replayed are no longer dead letters.")
			return r, nil
		}
		r.msg = fmt.Sprintf("Replayed %s; %s stayed in the dead-letter table.",
			plural(done, "dead letter", "dead letters"), plural(int64(len(res.Skipped)), "row", "rows"))
		r.details = capDetails(conflicts(res))
		if err == nil {
			var left string
			left, err = leftAbove(ctx, rq, t)
			r.details = appendNonEmpty(r.details, left)
		}
		return r, err
	},
}

// stoppedAt makes r the answer of a request of a large action that its
// time budget stopped after done dead letters (in all its requests): it
// says how far the action got, and carries what the next request needs
// to go on (the bound, when the action had none from a dry run).
func (t target) stoppedAt(r *stepResult, done, matched, upTo int64, verbed, rest string) {
	r.more, r.attrs = true, append(r.attrs, "partial", true)
	r.carry = url.Values{}
	if !t.bounded {
		r.carry = boundFields(upTo, matched)
	}
	r.carry.Set("done", strconv.FormatInt(done, 10))
	r.msg = fmt.Sprintf("%s %s so far, of %s; this page stopped to stay within its time. %s",
		verbed, plural(done, "dead letter", "dead letters"), num(max(t.expect, matched+t.done)), rest)
}

// appendNonEmpty appends s to lines unless it is empty.
func appendNonEmpty(lines []string, s string) []string {
	if s == "" {
		return lines
	}
	return append(lines, s)
}

var deleteDeadLetters = actionKind{
	name: "delete dead letters", title: "Delete dead letters", path: "/dead/delete",
	parse: parseDeadTarget,
	count: countDead,
	dryRun: func(ctx context.Context, _ *Console, rq *request, t target) (stepResult, error) {
		res, err := rq.ob.PurgeDeadLetters(ctx, t.filter, &outbox.PurgeOpts{DryRun: true})
		if err != nil {
			return stepResult{}, err
		}
		return stepResult{msg: fmt.Sprintf("Dry run: %s would be deleted for good.", plural(res.Matched, "dead letter", "dead letters")),
			carry: boundFields(res.UpToID, res.Matched)}, nil
	},
	run: func(ctx context.Context, c *Console, rq *request, t target) (stepResult, error) {
		bctx, progress, stopped, cancel := c.budget(ctx)
		defer cancel()
		res, err := rq.ob.PurgeDeadLetters(bctx, t.filter, &outbox.PurgeOpts{Progress: progress})
		r := stepResult{changed: changedSince(t, res.Matched),
			attrs: []any{"deleted", res.Deleted, "matched", res.Matched}}
		r.attrs = append(r.attrs, boundAttr(res.Matched, res.UpToID)...)
		done := t.done + res.Deleted
		if stopped(err) {
			t.stoppedAt(&r, done, res.Matched, res.UpToID, "Deleted", "Continue to delete the rest.")
			return r, nil
		}
		r.msg = fmt.Sprintf("Deleted %s.", plural(done, "dead letter", "dead letters"))
		if err == nil {
			var left string
			left, err = leftAbove(ctx, rq, t)
			r.details = appendNonEmpty(r.details, left)
		}
		return r, err
	},
}

func parseTimerTarget(form url.Values) (target, error) {
	t := target{queue: form.Get("q"), timer: form.Get("timer"), fields: url.Values{}}
	if t.queue == "" || t.timer == "" {
		return t, &outbox.InputError{Field: "timer", Rule: "name the queue and the timer id"}
	}
	t.fields.Set("q", t.queue)
	t.fields.Set("timer", t.timer)
	t.desc = fmt.Sprintf("timer %q of queue %q", t.timer, t.queue)
	return t, nil
}

func timerState(ctx context.Context, rq *request, t target) (string, error) {
	row, ok, err := rq.ob.RowByTimer(ctx, t.queue, t.timer)
	switch {
	case err != nil:
		return "", err
	case !ok:
		return fmt.Sprintf("The outbox holds no row for %s.", t.desc), nil
	case row.State == outbox.RowLeased || row.State == outbox.RowExpired:
		return fmt.Sprintf("Row %d holds %s, and a subscriber has claimed it: it can no longer be cancelled.", row.ID, t.desc), nil
	}
	return fmt.Sprintf("Row %d holds %s (%s, due %s).", row.ID, t.desc, row.State, stamp(row.NextAttemptAt)), nil
}

var cancelTimer = actionKind{
	name: "cancel timer", title: "Cancel a timer", path: "/timer/cancel",
	parse: parseTimerTarget,
	count: func(ctx context.Context, _ *Console, rq *request, t target) (string, error) {
		return timerState(ctx, rq, t)
	},
	dryRun: func(ctx context.Context, _ *Console, rq *request, t target) (stepResult, error) {
		s, err := timerState(ctx, rq, t)
		return stepResult{msg: "Dry run: " + s}, err
	},
	run: func(ctx context.Context, c *Console, rq *request, t target) (stepResult, error) {
		ok, err := rq.ob.CancelTimer(ctx, c.cfg.Pool, t.queue, t.timer)
		msg := fmt.Sprintf("Cancelled %s.", t.desc)
		if !ok {
			msg = fmt.Sprintf("Nothing to cancel: no unclaimed row holds %s.", t.desc)
		}
		return stepResult{msg: msg, attrs: []any{"cancelled", ok}}, err
	},
}

// parseQueueTarget reads the queue a pause or a resume names, and a
// pause's reason.
func parseQueueTarget(form url.Values) (target, error) {
	t := target{queue: form.Get("q"), reason: form.Get("reason"), fields: url.Values{}}
	if t.queue == "" {
		return t, &outbox.InputError{Field: "q", Rule: "name the queue"}
	}
	t.fields.Set("q", t.queue)
	if t.reason != "" {
		t.fields.Set("reason", t.reason)
	}
	t.desc = fmt.Sprintf("queue %q", t.queue)
	return t, nil
}

// queueState says whether t's queue is paused and how many of its rows
// are ready and scheduled (each counted up to the console's cap).
func queueState(ctx context.Context, c *Console, rq *request, t target) (paused *outbox.QueuePause, state string, err error) {
	ps, err := rq.ob.PausedQueues(ctx)
	if err != nil {
		return nil, "", err
	}
	for i := range ps {
		if ps[i].Queue == t.queue {
			paused = &ps[i]
		}
	}
	ds, err := rq.ob.QueueDepths(ctx, &outbox.DepthOptions{Cap: c.cfg.DepthCap})
	if err != nil {
		return nil, "", err
	}
	var d outbox.QueueDepth
	for _, x := range ds {
		if x.Queue == t.queue {
			d = x
		}
	}
	rows := fmt.Sprintf("%s ready and %s scheduled rows", count(d.Ready, c.cfg.DepthCap), count(d.Scheduled, c.cfg.DepthCap))
	if paused == nil {
		return nil, fmt.Sprintf("The %s runs: %s.", t.desc, rows), nil
	}
	why := ""
	if paused.Reason != "" {
		why = ": " + paused.Reason
	}
	return paused, fmt.Sprintf("The %s is paused since %s by %s%s; %s wait.", t.desc, stamp(paused.PausedAt), paused.PausedBy, why, rows), nil
}

// queueCount is the count step of a pause or a resume: what queueState
// says.
func queueCount(ctx context.Context, c *Console, rq *request, t target) (string, error) {
	_, s, err := queueState(ctx, c, rq, t)
	return s, err
}

var pauseQueue = actionKind{
	name: "pause queue", title: "Pause a queue", path: "/queue/pause",
	parse: parseQueueTarget,
	count: queueCount,
	dryRun: func(ctx context.Context, c *Console, rq *request, t target) (stepResult, error) {
		paused, s, err := queueState(ctx, c, rq, t)
		if paused != nil {
			return stepResult{msg: "Dry run: " + s + " Pausing it again changes nothing."}, err
		}
		return stepResult{msg: "Dry run: " + s + " Paused, no subscriber of it claims its rows from its next claim on; the rows being handled finish, and publishing goes on."}, err
	},
	run: func(ctx context.Context, _ *Console, rq *request, t target) (stepResult, error) {
		p, err := rq.ob.PauseQueue(ctx, t.queue, t.reason)
		if err != nil {
			return stepResult{}, err
		}
		return stepResult{msg: fmt.Sprintf("The %s is paused since %s by %s.", t.desc, stamp(p.PausedAt), p.PausedBy),
			attrs: []any{"paused_at", p.PausedAt, "reason", p.Reason}}, nil
	},
}

var resumeQueue = actionKind{
	name: "resume queue", title: "Resume a queue", path: "/queue/resume",
	parse: parseQueueTarget,
	count: queueCount,
	dryRun: func(ctx context.Context, c *Console, rq *request, t target) (stepResult, error) {
		paused, s, err := queueState(ctx, c, rq, t)
		if paused == nil {
			return stepResult{msg: "Dry run: " + s + " Nothing to resume."}, err
		}
		return stepResult{msg: "Dry run: " + s + " Resumed, its subscribers are woken and claim its rows at once."}, err
	},
	run: func(ctx context.Context, _ *Console, rq *request, t target) (stepResult, error) {
		resumed, err := rq.ob.ResumeQueue(ctx, t.queue)
		msg := fmt.Sprintf("Resumed the %s; its subscribers were woken.", t.desc)
		if !resumed {
			msg = fmt.Sprintf("Nothing to resume: the %s was not paused.", t.desc)
		}
		return stepResult{msg: msg, attrs: []any{"resumed", resumed}}, err
	},
}

// parseRowTarget reads the row an action on one row names, and a move's
// note.
func parseRowTarget(form url.Values) (target, error) {
	t := target{fields: url.Values{}, reason: form.Get("note")}
	id, err := strconv.ParseInt(form.Get("id"), 10, 64)
	if err != nil {
		return t, &outbox.InputError{Field: "id", Rule: "name the row by its id"}
	}
	t.row = id
	t.fields.Set("id", strconv.FormatInt(id, 10))
	if t.reason != "" {
		t.fields.Set("note", t.reason)
	}
	t.desc = fmt.Sprintf("row %d", id)
	return t, nil
}

// rowState says what row t is now, for an action's count and dry run.
func rowState(ctx context.Context, _ *Console, rq *request, t target) (string, error) {
	row, ok, err := rq.ob.Row(ctx, t.row)
	switch {
	case err != nil:
		return "", err
	case !ok:
		return fmt.Sprintf("The outbox holds no %s: it was delivered, dead-lettered or cancelled.", t.desc), nil
	case row.State == outbox.RowLeased || row.State == outbox.RowExpired:
		return fmt.Sprintf("A subscriber holds %s of queue %q (%s): its handler decides its outcome.", t.desc, row.Queue, row.State), nil
	}
	return fmt.Sprintf("%s of queue %q is %s, due %s, after %d attempts.", strings.ToUpper(t.desc[:1])+t.desc[1:], row.Queue, row.State,
		stamp(row.NextAttemptAt), row.Attempts), nil
}

// rowAction is an action on one row: its count and dry run say what the
// row is and what the action would do (would), and run does it, or says
// why it did nothing (unless).
func rowAction(name, title, path, would, unless string, do func(ctx context.Context, rq *request, t target) (bool, error)) actionKind {
	return actionKind{
		name: name, title: title, path: path, parse: parseRowTarget,
		count: rowState,
		dryRun: func(ctx context.Context, c *Console, rq *request, t target) (stepResult, error) {
			s, err := rowState(ctx, c, rq, t)
			return stepResult{msg: "Dry run: " + s + " " + would}, err
		},
		run: func(ctx context.Context, _ *Console, rq *request, t target) (stepResult, error) {
			ok, err := do(ctx, rq, t)
			msg := fmt.Sprintf("Done: %s.", strings.ToLower(title[:1])+title[1:])
			if !ok {
				msg = fmt.Sprintf("Nothing done: %s is gone, a subscriber holds it%s.", t.desc, unless)
			}
			return stepResult{msg: msg, attrs: []any{"row", t.row, "done", ok, "note", t.reason}}, err
		},
	}
}

var (
	retryRow = rowAction("retry row now", "Retry a row now", "/row/retry", "Confirmed, it is due now, and its queue's subscribers are woken.",
		", or it is not waiting for a later time (due, or behind its key's head)", func(ctx context.Context, rq *request, t target) (bool, error) { return rq.ob.RetryRowNow(ctx, t.row) })
	cancelRow     = rowAction("cancel row", "Cancel a row", "/row/cancel", "Confirmed, it is deleted and never delivered; a key's next row comes next.", "", func(ctx context.Context, rq *request, t target) (bool, error) { return rq.ob.CancelRow(ctx, t.row) })
	deadLetterRow = rowAction("dead-letter row", "Move a row to the dead letters", "/row/dead-letter",
		"Confirmed, it moves to the dead letters (reason rejected, the note as its last error), where it can be replayed.", "", func(ctx context.Context, rq *request, t target) (bool, error) {
			note := t.reason
			if note == "" {
				note = "moved to the dead letters from the console"
			}
			return rq.ob.DeadLetterRow(ctx, t.row, note)
		})
)

type actionData struct {
	Title   string
	Step    string
	Next    string
	Post    string
	Fields  [][2]string
	Message string
	Details []string
	// Changed says the set changed since the dry run.
	Changed string
	Drop    bool
	Replay  bool
	Back    string
}

// show puts what a step said on the page, and the fields the next step's
// form carries.
func (d *actionData) show(sr stepResult, t target) {
	d.Message, d.Details, d.Changed = sr.msg, sr.details, sr.changed
	if sr.more {
		d.Next = stepConfirm
	}
	if len(sr.carry) > 0 {
		for k, v := range sr.carry {
			t.fields[k] = v
		}
		d.Fields = t.fieldList()
	}
}

// maxForm bounds an action's form.
const maxForm = 1 << 20

func (c *Console) action(k actionKind) func(http.ResponseWriter, *http.Request, *request) {
	return func(w http.ResponseWriter, r *http.Request, rq *request) {
		if !c.cfg.Actions {
			c.refuse(w, r, rq, http.StatusForbidden, refusedActions, errors.New("actions are turned off in this console (Config.Actions, or -actions for outboxgen console)"))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxForm)
		if err := r.ParseForm(); err != nil {
			c.fail(w, r, rq, http.StatusBadRequest, err)
			return
		}
		if err := c.checkToken(r); err != nil {
			c.refuse(w, r, rq, http.StatusForbidden, refusedToken, err)
			return
		}
		t, err := k.parse(r.PostForm)
		if err != nil {
			c.fail(w, r, rq, http.StatusBadRequest, err)
			return
		}
		d := actionData{Title: k.title, Post: rq.base + k.path, Fields: t.fieldList(), Drop: t.drop,
			Replay: k.name == replayDeadLetters.name, Back: rq.base + "/dead"}
		nav := "dead"
		switch k.name {
		case cancelTimer.name:
			d.Back = rq.base + "/row?q=" + url.QueryEscape(t.queue) + "&timer=" + url.QueryEscape(t.timer)
			nav = "row"
		case pauseQueue.name, resumeQueue.name:
			d.Back = rq.base + "/queue?q=" + url.QueryEscape(t.queue)
			nav = "queues"
		case retryRow.name, cancelRow.name, deadLetterRow.name:
			d.Back = rq.base + "/row?id=" + strconv.FormatInt(t.row, 10)
			nav = "row"
		}
		ctx := r.Context()
		switch step := r.PostForm.Get("step"); step {
		case "", stepCount:
			d.Step, d.Next = stepCount, stepDryRun
			d.Message, err = k.count(ctx, c, rq, t)
		case stepDryRun:
			d.Step, d.Next = stepDryRun, stepConfirm
			var sr stepResult
			sr, err = k.dryRun(ctx, c, rq, t)
			d.show(sr, t)
		case stepConfirm:
			d.Step = stepConfirm
			var sr stepResult
			sr, err = k.run(ctx, c, rq, t)
			d.show(sr, t)
			attrs := sr.attrs
			log := append(c.attribution(r), "action", k.name, "outbox", rq.name.String(), "target", t.desc)
			log = append(append(log, selectionAttrs(t.filter.IDs)...), attrs...)
			if err != nil {
				c.cfg.Logger.ErrorContext(ctx, "console action failed", append(log, "err", err)...)
			} else {
				c.cfg.Logger.InfoContext(ctx, "console action", log...)
			}
		default:
			err = &outbox.InputError{Field: "step", Rule: fmt.Sprintf("%q is not one of count, dry-run, confirm", step)}
		}
		if err != nil {
			c.fail(w, r, rq, statusOf(err), err)
			return
		}
		c.render(w, r, http.StatusOK, "action", rq.view(k.title, nav, d), rq.start)
	}
}
