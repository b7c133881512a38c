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

func (l limits) validate() error {
	if l.maxAttempts < 0 {
		return retryError("MaxAttempts", l.maxAttempts, "must not be negative; 0 means no cap")
	}
	if l.maxTotalDelay < 0 {
		return retryError("MaxTotalDelay", l.maxTotalDelay, "must not be negative; 0 means no cap")
	}
	return nil
}

// retryError reports a field of a built-in strategy; validateRetry adds
// the path to the strategy.
func retryError(field string, v any, rule string) *ConfigError {
	return &ConfigError{Field: field, Value: fmt.Sprint(v), Rule: rule}
}

// validateRetry checks the settings of the built-in strategies, naming
// fields under path (e.g. "SubscriberConfig.Retry"). Other strategies are
// the caller's own and are not checked.
func validateRetry(s RetryStrategy, path string) error {
	v, ok := s.(interface{ validate() error })
	if !ok {
		return nil
	}
	if err := v.validate(); err != nil {
		if ce, ok := err.(*ConfigError); ok {
			ce.Field = path + "." + ce.Field
		}
		return err
	}
	return nil
}

// allow reports whether another attempt after delay fits the caps.
func (l limits) allow(attempt int, elapsed, delay time.Duration) bool {
	if l.maxAttempts > 0 && attempt >= l.maxAttempts {
		return false
	}
	// Compared without adding: elapsed can be near the Duration range (a
	// first attempt another client wrote far in the past).
	return l.maxTotalDelay <= 0 || elapsed <= l.maxTotalDelay-delay
}

// NoRetry gives up after the first failure.
type NoRetry struct{}

// NextDelay implements [RetryStrategy].
func (NoRetry) NextDelay(int, time.Duration, error) (time.Duration, bool) { return 0, false }

// ConstantRetry waits the same Delay before every retry.
//
// Its zero fields mean what their comments say (ConstantRetry{} retries
// at once, with no cap); [NewSubscriber] rejects negative fields with a
// *[ConfigError].
type ConstantRetry struct {
	// Delay is the wait before each retry; 0 retries at once.
	Delay time.Duration
	// MaxAttempts caps handled attempts, the first included; 0 means no cap.
	MaxAttempts int
	// MaxTotalDelay caps the time from the first attempt to the next one;
	// 0 means no cap.
	MaxTotalDelay time.Duration
}

func (r ConstantRetry) validate() error {
	if r.Delay < 0 {
		return retryError("Delay", r.Delay, "must not be negative")
	}
	return r.caps().validate()
}

// NextDelay implements [RetryStrategy].
func (r ConstantRetry) NextDelay(attempt int, elapsed time.Duration, _ error) (time.Duration, bool) {
	return r.Delay, r.caps().allow(attempt, elapsed, r.Delay)
}

// LinearRetry waits Initial, then Initial+Step, Initial+2·Step, ... capped
// at MaxDelay.
//
// Its zero fields mean what their comments say (LinearRetry{Step: s}
// retries at once, then after s, 2s, ...); [NewSubscriber] rejects
// negative fields, and a MaxDelay below Initial, with a *[ConfigError].
type LinearRetry struct {
	// Initial is the wait before the first retry; 0 retries at once.
	Initial time.Duration
	// Step is added for each later retry; 0 waits Initial every time.
	Step time.Duration
	// MaxDelay caps one wait; 0 means no cap. When set, it must be at
	// least Initial.
	MaxDelay time.Duration
	// MaxAttempts caps handled attempts, the first included; 0 means no cap.
	MaxAttempts int
	// MaxTotalDelay caps the time from the first attempt to the next one;
	// 0 means no cap.
	MaxTotalDelay time.Duration
}

func (r LinearRetry) validate() error {
	switch {
	case r.Initial < 0:
		return retryError("Initial", r.Initial, "must not be negative")
	case r.Step < 0:
		return retryError("Step", r.Step, "must not be negative")
	case r.MaxDelay < 0:
		return retryError("MaxDelay", r.MaxDelay, "must not be negative; 0 means no cap")
	case r.MaxDelay > 0 && r.MaxDelay < r.Initial:
		return retryError("MaxDelay", r.MaxDelay, fmt.Sprintf("must be at least Initial (%v), or 0 for no cap", r.Initial))
	}
	return r.caps().validate()
}

// NextDelay implements [RetryStrategy].
func (r LinearRetry) NextDelay(attempt int, elapsed time.Duration, _ error) (time.Duration, bool) {
	d := float64(r.Initial) + float64(r.Step)*float64(attempt-1)
	delay, ok := capDelay(d, r.MaxDelay)
	return delay, ok && r.caps().allow(attempt, elapsed, delay)
}

