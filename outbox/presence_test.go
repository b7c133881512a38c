package outbox

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/outboxgen/outboxgen/internal/dbx"
)

// subscribersNamed returns the presence records of the subscribers named
// in names, by name.
func subscribersNamed(t *testing.T, ob *Outbox, names ...string) map[string]SubscriberInfo {
	t.Helper()
	all, err := ob.Subscribers(t.Context())
	if err != nil {
		t.Fatalf("Subscribers: %v", err)
	}
	out := map[string]SubscriberInfo{}
	for _, s := range all {
		if slices.Contains(names, s.Name) {
			out[s.Name] = s
		}
	}
	return out
}

// Each running subscriber shows itself: its process, queues, workers,
// claim path and what it does (asleep when its claims find nothing, a
// handler busy with a row in hand), refreshed every SubscriberPresenceInterval; its record
// goes when Run returns. As the subscriber role in the roles leg.
func TestSubscribersShowsEachRunningSubscriber(t *testing.T) {
	t.Parallel()
	e := setup(t)
	inHand, release := make(chan struct{}), make(chan struct{})
	cfg := fastConfig[string](nil)
	cfg.Name = "billing"
	byLock := startSub(t, e.ob, []string{"invoices", "refunds"}, func(_ context.Context, m *Message[string]) error {
		close(inHand)
		<-release
		return nil
	}, cfg)
	lease := fastConfig[string](nil)
	lease.Name, lease.LockWindow, lease.Workers = "mailer", -1, 2
	byLease := startSub(t, e.ob, []string{"mail"}, func(context.Context, *Message[string]) error { return nil }, lease)

	host, _ := os.Hostname()
	eventually(t, "both subscribers asleep", func() bool {
		s := subscribersNamed(t, e.ob, "billing", "mailer")
		return len(s) == 2 && s["billing"].State == "asleep" && s["mailer"].State == "asleep"
	})
	got := subscribersNamed(t, e.ob, "billing", "mailer")
	ignore := cmpopts.IgnoreFields(SubscriberInfo{}, "ID", "StateSince", "LastClaimAt", "StartedAt", "SeenAt")
	want := map[string]SubscriberInfo{
		"billing": {Name: "billing", Host: host, PID: os.Getpid(), Queues: []string{"invoices", "refunds"}, Workers: 4,
			ClaimPath: "lock", State: "asleep"},
		"mailer": {Name: "mailer", Host: host, PID: os.Getpid(), Queues: []string{"mail"}, Workers: 2, ClaimPath: "lease",
			State: "asleep"},
	}
	if diff := cmp.Diff(want, got, ignore); diff != "" {
		t.Errorf("Subscribers (-want +got):\n%s", diff)
	}
	for name, s := range got {
		if s.LastClaimAt.IsZero() || s.StartedAt.IsZero() || s.SeenAt.Before(s.StartedAt) || s.StateSince.IsZero() || s.ID == "" {
			t.Errorf("%s: times or id unset: %+v", name, s)
		}
	}

	if _, err := newPublisher[string](t, e, "refunds", nil).Publish(e.ctx, e.pubPool, "refund", nil); err != nil {
		t.Fatal(err)
	}
	<-inHand
	// The next write (within SubscriberPresenceInterval) shows the row in
	// hand (its claims, which find no more, say asleep).
	eventuallyWithin(t, "the busy subscriber shown busy", 3*SubscriberPresenceInterval, func() bool {
		s := subscribersNamed(t, e.ob, "billing")["billing"]
		return s.Busy == 1 && s.InFlight == 1
	})
	close(release)
	for _, s := range []*started{byLock, byLease} {
		if err := s.stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	if s := subscribersNamed(t, e.ob, "billing", "mailer"); len(s) != 0 {
		t.Errorf("after Run returned, Subscribers shows %+v", s)
	}
}

// A subscriber that stopped without removing its record (its process
// was killed, froze or lost the database) is shown gone once its record
// is three intervals old.
func TestSubscribersShowsAGoneSubscriber(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := fastConfig[string](nil)
	cfg.Name = "frozen"
	s := startSub(t, e.ob, []string{"q"}, func(context.Context, *Message[string]) error { return nil }, cfg)
	eventually(t, "the subscriber shown", func() bool { return len(subscribersNamed(t, e.ob, "frozen")) == 1 })
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	// As a killed process leaves it: written, never deleted, now old.
	e.exec(`INSERT INTO outbox_subscribers (id, name, host, pid, queues, workers, busy, in_flight, claim_path, state,
		state_since, every_seconds, seen_at)
		VALUES (gen_random_uuid(), 'frozen', 'h', 1, '{q}', 4, 1, 1, 'lock', 'claiming', now(), $1, now() - $2 * interval '1 second')`,
		SubscriberPresenceInterval.Seconds(), 3*SubscriberPresenceInterval.Seconds()+1)
	got := subscribersNamed(t, e.ob, "frozen")
	if s, ok := got["frozen"]; !ok || !s.Gone {
		t.Errorf("a record three intervals old: %+v; want it shown gone", got)
	}
	e.exec(`UPDATE outbox_subscribers SET seen_at = now() WHERE name = 'frozen'`)
	if s := subscribersNamed(t, e.ob, "frozen")["frozen"]; s.Gone {
		t.Errorf("a fresh record is shown gone: %+v", s)
	}
}

// Only the subscriber role reads the presence records; an outbox whose
// schema predates them gives the *SchemaError that names the fix.
func TestSubscribersNeedsTheSubscriberRoleAndSchema14(t *testing.T) {
	t.Parallel()
	e := setupRoles(t)
	if _, err := e.pub.Subscribers(e.ctx); dbx.SQLState(err) != "42501" {
		t.Errorf("Subscribers as the publisher = %v; want insufficient_privilege (42501)", err)
	}
	if _, err := e.sub.Subscribers(e.ctx); err != nil {
		t.Errorf("Subscribers as the subscriber: %v", err)
	}
	old := atVersion(t, 13)
	var se *SchemaError
	if _, err := old.ob.Subscribers(old.ctx); !errors.As(err, &se) || se.Version != 13 {
		t.Errorf("Subscribers at schema 13 = %v; want a *SchemaError", err)
	}
}

// Health makes a queue's wait a problem: ready rows and no running
// subscriber of the queue for Unclaimed, or an oldest ready row older
// than ReadyWait while its subscribers run; a paused queue is neither.
func TestHealthReportsQueuesThatWait(t *testing.T) {
	t.Parallel()
	e := setup(t)
	publish := func(queue string, n int) {
		t.Helper()
		if _, err := newPublisher[string](t, e, queue, nil).PublishBatch(e.ctx, e.pubPool, slices.Repeat([]string{"x"}, n), nil); err != nil {
			t.Fatal(err)
		}
	}
	publish("unclaimed", 2)
	publish("paused", 1)
	if _, err := e.ob.PauseQueue(e.ctx, "paused", ""); err != nil {
		t.Fatal(err)
	}
	inHand, release := make(chan struct{}, 1), make(chan struct{})
	defer close(release)
	cfg := fastConfig[string](nil)
	cfg.Name, cfg.Workers, cfg.FetchBatchSize = "slow", 1, 1
	startSub(t, e.ob, []string{"slow"}, func(ctx context.Context, m *Message[string]) error {
		inHand <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}, cfg)
	publish("slow", 3)
	<-inHand
	eventually(t, "the slow queue's subscriber shown", func() bool { return len(subscribersNamed(t, e.ob, "slow")) == 1 })

	opts := &HealthOptions{ReadyWait: time.Millisecond, Unclaimed: time.Millisecond}
	var h Health
	eventually(t, "both waits reported", func() bool {
		var err error
		if h, err = e.ob.Health(e.ctx, opts); err != nil {
			t.Fatal(err)
		}
		return len(h.Problems) >= 2
	})
	var waits []string
	for _, p := range h.Problems {
		switch {
		case strings.HasPrefix(p, `queue "unclaimed" has ready rows (2), the oldest waiting `) &&
			strings.Contains(p, "and no running subscriber of it has shown itself"):
			waits = append(waits, "unclaimed")
		case strings.HasPrefix(p, `queue "slow"'s oldest ready row has waited `):
			waits = append(waits, "slow")
		case strings.Contains(p, `"paused"`):
			t.Errorf("a paused queue's wait is a problem: %s", p)
		}
	}
	if diff := cmp.Diff([]string{"unclaimed", "slow"}, waits, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("the waits among the problems (-want +got):\n%s\n%q", diff, h.Problems)
	}
	// At the defaults (a minute, five minutes) rows this young are no
	// problem.
	if h, err := e.ob.Health(e.ctx, nil); err != nil || slices.ContainsFunc(h.Problems, func(p string) bool { return strings.HasPrefix(p, "queue ") }) {
		t.Errorf("Health at the defaults: %v, %q", err, h.Problems)
	}
}
