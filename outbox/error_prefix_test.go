package outbox

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/internal/pgtest"
)

// Every error the public API returns says "outbox: " once, at its start,
// however many layers wrapped it: on a schema that was never migrated, a
// missing role, bad input and bad configuration.
func TestErrorsSayOutboxOnce(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	ctx := t.Context()
	missing, err := New(d.Pool, &Config{Schema: d.Schema, Table: "never_migrated"})
	if err != nil {
		t.Fatal(err)
	}
	unreachable, err := New(unreachablePool(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	e := setup(t)
	pub, err := NewPublisher[string](missing, "q", nil)
	if err != nil {
		t.Fatal(err)
	}
	good := newPublisher[string](t, e, "q", nil)
	h := func(context.Context, *Message[string]) error { return nil }
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	// Each path must fail; its error is checked below.
	paths := []struct {
		name string
		call func() error
	}{
		{"Health on an unreachable database", func() error { _, err := unreachable.Health(ctx, nil); return err }},
		{"Migrate on an unreachable database", func() error { return unreachable.Migrate(ctx) }},
		{"Check on an unreachable database", func() error { return unreachable.Check(ctx) }},
		{"Health cancelled", func() error { _, err := e.ob.Health(cancelled, nil); return err }},
		{"Check on a missing table", func() error { return missing.Check(ctx) }},
		{"Publish on a missing table", func() error { _, err := pub.Publish(ctx, d.Pool, "x", nil); return err }},
		{"PublishBatch on a missing table", func() error { _, err := pub.PublishBatch(ctx, d.Pool, []string{"x"}, nil); return err }},
		{"Publish with a negative delay", func() error {
			_, err := good.Publish(ctx, e.pubPool, "x", &PublishOpts{Delay: -time.Second})
			return err
		}},
		{"Publish cancelled", func() error { _, err := good.Publish(cancelled, e.pubPool, "x", nil); return err }},
		{"publisher of a bad queue", func() error { _, err := NewPublisher[string](e.ob, "", nil); return err }},
		{"publisher of an oversized queue", func() error { _, err := NewPublisher[string](e.ob, strings.Repeat("q", 1000), nil); return err }},
		{"CancelTimer on a missing table", func() error { _, err := missing.CancelTimer(ctx, d.Pool, "q", "t"); return err }},
		{"QueueStats on a missing table", func() error { _, err := missing.QueueStats(ctx); return err }},
		{"QueueDepths on a missing table", func() error { _, err := missing.QueueDepths(ctx, nil); return err }},
		{"RetryBacklog on a missing table", func() error { _, err := missing.RetryBacklog(ctx, []string{"q"}); return err }},
		{"Unprocessed on a missing table", func() error { _, err := missing.Unprocessed(ctx, "q", 10); return err }},
		{"DeadLetters on a missing table", func() error { _, err := missing.DeadLetters(ctx, DeadLetterFilter{}, 0, 10); return err }},
		{"ReplayDeadLetters on a missing table", func() error { _, err := missing.ReplayDeadLetters(ctx, DeadLetterFilter{}, nil); return err }},
		{"PurgeDeadLetters on a missing table", func() error { _, err := missing.PurgeDeadLetters(ctx, DeadLetterFilter{}, nil); return err }},
		{"Grant to a missing role", func() error { return e.owner.Grant(ctx, Roles{Publisher: "no_such_role_" + d.Schema}) }},
		{"New with a bad table", func() error { _, err := New(d.Pool, &Config{Table: "Bad-Name"}); return err }},
		{"Migrations with a bad schema", func() error { _, err := Migrations(&Config{Schema: "pg_x"}); return err }},
		{"NewSubscriber with a bad config", func() error {
			_, err := NewSubscriber(e.ob, []string{"q"}, h, &SubscriberConfig[string]{Workers: -1})
			return err
		}},
		{"NewSubscriber with a bad retry", func() error {
			_, err := NewSubscriber(e.ob, []string{"q"}, h, &SubscriberConfig[string]{Retry: &ExponentialRetry{Jitter: 2}})
			return err
		}},
		{"Run on a missing table", func() error {
			s, err := NewSubscriber(missing, []string{"q"}, h, fastConfig[string](nil))
			if err != nil {
				return fmt.Errorf("unexpected: %w", err)
			}
			return s.Run(ctx)
		}},
	}
	for _, p := range paths {
		err := p.call()
		if err == nil {
			t.Errorf("%s: no error", p.name)
			continue
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "outbox: ") || len(saysOutbox.FindAllString(msg, -1)) != 1 {
			t.Errorf("%s: %q; want one \"outbox: \", at its start", p.name, msg)
		}
	}
	// The wrapping keeps what callers branch on.
	_, err = good.Publish(cancelled, e.pubPool, "x", nil)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Publish cancelled: %v; want it to wrap context.Canceled", err)
	}
}

// saysOutbox matches "outbox: " where a message or a wrapped one starts.
var saysOutbox = regexp.MustCompile(`(^|: )outbox: `)