// ExponentialRetry waits Initial, then multiplies the wait by Multiplier
// for each retry, capped at MaxDelay, and spreads each wait by ±Jitter
// (a fraction) so failed rows do not retry in lockstep.
//
// A zero Initial or Multiplier takes its default (RetryInitialDefault,
// 1 s, at most MaxDelay; RetryMultiplierDefault, 2), so
// ExponentialRetry{MaxAttempts: 5} doubles from 1 s. The other fields'
// zero values mean what their comments say: no cap, no jitter.
// [DefaultRetry] sets them all. [NewSubscriber] rejects, with a
// *[ConfigError], a negative Initial, a Multiplier below 1, a MaxDelay
// below Initial, a Jitter outside 0 to 1, and negative caps.
type ExponentialRetry struct {
	// Initial is the wait before the first retry. Default (0):
	// RetryInitialDefault (1 s), or MaxDelay when that is shorter.
	Initial time.Duration
	// Multiplier grows the wait; it must be at least 1 (1 waits Initial
	// every time) and finite. Default (0): RetryMultiplierDefault (2).
	Multiplier float64
	// MaxDelay caps one wait before jitter; 0 means no cap. When set, it
	// must be at least Initial.
	MaxDelay time.Duration
	// Jitter is the fraction, from 0 to 1, by which each wait varies.
	Jitter float64
	// MaxAttempts caps handled attempts, the first included; 0 means no cap.
	MaxAttempts int
	// MaxTotalDelay caps the time from the first attempt to the next one;
	// 0 means no cap.
	MaxTotalDelay time.Duration
}

// withDefaults returns r with its zero Initial and Multiplier set to
// their defaults.
func (r *ExponentialRetry) withDefaults() ExponentialRetry {
	c := *r
	if c.Initial == 0 {
		c.Initial = RetryInitialDefault
		if c.MaxDelay > 0 {
			c.Initial = min(c.Initial, c.MaxDelay)
		}
	}
	if c.Multiplier == 0 {
		c.Multiplier = RetryMultiplierDefault
	}
	return c
}

func (r *ExponentialRetry) validate() error {
	if r.Initial < 0 {
		return retryError("Initial", r.Initial, "must not be negative; 0 means RetryInitialDefault")
	}
	if (r.Multiplier != 0 && !(r.Multiplier >= 1)) || math.IsInf(r.Multiplier, 0) {
		return retryError("Multiplier", r.Multiplier, "must be at least 1 and finite; 0 means RetryMultiplierDefault")
	}
	d := r.withDefaults()
	r = &d
	switch {
	case r.MaxDelay < 0:
		return retryError("MaxDelay", r.MaxDelay, "must not be negative; 0 means no cap")
	case r.MaxDelay > 0 && r.MaxDelay < r.Initial:
		return retryError("MaxDelay", r.MaxDelay, fmt.Sprintf("must be at least Initial (%v), or 0 for no cap", r.Initial))
	case !(r.Jitter >= 0 && r.Jitter <= 1):
		return retryError("Jitter", r.Jitter, "must be between 0 and 1")
	}
	return r.caps().validate()
}

// NextDelay implements [RetryStrategy].
func (r *ExponentialRetry) NextDelay(attempt int, elapsed time.Duration, _ error) (time.Duration, bool) {
	// NewSubscriber rejects values outside these ranges; the clamps keep
	// a strategy that is called directly, unvalidated, well defined.
	c := r.withDefaults()
	r = &c
	mult := math.Max(r.Multiplier, 1)
	d := float64(r.Initial) * math.Pow(mult, float64(attempt-1))
	if r.MaxDelay > 0 {
		d = math.Min(d, float64(r.MaxDelay))
	}
	if j := math.Min(math.Max(r.Jitter, 0), 1); j > 0 {
		d *= 1 + j*(2*rand.Float64()-1)
	}
	delay, ok := capDelay(d, 0)
	return delay, ok && r.caps().allow(attempt, elapsed, delay)
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

// retryLimiter is implemented by the built-in strategies: their caps
// (MaxAttempts, MaxTotalDelay) also apply to a delay they did not choose,
// the one a handler asked for with [RetryAfter].
type retryLimiter interface {
	caps() limits
}

// NoRetry has no caps: it declines to choose a delay, but a handler's own
// RetryAfter is honoured.
func (NoRetry) caps() limits { return limits{} }

func (r ConstantRetry) caps() limits { return limits{r.MaxAttempts, r.MaxTotalDelay} }

func (r LinearRetry) caps() limits { return limits{r.MaxAttempts, r.MaxTotalDelay} }

func (r *ExponentialRetry) caps() limits { return limits{r.MaxAttempts, r.MaxTotalDelay} }

// allowRetry reports whether s lets a delivery retry after delay, a delay
// the handler chose. Built-in strategies apply their caps; any other
// strategy is asked for its own next delay and only its yes or no counts.
// A strategy that panics gives up, with problem saying why.
func allowRetry(s RetryStrategy, attempt int, elapsed, delay time.Duration, err error) (ok bool, problem error) {
	if l, is := s.(retryLimiter); is {
		defer func() {
			if p := recover(); p != nil {
				ok, problem = false, fmt.Errorf("retry strategy %T panicked: %v", s, p)
			}
		}()
		return l.caps().allow(attempt, elapsed, delay), nil
	}
	_, ok, problem = nextDelay(s, attempt, elapsed, err)
	return ok, problem
}
