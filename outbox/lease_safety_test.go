package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/db"
)

// A claimer with a short LeaseTTL must not take a row whose holder leased
// it for longer, and a claimer with a long LeaseTTL must not wait past
// the expiry the holder stamped.
func TestLeaseExpiryIsJudgedByTheHoldersTTL(t *testing.T) {
	t.Parallel()
	e := setup(t)
	long := e.publish("long")
	short := e.publish("short")
	if got, err := e.q.Claim(e.ctx, db.ClaimParams{Token: newToken(), Queues: []string{"long"}, MaxRows: 1, LeaseTtlSeconds: 30}); err != nil || len(got) != 1 {
		t.Fatalf("claim long: %v, %v", got, err)
	}
	if got, err := e.q.Claim(e.ctx, db.ClaimParams{Token: newToken(), Queues: []string{"short"}, MaxRows: 1, LeaseTtlSeconds: 0.2}); err != nil || len(got) != 1 {
		t.Fatalf("claim short: %v, %v", got, err)
	}
	eventually(t, "the 200ms lease expired", func() bool { r, _ := e.row(short); return !r.LeaseExpiresAt.After(e.serverNow()) })

	got, err := e.q.Claim(e.ctx, db.ClaimParams{Token: newToken(), Queues: []string{"long"}, MaxRows: 10, LeaseTtlSeconds: 0.1})
	if err != nil || len(got) != 0 {
		t.Errorf("a 100ms claimer took a row leased for 30s: %v, %v", claimIDs(got), err)
	}
	got, err = e.q.Claim(e.ctx, db.ClaimParams{Token: newToken(), Queues: []string{"short"}, MaxRows: 10, LeaseTtlSeconds: 3600})
	if err != nil || !cmp.Equal(claimIDs(got), []int64{short}) {
		t.Errorf("a one-hour claimer did not take row %d whose 200ms lease expired: %v, %v", short, claimIDs(got), err)
	}
	r, _ := e.row(long)
	if r.LeaseExpiresAt == nil || r.LeaseExpiresAt.Sub(*r.AcquiredAt) != 30*time.Second {
		t.Errorf("lease of row %d: acquired %v, expires %v; want 30s apart", long, r.AcquiredAt, r.LeaseExpiresAt)
	}
}

// A rolling deploy: a subscriber with LeaseTTL 3s heartbeats its slow
// handler while another, with LeaseTTL 200ms, claims over and over. The
// row is delivered once.
func TestSubscribersWithDifferentLeaseTTLsNeverShareARow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var calls atomic.Int32
	entered := make(chan struct{})
	slow := fastConfig[string](nil)
	slow.LeaseTTL, slow.HeartbeatInterval = 3*time.Second, time.Second
	startSub(t, e.ob, []string{"q"}, func(ctx context.Context, _ *Message[string]) error {
		calls.Add(1)
		close(entered)
		select {
		case <-time.After(4 * time.Second):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}, slow)
	id := e.publish("q")
	<-entered

	fast := fastConfig[string](nil)
	fast.LeaseTTL, fast.HeartbeatInterval = 200*time.Millisecond, 50*time.Millisecond
	startSub(t, e.ob, []string{"q"}, func(context.Context, *Message[string]) error {
		calls.Add(1)
		return nil
	}, fast)
	eventually(t, "the slow handler's ack", func() bool { _, ok := e.row(id); return !ok })
	if n := calls.Load(); n != 1 {
		t.Errorf("handler calls = %d, want 1", n)
	}
}

func TestHeartbeatIntervalIsAtMostHalfTheLease(t *testing.T) {
	t.Parallel()
	_, err := NewSubscriber(&Outbox{}, []string{"q"}, func(context.Context, *Message[string]) error { return nil },
		&SubscriberConfig[string]{LeaseTTL: time.Second, HeartbeatInterval: 600 * time.Millisecond})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "SubscriberConfig.HeartbeatInterval" {
		t.Fatalf("err = %v, want a ConfigError for HeartbeatInterval", err)
	}
	if _, err := NewSubscriber(&Outbox{}, []string{"q"}, func(context.Context, *Message[string]) error { return nil },
		&SubscriberConfig[string]{LeaseTTL: time.Second, HeartbeatInterval: 500 * time.Millisecond}); err != nil {
		t.Errorf("LeaseTTL/2: %v", err)
	}
}

// A claim whose answer comes after its lease has run out (its statement
// waited longer than LeaseTTL) starts no handler on its rows: another
// claim may own them by then. The row is handled once, by a later claim:
// after a claim by lease, that claim counts the late one's delivery; a
// claim by lock that gives up its rows unhandled wrote nothing, so it
// counts none. The claim is paused mid-statement, as the snapshot tests
// pause theirs (pauseWhen), for longer than its lease.
func TestAClaimAnsweredAfterItsLeaseRanOutStartsNoHandler(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		lockWindow time.Duration
		want       []int // Message.Deliveries of each handler call
	}{
		{"by lease", -1, []int{2}},
		{"by lock", 0, []int{1}}, // the defaults: a subscriber's first claim is by lock
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setupOwned(t)
			id := e.publish("q")
			ob := e.outboxOn(nil)
			role := roleOf(t, ob)
			unlock := e.pauseWhen("pause(id bigint)", fmt.Sprintf("id = %d", id))
			e.exec(`ALTER TABLE outbox ENABLE ROW LEVEL SECURITY`)
			e.exec(`CREATE POLICY pause ON outbox USING (pause(id))`)

			const ttl = time.Second
			var deliveries []int
			var mu sync.Mutex
			cfg := fastConfig[string](nil)
			cfg.LeaseTTL, cfg.LockWindow = ttl, tc.lockWindow
			startSub(t, ob, []string{"q"}, func(ctx context.Context, m *Message[string]) error {
				mu.Lock()
				deliveries = append(deliveries, m.Deliveries)
				mu.Unlock()
				return nil
			}, cfg)
			eventually(t, "the claim paused at the row", func() bool { return e.paused(role, "Claim|ClaimQueue|Lock|LockQueue") })
			time.Sleep(ttl + ttl/2)
			unlock()
			eventually(t, "the row handled", func() bool { _, ok := e.row(id); return !ok })
			mu.Lock()
			defer mu.Unlock()
			if diff := cmp.Diff(tc.want, deliveries); diff != "" {
				t.Errorf("Message.Deliveries of each handler call (-want +got):\n%s", diff)
			}
		})
	}
}
