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
	// dryRun says what it would do, doing nothing.
	dryRun func(ctx context.Context, c *Console, rq *request, t target) (string, []string, error)
	// run does it, and says what it did; attrs go to the action log.
	run func(ctx context.Context, c *Console, rq *request, t target) (string, []string, []any, error)
}

// target is what an action acts on.
type target struct {
	filter outbox.DeadLetterFilter
	queue  string
	timer  string
	drop   bool
	// desc describes it for people and the action log.
	desc string
	// fields are the form fields that name it.
	fields url.Values
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
	if form.Get("scope") == "selection" {
		if len(ff.IDs) == 0 {
			return t, &outbox.InputError{Field: "id", Rule: "select at least one dead letter"}
		}
		if len(ff.IDs) > maxSelection {
			return t, &outbox.InputError{Field: "id", Rule: fmt.Sprintf("select at most %d dead letters at once", maxSelection)}
		}
		t.filter = outbox.DeadLetterFilter{IDs: ff.IDs}
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
	f.IDs = nil
	t.filter = f
	t.fields["scope"] = []string{"filter"}
	var parts []string
	for _, p := range [][3]string{{"q", ff.Queue, "queue %q"}, {"reason", ff.Reason, "reason %s"}, {"older", ff.Older, "failed over %s ago"}} {
		if p[1] != "" {
			t.fields.Set(p[0], p[1])
			parts = append(parts, fmt.Sprintf(p[2], p[1]))
		}
	}
	t.desc = "every dead letter"
	if len(parts) > 0 {
		t.desc = "the dead letters of " + strings.Join(parts, ", ")
	}
	return t, nil
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
	dryRun: func(ctx context.Context, _ *Console, rq *request, t target) (string, []string, error) {
		res, err := rq.ob.ReplayDeadLetters(ctx, t.filter, &outbox.ReplayOpts{DryRun: true, DropConflictingTimerIDs: t.drop})
		if err != nil {
			return "", nil, err
		}
		return fmt.Sprintf("Dry run: %s would go back to the outbox, %s would stay in the dead-letter table.",
			plural(res.Replayed, "row", "rows"), plural(int64(len(res.Skipped)), "row", "rows")), conflicts(res), nil
	},
	run: func(ctx context.Context, _ *Console, rq *request, t target) (string, []string, []any, error) {
		res, err := rq.ob.ReplayDeadLetters(ctx, t.filter, &outbox.ReplayOpts{DropConflictingTimerIDs: t.drop})
		msg := fmt.Sprintf("Replayed %s; %s stayed in the dead-letter table.",
			plural(res.Replayed, "dead letter", "dead letters"), plural(int64(len(res.Skipped)), "row", "rows"))
		return msg, conflicts(res), []any{"replayed", res.Replayed, "skipped", len(res.Skipped),
			"timer_ids_dropped", len(res.TimerIDsDropped)}, err
	},
}

var deleteDeadLetters = actionKind{
	name: "delete dead letters", title: "Delete dead letters", path: "/dead/delete",
	parse: parseDeadTarget,
	count: countDead,
	dryRun: func(ctx context.Context, c *Console, rq *request, t target) (string, []string, error) {
		n, err := rq.ob.CountDeadLetters(ctx, t.filter)
		if err != nil {
			return "", nil, err
		}
		return fmt.Sprintf("Dry run: %s would be deleted for good.", plural(n, "dead letter", "dead letters")), nil, nil
	},
	run: func(ctx context.Context, _ *Console, rq *request, t target) (string, []string, []any, error) {
		n, err := rq.ob.PurgeDeadLetters(ctx, t.filter)
		return fmt.Sprintf("Deleted %s.", plural(n, "dead letter", "dead letters")), nil, []any{"deleted", n}, err
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
	dryRun: func(ctx context.Context, _ *Console, rq *request, t target) (string, []string, error) {
		s, err := timerState(ctx, rq, t)
		return "Dry run: " + s, nil, err
	},
	run: func(ctx context.Context, c *Console, rq *request, t target) (string, []string, []any, error) {
		ok, err := rq.ob.CancelTimer(ctx, c.cfg.Pool, t.queue, t.timer)
		msg := fmt.Sprintf("Cancelled %s.", t.desc)
		if !ok {
			msg = fmt.Sprintf("Nothing to cancel: no unclaimed row holds %s.", t.desc)
		}
		return msg, nil, []any{"cancelled", ok}, err
	},
}

type actionData struct {
	Title   string
	Step    string
	Next    string
	Post    string
	Fields  [][2]string
	Message string
	Details []string
	Drop    bool
	Replay  bool
	Back    string
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
		if k.name == cancelTimer.name {
			d.Back = rq.base + "/row?q=" + url.QueryEscape(t.queue) + "&timer=" + url.QueryEscape(t.timer)
			nav = "row"
		}
		ctx := r.Context()
		switch step := r.PostForm.Get("step"); step {
		case "", stepCount:
			d.Step, d.Next = stepCount, stepDryRun
			d.Message, err = k.count(ctx, c, rq, t)
		case stepDryRun:
			d.Step, d.Next = stepDryRun, stepConfirm
			d.Message, d.Details, err = k.dryRun(ctx, c, rq, t)
		case stepConfirm:
			var attrs []any
			d.Step = stepConfirm
			d.Message, d.Details, attrs, err = k.run(ctx, c, rq, t)
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
