package browser_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/outbox"
)

// walkStep is one of the operator's questions as the walk answered it:
// how many clicks from the Queues page, and how long the browser took.
type walkStep struct {
	question string
	clicks   int
	took     time.Duration
}

// TestAnOperatorAnswersTheFiveEverydayQuestions walks the console as an
// operator does, from the outbox's Queues page, on an outbox with a
// running subscriber, a queue nobody claims whose rows have waited ten
// minutes, a key held behind its scheduled head, and 23 dead letters of
// two causes, 20 of which the operator replays once their cause is fixed:
//
//  1. Is the subscriber alive?
//  2. Is anything stuck?
//  3. Why did these dead-letter?
//  4. Which key is blocking?
//  5. Replay these 20 dead letters.
//
// Each answer is read off the page the way an operator reads it, and each
// page is saved as a screenshot (walk-N-….png); the clicks and the time
// of each question are logged and written beside them (walk.txt).
func TestAnOperatorAnswersTheFiveEverydayQuestions(t *testing.T) {
	chromiumPath(t)
	t.Parallel()
	f := newOutbox(t)
	ob := f.Outbox

	// The orders' subscriber: payments time out for the first 20 orders
	// and reject 3 unknown customers, until the operator fixes payments.
	c := &consumer{verdict: func(m *outbox.Message[[]byte]) error {
		p := string(m.Payload)
		switch {
		case strings.Contains(p, `"customer":"unknown`):
			return outbox.Reject(fmt.Errorf("unknown customer %s", strings.TrimSuffix(strings.SplitN(p, `"customer":"unknown-`, 2)[1], `"}`)))
		case strings.Contains(p, `"pay":"slow"`):
			return fmt.Errorf("payments: order %d timed out after %ds", m.ID, 30+m.ID%7)
		}
		return nil
	}}
	subscribeAs(t, ob, "checkout-worker", []string{"orders"}, c)
	for i := range 20 {
		publish(t, f, jsonBytes{}, "orders", fmt.Appendf(nil, `{"order":%d,"pay":"slow"}`, i), nil)
	}
	for i := range 3 {
		publish(t, f, jsonBytes{}, "orders", fmt.Appendf(nil, `{"order":%d,"customer":"unknown-%d"}`, 100+i, 7000+i), nil)
	}
	// A key whose head is scheduled an hour from now holds two rows back.
	publish(t, f, jsonBytes{}, "orders", []byte(`{"order":200,"step":"capture"}`), &outbox.PublishOpts{OrderingKey: "cus_4711", Delay: time.Hour})
	for i := range 2 {
		publish(t, f, jsonBytes{}, "orders", fmt.Appendf(nil, `{"order":200,"step":%d}`, i), &outbox.PublishOpts{OrderingKey: "cus_4711"})
	}
	// Emails nobody claims, ready for ten minutes.
	for i := range 3 {
		publish(t, f, jsonBytes{}, "emails", fmt.Appendf(nil, `{"email":%d}`, i), nil)
	}
	table := pgx.Identifier{f.Schema, ob.Table()}.Sanitize()
	if _, err := f.Pool.Exec(t.Context(), `UPDATE `+table+` SET created_at = now() - interval '10 minutes',
		next_attempt_at = now() - interval '10 minutes' WHERE queue = 'emails'`); err != nil {
		t.Fatal(err)
	}
	waitDeadLetters(t, ob, 23)

	srv := serveConsole(t, f, true)
	p := newPage(t, srv.URL)
	base := outboxPath(f)
	var steps []walkStep
	clicks := 0
	click := func(sel string) { p.click(sel); clicks++ }
	ask := func(question string, answer func()) {
		t.Helper()
		clicks = 0
		p.open(base + "/")
		start := time.Now()
		answer()
		steps = append(steps, walkStep{question, clicks, time.Since(start)})
	}

	ask("Is the subscriber alive?", func() {
		row := `table#subscribers tr.subscriber[data-name="checkout-worker"]`
		if got := p.text(row + " td.queues"); got != "orders" {
			t.Errorf("the subscriber's queues read %q, want orders", got)
		}
		if got := p.text(row + " td.state"); got != "claiming" && got != "asleep" {
			t.Errorf("the subscriber reads %q, want claiming or asleep", got)
		}
		p.shot("walk-1-subscribers.png")
	})
	ask("Is anything stuck?", func() {
		click("a#nav-health")
		problems := p.text("ul#problems")
		if !strings.Contains(problems, `queue "emails" has ready rows (3), the oldest waiting 10m`) ||
			!strings.Contains(problems, "no running subscriber of it") {
			t.Errorf("health's problems = %q; want the emails waiting with no subscriber", problems)
		}
		if strings.Contains(problems, `"orders"`) {
			t.Errorf("health reports the claimed orders: %q", problems)
		}
		p.shot("walk-2-health.png")
	})
	ask("Why did these dead-letter?", func() {
		click("a#nav-dead")
		first := `table#causes tr.cause:first-child`
		if got := p.text(first + " td.error-text"); got != "payments: order # timed out after #s" {
			t.Errorf("the largest cause reads %q", got)
		}
		if got := p.text(first + " td.rows"); got != "20" {
			t.Errorf("the largest cause holds %q dead letters, want 20", got)
		}
		if got := p.text(`table#causes tr.cause:nth-child(2) td.error-text`); got != "rejected: unknown customer #" {
			t.Errorf("the second cause reads %q", got)
		}
		p.shot("walk-3-causes.png")
	})
	ask("Which key is blocking?", func() {
		click("a#nav-keys")
		row := `table#keys tr.key[data-key="cus_4711"]`
		if got := p.text(row + " td.state"); got != "scheduled" {
			t.Errorf("the held key's head is %q, want scheduled", got)
		}
		if got := p.text(row + " td.waiting"); got != "2" {
			t.Errorf("the held key holds %q rows back, want 2", got)
		}
		p.shot("walk-4-keys.png")
	})
	// Payments are fixed: the replayed rows are accepted.
	c.acceptAll.Store(true)
	ask("Replay these 20 dead letters", func() {
		click("a#nav-dead")
		click(`table#causes tr.cause:first-child form.replay-cause button`)
		if got := p.text("p#count"); !strings.Contains(got, "20 rows") || !strings.Contains(got, `cause "payments: order # timed out after #s"`) {
			t.Errorf("the replay's count = %q", got)
		}
		click("button#dry-run")
		if got := p.text("p#dry-result"); !strings.Contains(got, "20 rows would go back to the outbox") {
			t.Errorf("the replay's dry run = %q", got)
		}
		click("button#confirm")
		if got := p.text("p#result"); !strings.Contains(got, "Replayed 20 dead letters") {
			t.Errorf("the replay's result = %q", got)
		}
		p.shot("walk-5-replayed.png")
	})
	eventually(t, "the subscriber handles the 20 replayed orders", 30*time.Second, func(context.Context) (bool, error) {
		for i := range 20 {
			if !c.accepted(fmt.Sprintf(`{"order":%d,"pay":"slow"}`, i)) {
				return false, nil
			}
		}
		return true, nil
	})
	if n := countDeadLetters(t, ob, outbox.DeadLetterFilter{}); n != 3 {
		t.Errorf("%d dead letters after the replay; want the 3 unknown customers'", n)
	}

	var b strings.Builder
	fmt.Fprintf(&b, "%-32s %6s %8s\n", "question", "clicks", "seconds")
	for _, s := range steps {
		fmt.Fprintf(&b, "%-32s %6d %8.2f\n", s.question, s.clicks, s.took.Seconds())
	}
	t.Logf("the five questions, from the Queues page:\n%s", b.String())
	if err := os.WriteFile(filepath.Join(p.dir, "walk.txt"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}
