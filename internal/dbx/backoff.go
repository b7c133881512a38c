package dbx

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is exponential with ±50 % jitter, so subscribers that failed
// together do not retry together. A Backoff waits Base after its first failure, at most Max.
type Backoff struct {
	Base, Max time.Duration
	attempt   int
	lastFail  time.Time
}

// healthyAfter is how long without a failure resets a Backoff.
const healthyAfter = 10 * time.Second

// Next records a failure and returns how long to wait.
func (b *Backoff) Next() time.Duration {
	if !b.lastFail.IsZero() && time.Since(b.lastFail) > healthyAfter {
		b.attempt = 0
	}
	b.lastFail = time.Now()
	b.attempt = min(b.attempt+1, 30)
	d := float64(b.Base) * float64(uint64(1)<<(b.attempt-1)) * (0.5 + rand.Float64())
	return min(time.Duration(d), b.Max)
}

// Sleep waits d or until ctx is done; false when ctx is done.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
