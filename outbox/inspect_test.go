package outbox

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestRetryBacklog(t *testing.T) {
	t.Parallel()
	e := setup(t)
	backlog := func(queues ...string) RetryBacklog {
		t.Helper()
		b, err := e.ob.RetryBacklog(e.ctx, queues)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	e.publish("q")                                                                                             // due now, never handled
	e.exec(`INSERT INTO outbox (queue, payload, next_attempt_at) VALUES ('q', '', now() + interval '1 hour')`) // scheduled at publish
	if diff := cmp.Diff(RetryBacklog{}, backlog("q")); diff != "" {
		t.Errorf("rows never handled (-want +got):\n%s", diff)
	}

	e.exec(`INSERT INTO outbox (queue, payload, attempts_count, next_attempt_at) VALUES
		('q', '', 1, now() + interval '10 minutes'), ('q', '', 2, now() + interval '20 minutes'),
		('other', '', 1, now() + interval '5 minutes')`)
	approx := cmp.Comparer(func(a, b time.Duration) bool { return (a - b).Abs() < time.Second })
	if diff := cmp.Diff(RetryBacklog{Rows: 2, NextDueIn: 10 * time.Minute}, backlog("q"), approx); diff != "" {
		t.Errorf("waiting retries (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(RetryBacklog{Rows: 3, NextDueIn: 5 * time.Minute}, backlog("q", "other"), approx); diff != "" {
		t.Errorf("two queues (-want +got):\n%s", diff)
	}
	e.exec(`UPDATE outbox SET next_attempt_at = now() - interval '1 minute' WHERE queue = 'other'`)
	if diff := cmp.Diff(RetryBacklog{Rows: 1, NextDueIn: -time.Minute}, backlog("other"), approx); diff != "" {
		t.Errorf("an overdue retry (-want +got):\n%s", diff)
	}
	e.exec(`UPDATE outbox SET next_attempt_at = now() WHERE queue = 'other'`)
	e.claim(1, "other")
	if diff := cmp.Diff(RetryBacklog{Rows: 1, NextDueIn: 0}, backlog("other")); diff != "" {
		t.Errorf("a retry being handled (-want +got):\n%s", diff)
	}

	var in *InputError
	if _, err := e.ob.RetryBacklog(e.ctx, nil); !errors.As(err, &in) {
		t.Errorf("no queues: %v, want an *InputError", err)
	}
	var ce *ConfigError
	if _, err := e.ob.RetryBacklog(e.ctx, []string{"q", ""}); !errors.As(err, &ce) || ce.Field != "queues[1]" {
		t.Errorf("an empty queue: %v, want a *ConfigError for queues[1]", err)
	}
}

// UnprocessedTx sees the rows its transaction published and has not
// committed, which Unprocessed, on the pool, does not.
func TestUnprocessedTxReadsWithinTheTransaction(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub, err := NewPublisher[string](e.ob, "q", nil)
	if err != nil {
		t.Fatal(err)
	}
	committed := e.publish("q")
	tx, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	uncommitted, err := pub.Publish(e.ctx, tx, "in tx", nil)
	if err != nil {
		t.Fatal(err)
	}
	ids := func(rows []PendingMessage, err error) []int64 {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		out := []int64{}
		for _, r := range rows {
			out = append(out, r.ID)
		}
		return out
	}
	if diff := cmp.Diff([]int64{committed, uncommitted}, ids(e.ob.UnprocessedTx(e.ctx, tx, "q", 10))); diff != "" {
		t.Errorf("UnprocessedTx (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{committed}, ids(e.ob.Unprocessed(e.ctx, "q", 10))); diff != "" {
		t.Errorf("Unprocessed (-want +got):\n%s", diff)
	}
	var in *InputError
	if _, err := e.ob.UnprocessedTx(e.ctx, nil, "q", 10); !errors.As(err, &in) || in.Field != "tx" {
		t.Errorf("nil tx: %v, want an *InputError for tx", err)
	}
	if _, err := e.ob.UnprocessedTx(e.ctx, tx, "q", 0); !errors.As(err, &in) || in.Field != "limit" {
		t.Errorf("limit 0: %v, want an *InputError for limit", err)
	}
}

// Outboxes finds every outbox of the database by its shape, whatever its
// version, and not its dead-letter or other tables.
func TestOutboxes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	other, err := New(e.db.Pool, &Config{Schema: e.ob.Schema(), Table: "events"})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Migrate(e.ctx); err != nil {
		t.Fatal(err)
	}
	if err := other.MigrateDownTo(e.ctx, 1); err != nil {
		t.Fatal(err)
	}
	e.exec(`CREATE TABLE lookalike (queue text, payload bytea)`)
	all, err := e.ob.Outboxes(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var mine []OutboxName
	for _, n := range all {
		if n.Schema == e.ob.Schema() {
			mine = append(mine, n)
		}
	}
	want := []OutboxName{{e.ob.Schema(), "events"}, {e.ob.Schema(), "outbox"}}
	if diff := cmp.Diff(want, mine); diff != "" {
		t.Errorf("outboxes of the schema (-want +got):\n%s", diff)
	}
	if s := want[0].String(); s != e.ob.Schema()+".events" {
		t.Errorf("String: %q", s)
	}
}
