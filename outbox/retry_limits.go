package outbox

import (
	"fmt"
	"time"
)

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
