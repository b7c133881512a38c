package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/localpg"
)

// A publisher that prepares its transaction (PREPARE TRANSACTION, then
// COMMIT PREPARED) while a subscriber of the queue sleeps publishes
// without error, keyed and unkeyed, at READ COMMITTED and REPEATABLE
// READ, and the subscriber handles every row, each key's in order. A
// session that says it never prepares (outboxgen.notify = on) is still
// notified of. The test runs on a cluster of its own: prepared
// transactions need max_prepared_transactions > 0, which the test server
// need not have.
func TestPublishersThatPrepareTheirTransactionsWhileASubscriberSleepsSucceed(t *testing.T) {
	t.Parallel()
	srv, err := localpg.StartCluster(t.Context(), "max_prepared_transactions=4")
	if errors.Is(err, localpg.ErrNoServerBinaries) {
		t.Skipf("prepared transactions need a server with max_prepared_transactions > 0, and none can be started here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	pool, err := pgxpool.New(t.Context(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ob, err := New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	pub, err := NewPublisher[string](ob, "q", nil)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		handled []string
	)
	s := startSub(t, ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, m.Payload)
		return nil
	}, fastConfig[string](nil))
	asleep := func() bool {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM outbox_sleepers WHERE until > now()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}

	var want []string
	for i, iso := range []string{"read committed", "repeatable read"} {
		eventually(t, "the subscriber asleep", asleep)
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, "BEGIN ISOLATION LEVEL "+iso); err != nil {
			t.Fatal(err)
		}
		for _, o := range []*PublishOpts{nil, {OrderingKey: "k"}} {
			p := fmt.Sprintf("%s key=%v", iso, o != nil)
			if _, err := pub.Publish(ctx, c, p, o); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			want = append(want, p)
		}
		gid := fmt.Sprintf("outbox-test-%d", i)
		if _, err := c.Exec(ctx, "PREPARE TRANSACTION '"+gid+"'"); err != nil {
			t.Errorf("PREPARE TRANSACTION at %s while a subscriber sleeps: %v", iso, err)
		} else if _, err := c.Exec(ctx, "COMMIT PREPARED '"+gid+"'"); err != nil {
			t.Fatal(err)
		}
		c.Release()
		eventually(t, "the rows of the prepared transaction handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(handled) >= len(want) })
	}

	// A session that never prepares says so, and is notified of.
	eventually(t, "the subscriber asleep", asleep)
	l := listen(t, srv.URL, ob.Channel())
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL outboxgen.notify = on"); err != nil {
			return err
		}
		_, err := pub.Publish(ctx, tx, "notified", nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	want = append(want, "notified")
	if _, err := pool.Exec(ctx, "SELECT pg_notify($1, 'sentinel')", ob.Channel()); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{ob.Channel() + ":q"}, l.until("sentinel")); diff != "" {
		t.Errorf("a session with outboxgen.notify = on (-want +got):\n%s", diff)
	}
	eventually(t, "every row handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(handled) >= len(want) })
	if err := s.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if i, j := slices.Index(handled, "read committed key=true"), slices.Index(handled, "repeatable read key=true"); i > j {
		t.Errorf("key k handled out of order: %v", handled)
	}
	if diff := cmp.Diff(want, handled, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("handled (-want +got):\n%s", diff)
	}
}
