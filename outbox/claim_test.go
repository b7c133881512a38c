package outbox

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/db"
)

func TestClaimTakesDueUnleasedRows(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, b := e.publish("q"), e.publish("q")

	before := e.serverNow()
	rows := e.claim(10, "q")
	if diff := cmp.Diff([]int64{a, b}, ids(rows)); diff != "" {
		t.Fatalf("claimed ids (-want +got):\n%s", diff)
	}
	for _, r := range rows {
		stored, _ := e.row(r.ID)
		if !r.AcquiredToken.Valid || stored.AcquiredAt == nil || stored.LeaseExpiresAt == nil {
			t.Fatalf("row %d: lease not set: token %v at %v until %v", r.ID, r.AcquiredToken, stored.AcquiredAt, stored.LeaseExpiresAt)
		}
		if r.DeliveriesCount != 1 || r.AttemptsCount != 0 {
			t.Errorf("row %d: deliveries %d attempts %d, want 1 and 0", r.ID, r.DeliveriesCount, r.AttemptsCount)
		}
		if stored.AcquiredAt.Before(before.Add(-time.Second)) {
			t.Errorf("row %d: acquired_at %v before the claim (%v)", r.ID, stored.AcquiredAt, before)
		}
		if ttl := stored.LeaseExpiresAt.Sub(*stored.AcquiredAt); ttl != time.Minute {
			t.Errorf("row %d: lease runs %v, want the claim's one minute", r.ID, ttl)
		}
	}
	// The rows of one claim hold its token; a reclaim draws another
	// (TestClaimReclaimsExpiredLease).
	for _, id := range []int64{a, b} {
		if got, ok := e.row(id); !ok || !got.AcquiredToken.Valid || got.AcquiredToken != token(t, rows[0]) {
			t.Errorf("stored lease of row %d = %v, want the claim's %v", id, got.AcquiredToken, rows[0].AcquiredToken)
		}
	}
}

func TestClaimSkipsFutureRowsAndFreshLeases(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.publishWith(db.PublishParams{Queue: "q", Payload: []byte("x"), DelaySeconds: 3600})
	leased := e.publish("q")
	if got := ids(e.claim(10, "q")); !cmp.Equal(got, []int64{leased}) {
		t.Fatalf("first claim = %v, want [%d]", got, leased)
	}
	if got := e.claim(10, "q"); len(got) != 0 {
		t.Fatalf("second claim took %v; want nothing (future row, fresh lease)", ids(got))
	}
}

func TestClaimReclaimsExpiredLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id := e.publish("q")
	first := e.claim(1, "q")[0]
	e.exec("UPDATE outbox SET lease_expires_at = now() - interval '1 second' WHERE id = $1", id)

	again := e.claim(1, "q")
	if len(again) != 1 || again[0].ID != id {
		t.Fatalf("reclaim = %v, want [%d]", ids(again), id)
	}
	if token(t, again[0]) == token(t, first) {
		t.Errorf("reclaim kept token %v; want a fresh one", token(t, first))
	}
	if again[0].DeliveriesCount != 2 {
		t.Errorf("deliveries_count = %d, want 2", again[0].DeliveriesCount)
	}
}

func TestClaimLimitQueueFilterAndOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var want []int64
	for range 5 {
		want = append(want, e.publish("a"))
		e.publish("b")
	}
	e.publish("c")

	if got := ids(e.claim(3, "a")); !cmp.Equal(got, want[:3]) {
		t.Errorf("claim(3, a) = %v, want %v (oldest first)", got, want[:3])
	}
	got := e.claim(100, "a", "b")
	if len(got) != 7 {
		t.Errorf("claim(100, a, b) took %d rows, want 7", len(got))
	}
	for _, r := range got {
		if r.Queue == "c" {
			t.Errorf("claimed row %d of queue c", r.ID)
		}
	}
	if got := e.claim(100); len(got) != 0 {
		t.Errorf("claim with no queues took %v", ids(got))
	}
	if got := e.claim(100, "nope"); len(got) != 0 {
		t.Errorf("claim of an empty queue took %v", ids(got))
	}
}

func TestConcurrentClaimsNeverShareARow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const rows = 2000
	e.exec("INSERT INTO outbox (queue, payload) SELECT 'q', '\\x00' FROM generate_series(1, $1::int)", rows)

	var (
		mu     sync.Mutex
		seen   = map[int64]int{}
		wg     sync.WaitGroup
		errs   = make(chan error, 8)
		ctx    = e.ctx
		params = db.ClaimParams{Token: newToken(), Queues: []string{"q"}, MaxRows: 25, LeaseTtlSeconds: 60}
	)
	for range 8 {
		wg.Go(func() {
			for {
				got, err := e.q.Claim(ctx, params)
				if err != nil {
					errs <- err
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, r := range got {
					seen[r.ID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Claim: %v", err)
	}
	if len(seen) != rows {
		t.Errorf("claimed %d distinct rows, want %d", len(seen), rows)
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("row %d claimed %d times", id, n)
		}
	}
}

func TestClaimSkipsLockedRowWithoutWaiting(t *testing.T) {
	t.Parallel()
	e := setup(t)
	locked, free := e.publish("q"), e.publish("q")

	tx, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(e.ctx, "SELECT 1 FROM outbox WHERE id = $1 FOR UPDATE", locked); err != nil {
		t.Fatal(err)
	}

	// A claim that waited for the lock would run into this deadline.
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	got, err := e.q.Claim(ctx, db.ClaimParams{Token: newToken(), Queues: []string{"q"}, MaxRows: 10, LeaseTtlSeconds: 60})
	if err != nil {
		t.Fatalf("Claim while a row is locked: %v", err)
	}
	if diff := cmp.Diff([]int64{free}, claimIDs(got)); diff != "" {
		t.Errorf("claimed (-want +got):\n%s", diff)
	}
}

func TestClaimRespectsLimitAcrossQueues(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var all []int64
	for _, q := range []string{"a", "b", "c"} {
		for range 4 {
			all = append(all, e.publish(q))
		}
	}
	got := ids(e.claim(5, "c", "b", "a"))
	slices.Sort(got)
	// The batch is shared across queues: each queue's oldest row first,
	// then each queue's second (in due order), up to the limit.
	want := []int64{all[0], all[1], all[4], all[5], all[8]}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("claimed (-want +got):\n%s", diff)
	}
}
