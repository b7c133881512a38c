package outbox

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// RetryStrategy decides what happens after a handler fails.
//
// NextDelay receives the number of handled attempts so far, this failure
// included (1 after the first failure), the time since the first attempt,
// and the handler's error. It returns how long to wait before the next
// attempt, or false to give up (the row is dead-lettered with reason
// retry_exhausted). It must be safe for concurrent use. A strategy that
// panics or returns a negative delay gives up; it never drops the row.
type RetryStrategy interface {
	NextDelay(attempt int, elapsed time.Duration, err error) (time.Duration, bool)
}

// Defaults of the default [ExponentialRetry].
const (
	RetryInitialDefault     = time.Second
	RetryMultiplierDefault  = 2.0
	RetryMaxDelayDefault    = 5 * time.Minute
	RetryMaxAttemptsDefault = 10
	RetryJitterDefault      = 0.2
)

// DefaultRetry returns the strategy used when none is configured: 1 s
// doubling to at most 5 min, 10 attempts, ±20 % jitter.
func DefaultRetry() *ExponentialRetry {
	return &ExponentialRetry{
		Initial: RetryInitialDefault, Multiplier: RetryMultiplierDefault, MaxDelay: RetryMaxDelayDefault,
		MaxAttempts: RetryMaxAttemptsDefault, Jitter: RetryJitterDefault,
	}
}

// limits are the caps every strategy shares.
type limits struct {
	maxAttempts   int
	maxTotalDelay time.Duration
}

// allow reports whether another attempt after delay fits the caps.
func (l limits) allow(attempt int, elapsed, delay time.Duration) bool {
	if l.maxAttempts > 0 && attempt >= l.maxAttempts {
		return false
	}
	return l.maxTotalDelay <= 0 || elapsed+delay <= l.maxTotalDelay
}

// NoRetry gives up after the first failure.
type NoRetry struct{}

// NextDelay implements [RetryStrategy].
func (NoRetry) NextDelay(int, time.Duration, error) (time.Duration, bool) { return 0, false }

// ConstantRetry waits the same Delay before every retry.
type ConstantRetry struct {
	// Delay is the wait before each retry.
	Delay time.Duration
	// MaxAttempts caps handled attempts, the first included; 0 means no cap.
	MaxAttempts int
	// MaxTotalDelay caps the time from the first attempt to the next one;
	// 0 means no cap.
	MaxTotalDelay time.Duration
}

// NextDelay implements [RetryStrategy].
func (r ConstantRetry) NextDelay(attempt int, elapsed time.Duration, _ error) (time.Duration, bool) {
	return r.Delay, limits{r.MaxAttempts, r.MaxTotalDelay}.allow(attempt, elapsed, r.Delay)
}

// LinearRetry waits Initial, then Initial+Step, Initial+2·Step, ... capped
// at MaxDelay.
type LinearRetry struct {
	// Initial is the wait before the first retry.
	Initial time.Duration
	// Step is added for each later retry.
	Step time.Duration
	// MaxDelay caps one wait; 0 means no cap.
	MaxDelay time.Duration
	// MaxAttempts caps handled attempts, the first included; 0 means no cap.
	MaxAttempts int
	// MaxTotalDelay caps the time from the first attempt to the next one;
	// 0 means no cap.
	MaxTotalDelay time.Duration
}

// NextDelay implements [RetryStrategy].
func (r LinearRetry) NextDelay(attempt int, elapsed time.Duration, _ error) (time.Duration, bool) {
	d := float64(r.Initial) + float64(r.Step)*float64(attempt-1)
	delay, ok := capDelay(d, r.MaxDelay)
	return delay, ok && limits{r.MaxAttempts, r.MaxTotalDelay}.allow(attempt, elapsed, delay)
}

// ExponentialRetry waits Initial, then multiplies the wait by Multiplier
// for each retry, capped at MaxDelay, and spreads each wait by ±Jitter
// (a fraction) so failed rows do not retry in lockstep.
type ExponentialRetry struct {
	// Initial is the wait before the first retry.
	Initial time.Duration
	// Multiplier grows the wait; values below 1 are treated as 1.
	Multiplier float64
	// MaxDelay caps one wait before jitter; 0 means no cap.
	MaxDelay time.Duration
	// Jitter is the fraction (0 to 1) by which each wait varies.
	Jitter float64
	// MaxAttempts caps handled attempts, the first included; 0 means no cap.
	MaxAttempts int
	// MaxTotalDelay caps the time from the first attempt to the next one;
	// 0 means no cap.
	MaxTotalDelay time.Duration
}

// NextDelay implements [RetryStrategy].
func (r *ExponentialRetry) NextDelay(attempt int, elapsed time.Duration, _ error) (time.Duration, bool) {
	mult := math.Max(r.Multiplier, 1)
	d := float64(r.Initial) * math.Pow(mult, float64(attempt-1))
	if r.MaxDelay > 0 {
		d = math.Min(d, float64(r.MaxDelay))
	}
	if j := math.Min(math.Max(r.Jitter, 0), 1); j > 0 {
		d *= 1 + j*(2*rand.Float64()-1)
	}
	delay, ok := capDelay(d, 0)
	return delay, ok && limits{r.MaxAttempts, r.MaxTotalDelay}.allow(attempt, elapsed, delay)
}

// capDelay converts d (nanoseconds) to a Duration, capped at max when max
// is positive; false when d is not a usable delay (NaN, negative, or past
// what a Duration holds).
func capDelay(d float64, max time.Duration) (time.Duration, bool) {
	if max > 0 && d > float64(max) {
		d = float64(max)
	}
	if math.IsNaN(d) || d < 0 || d >= math.MaxInt64 {
		return 0, false
	}
	return time.Duration(d), true
}

// nextDelay asks s, turning a panic or an unusable answer into giving up.
func nextDelay(s RetryStrategy, attempt int, elapsed time.Duration, err error) (d time.Duration, ok bool, problem error) {
	defer func() {
		if r := recover(); r != nil {
			d, ok, problem = 0, false, fmt.Errorf("retry strategy %T panicked: %v", s, r)
		}
	}()
	d, ok = s.NextDelay(attempt, elapsed, err)
	if ok && d < 0 {
		return 0, false, fmt.Errorf("retry strategy %T returned a negative delay %v", s, d)
	}
	return d, ok, nil
}
