package outbox

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/internal/pgtest"
)

// Rows that land behind where a subscriber's claims stopped are
// delivered, with the public defaults: a row published in a transaction
// that stayed open while later rows were delivered, a row another client
// dated an hour early, and a key's next row, dated early too, whose
// hand-over the deleting transaction had to record (a writer of the key
// held it) and the subscriber completed. The key's rows come in order.
func TestRowsBehindWhereClaimsStoppedAreDelivered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var (
		mu      sync.Mutex
		handled []string
	)
	seen := func(p string) func() bool {
		return func() bool { mu.Lock(); defer mu.Unlock(); return slices.Contains(handled, p) }
	}
	cfg := &SubscriberConfig[[]byte]{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), ListenDSN: pgtest.ListenURL()}
	s := startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[[]byte]) error {
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, string(m.Payload))
		return nil
	}, cfg)
	pub := newPublisher[[]byte](t, e, "q", nil)
	publish := func(p string) {
		t.Helper()
		if _, err := pub.Publish(e.ctx, e.pubPool, []byte(p), nil); err != nil {
			t.Fatal(err)
		}
	}

	// A publisher's transaction stays open while a later row is
	// delivered.
	long := e.begin()
	if _, err := pub.Publish(e.ctx, long, []byte("long"), nil); err != nil {
		t.Fatal(err)
	}
	publish("after")
	eventually(t, "the later row delivered", seen("after"))
	if err := long.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the long transaction's row delivered", seen("long"))

	// Another client dates a row an hour early.
	e.exec(`INSERT INTO outbox (queue, payload, next_attempt_at) VALUES ('q', 'early', now() - interval '1 hour')`)
	eventually(t, "the row dated early delivered", seen("early"))

	// A key: its head, dated early; its next row written by a
	// transaction that holds the key while the head is deleted. The
	// subscriber may take the head before the transaction writes (the
	// next row is then the key's head, not blocked): that key is given up
	// and another tried.
	want := []string{"after", "long", "early"}
	for try := 1; ; try++ {
		head, next := fmt.Sprintf("k%d head", try), fmt.Sprintf("k%d next", try)
		key := fmt.Sprintf("k%d", try)
		e.exec(`INSERT INTO outbox (queue, payload, ordering_key, next_attempt_at) VALUES ('q', $1, $2, now() - interval '1 hour')`, head, key)
		want = append(want, head)
		writer, err := e.db.Pool.Begin(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		var blocked bool
		if err := writer.QueryRow(e.ctx, `INSERT INTO outbox (queue, payload, ordering_key, next_attempt_at)
			VALUES ('q', $1, $2, now() - interval '1 hour') RETURNING blocked`, next, key).Scan(&blocked); err != nil {
			t.Fatal(err)
		}
		if !blocked {
			_ = writer.Rollback(e.ctx)
			eventually(t, "the key's head delivered", seen(head))
			if try == 5 {
				t.Fatalf("the subscriber took the key's head before its next row was written %d times", try)
			}
			continue
		}
		eventually(t, "the key's head delivered", seen(head))
		eventually(t, "the key's hand-over recorded", func() bool { return e.count("outbox_handoff") == 1 })
		if err := writer.Commit(e.ctx); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the key's next row delivered", seen(next))
		want = append(want, next)
		break
	}
	if err := s.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff(want, handled); diff != "" {
		t.Errorf("handled (-want +got):\n%s", diff)
	}
}
