package outbox

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/engine"
)

// More keys wait for their hand-over than PostgreSQL's lock table holds
// (6,400 locks with the server's defaults, and some slack: schema 8's
// hand-over, which locked every recorded key at once, failed with "out
// of shared memory" from between 11,000 and 16,000 keys on an idle server
// with max_connections 100): 20,000 keys, two rows each, published at
// REPEATABLE READ, so that every key's rows wait for a recorded
// hand-over. Three subscribers with the public defaults, whose
// claims end by deleting thousands of heads of distinct keys at once,
// hand every key on and handle every row, each key's in order.
func TestHandOversOfMoreKeysThanTheLockTableHoldsAreAllCompleted(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const keys = 20_000
	// Inserted by SQL, as any client may, a thousand keys per
	// transaction; the rows carry no message type, so a subscriber of
	// []byte takes them.
	for first := 0; first < keys; first += 1000 {
		if err := pgx.BeginTxFunc(e.ctx, e.db.Pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
			_, err := tx.Exec(e.ctx, `INSERT INTO outbox (queue, payload, ordering_key)
				SELECT 'q', convert_to(format('k%s %s', k, n), 'UTF8'), 'k' || k
				FROM generate_series($1::integer, $1::integer + 999) AS k, generate_series(1, 2) AS n
				ORDER BY k, n`, first)
			return err
		}); err != nil {
			t.Fatalf("publish: %v", err)
		}
	}
	published := time.Now()
	if n := e.count("outbox_handoff"); n < keys {
		t.Fatalf("%d hand-overs recorded, want at least %d", n, keys)
	}

	var (
		mu      sync.Mutex
		handled = map[string][]string{}
		rows    int
	)
	h := func(_ context.Context, m *Message[[]byte]) error {
		mu.Lock()
		defer mu.Unlock()
		handled[m.OrderingKey] = append(handled[m.OrderingKey], string(m.Payload))
		rows++
		return nil
	}
	var subs []*started
	for range 3 {
		subs = append(subs, startSub(t, e.ob, []string{"q"}, h, nil))
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		mu.Lock()
		n := rows
		mu.Unlock()
		if n >= 2*keys {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d rows handled in 3 minutes; %d hand-overs recorded", n, 2*keys, e.count("outbox_handoff"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i, s := range subs {
		if err := s.stop(); err != nil {
			t.Errorf("Run of subscriber %d: %v", i, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(handled) != keys {
		t.Errorf("%d keys handled, want %d", len(handled), keys)
	}
	t.Logf("%d rows of %d keys handled %v after they were published", rows, keys, time.Since(published).Round(time.Millisecond))
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		if diff := cmp.Diff([]string{key + " 1", key + " 2"}, handled[key]); diff != "" {
			t.Errorf("key %s (-want +got):\n%s", key, diff)
			break
		}
	}
	if n := e.count("outbox"); n != 0 {
		t.Errorf("%d rows left", n)
	}
}

// handOff completes the recorded hand-overs of queues as a subscriber
// does, and returns how many keys another transaction still holds.
func (e *env) handOff(queues ...string) (int32, error) {
	e.t.Helper()
	var waiting int32
	for {
		r, err := e.q.HandOff(e.ctx, db.HandOffParams{Queues: queues, MaxKeys: engine.HandoffMaxKeys})
		if err != nil {
			return 0, err
		}
		waiting += r.Waiting
		if !r.More {
			return waiting, nil
		}
	}
}
