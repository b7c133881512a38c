package engine

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
)

// retryNow retries every failure at once.
type retryNow struct{}

func (retryNow) NextDelay(int, time.Duration, error) (time.Duration, bool, error) {
	return 0, true, nil
}
func (retryNow) Allow(int, time.Duration, time.Duration, error) (bool, error) { return true, nil }

// failingOnce fails the first delivery of each row in fail, and records
// the deliveries of every row.
type failingOnce struct {
	mu    sync.Mutex
	fail  map[int64]bool
	calls map[int64]int
}

func (f *failingOnce) call(row *db.ClaimRow) (Call, error) { return &failCall{f: f, id: row.ID}, nil }

type failCall struct {
	f  *failingOnce
	id int64
}

func (c *failCall) Headers() map[string]string             { return nil }
func (c *failCall) HandleTx(context.Context, pgx.Tx) error { return nil }
func (c *failCall) Handle(context.Context) error {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	c.f.calls[c.id]++
	if c.f.fail[c.id] && c.f.calls[c.id] == 1 {
		return errors.New("first delivery fails")
	}
	return nil
}

// A row of the ring whose delivery fails moves into the outbox table,
// where the lease path writes its retry, and is delivered again from
// there; the rows that succeeded are acknowledged by the lane's progress
// alone, and delivered once. Both claim paths.
func TestRingFailuresMoveToTheTableAndAreRetriedThere(t *testing.T) {
	t.Parallel()
	for _, lockWindow := range []time.Duration{time.Second, -1} {
		t.Run(lockWindow.String(), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			f := &failingOnce{fail: map[int64]bool{}, calls: map[int64]int{}}
			want := map[int64]int{}
			for i := range 40 {
				id := e.publishRing(db.PublishParams{Queue: "q", Payload: []byte(`{}`)})
				want[id] = 1
				if i%5 == 0 {
					f.fail[id] = true
					want[id] = 2
				}
			}
			s := e.subscriber("q")
			s.Ring, s.LockWindow, s.Retry = true, lockWindow, retryNow{}
			s.Calls = func() func(*db.ClaimRow) (Call, error) { return f.call }
			ctx, stop := context.WithCancel(e.ctx)
			done := make(chan error, 1)
			go func() { done <- Run(ctx, s) }()
			deadline := time.Now().Add(time.Minute)
			for {
				var left int
				if err := e.DB.Pool.QueryRow(e.ctx, "SELECT count(*) FROM outbox").Scan(&left); err != nil {
					t.Fatal(err)
				}
				f.mu.Lock()
				got := cmp.Diff(want, f.calls)
				f.mu.Unlock()
				if left == 0 && got == "" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after a minute, %d rows left in the outbox table; deliveries (-want +got):\n%s", left, got)
				}
				time.Sleep(20 * time.Millisecond)
			}
			stop()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			var moved int
			if err := e.DB.Pool.QueryRow(e.ctx, "SELECT count(*) FROM outbox_dlq").Scan(&moved); err != nil {
				t.Fatal(err)
			}
			if moved != 0 {
				t.Errorf("%d rows dead-lettered; want none", moved)
			}
		})
	}
}
