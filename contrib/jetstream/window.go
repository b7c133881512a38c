package outboxjs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxgen/outboxgen/outbox"
)

// redeliveryMargin covers the claim and the outcome writes between two
// publishes of a row.
const redeliveryMargin = time.Second

// Redelivery is how long after a publish that the stream may have stored
// a relay can publish the same row again, and of what that is made. The
// stream drops the second copy only when its duplicate window is at
// least Bound.
//
// Two paths publish a row again. A relay that dies (or loses its
// database connection) after publishing leaves the row leased: it is
// claimed again when its lease runs out, at most LeaseTTL after the
// last heartbeat, which comes at most PublishTimeout after the publish,
// and a subscriber's next claim comes at most MaxFetchInterval later. A
// publish whose ack does not arrive within PublishTimeout fails, and the
// row is published again after the retry strategy's wait, at most
// MaxRetryDelay.
type Redelivery struct {
	// PublishTimeout is Config.PublishTimeout.
	PublishTimeout time.Duration
	// LeaseTTL is the subscriber's LeaseTTL.
	LeaseTTL time.Duration
	// MaxRetryDelay is the longest wait of the retry strategy.
	MaxRetryDelay time.Duration
	// MaxFetchInterval is the subscriber's MaxFetchInterval.
	MaxFetchInterval time.Duration
	// Margin covers a claim and the outcome writes (1 s).
	Margin time.Duration
}

// Bound is PublishTimeout + max(LeaseTTL, MaxRetryDelay) +
// MaxFetchInterval + Margin.
func (d Redelivery) Bound() time.Duration {
	return d.PublishTimeout + max(d.LeaseTTL, d.MaxRetryDelay) + d.MaxFetchInterval + d.Margin
}

// String spells out Bound, e.g. "40s = PublishTimeout 5s + max(LeaseTTL
// 30s, MaxRetryDelay 12s) + MaxFetchInterval 5s + margin 1s".
func (d Redelivery) String() string {
	return fmt.Sprintf("%v = PublishTimeout %v + max(LeaseTTL %v, MaxRetryDelay %v) + MaxFetchInterval %v + margin %v",
		d.Bound(), d.PublishTimeout, d.LeaseTTL, d.MaxRetryDelay, d.MaxFetchInterval, d.Margin)
}

// Redelivery returns the relay's redelivery timing, which the start-up
// check compares with each stream's duplicate window.
func (r *Relay) Redelivery() Redelivery { return r.redelivery }

// WindowError reports a stream whose duplicate window is shorter than the
// relay's redelivery timing: a row published again after the window
// would be stored twice.
type WindowError struct {
	// Stream is the stream's name.
	Stream string
	// Subjects are the relay's subjects that the stream captures.
	Subjects []string
	// Duplicates is the stream's duplicate window
	// (StreamConfig.Duplicates).
	Duplicates time.Duration
	// Redelivery is the relay's timing; its Bound exceeds Duplicates.
	Redelivery Redelivery
}

func (e *WindowError) Error() string {
	return fmt.Sprintf("outboxjs: stream %q (subjects %s) drops duplicates for %v (Duplicates), "+
		"but the relay can publish a row again up to %v after its first publish (%v): "+
		"set the stream's Duplicates to at least %v, or shorten the relay's timing, "+
		"or set Config.WarnOnly to relay with duplicates possible",
		e.Stream, strings.Join(e.Subjects, ", "), e.Duplicates, e.Redelivery.Bound(), e.Redelivery, e.Redelivery.Bound())
}

// ErrNoStream is wrapped by the start-up check's error for a subject no
// stream captures: its messages would be refused by the broker.
var ErrNoStream = errors.New("no stream captures the subject")

// Check looks up the streams that capture the relay's subjects
// (Config.Subjects, or Config.Stream alone) and returns an error for the
// first problem it finds: a *WindowError for a stream whose duplicate
// window is shorter than [Relay.Redelivery]'s Bound, an error wrapping
// [ErrNoStream] for a subject no stream captures, or the broker's error.
// [Relay.Run] calls it before relaying. Streams can change later; Check
// sees them as they are now.
func (r *Relay) Check(ctx context.Context) error {
	subjectsOf := map[string][]string{} // stream -> the relay's subjects it captures
	var streams []string
	if r.stream != "" {
		streams = []string{r.stream}
		subjectsOf[r.stream] = r.subjects
	} else {
		for _, subject := range r.subjects {
			names := r.js.StreamNames(ctx, jetstream.WithStreamListSubject(subject))
			found := false
			for name := range names.Name() {
				found = true
				if _, ok := subjectsOf[name]; !ok {
					streams = append(streams, name)
				}
				subjectsOf[name] = append(subjectsOf[name], subject)
			}
			if err := names.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
				return fmt.Errorf("outboxjs: look up the streams of subject %q: %w", subject, err)
			}
			if !found {
				return fmt.Errorf("outboxjs: subject %q: %w: create a stream for it, or correct Config.Subjects", subject, ErrNoStream)
			}
		}
	}
	slices.Sort(streams)
	for _, name := range streams {
		s, err := r.js.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("outboxjs: stream %q: %w", name, err)
		}
		if d := s.CachedInfo().Config.Duplicates; d < r.redelivery.Bound() {
			return &WindowError{Stream: name, Subjects: subjectsOf[name], Duplicates: d, Redelivery: r.redelivery}
		}
	}
	return nil
}

// maxRetryDelay returns the longest wait of s: stated, when positive, or
// computed for the outbox package's strategies.
func maxRetryDelay(s outbox.RetryStrategy, stated time.Duration) (time.Duration, error) {
	if stated > 0 {
		return stated, nil
	}
	unbounded := func(why string) error {
		return &outbox.ConfigError{Field: "outboxjs.Config.MaxRetryDelay", Value: "0",
			Rule: "must be set: " + why + ", and the duplicate-window check needs the longest wait"}
	}
	switch s := s.(type) {
	case outbox.NoRetry, *outbox.NoRetry:
		return 0, nil
	case outbox.ConstantRetry:
		return s.Delay, nil
	case *outbox.ConstantRetry:
		return s.Delay, nil
	case outbox.LinearRetry:
		return linearMax(&s, unbounded)
	case *outbox.LinearRetry:
		return linearMax(s, unbounded)
	case *outbox.ExponentialRetry:
		jitter := 1 + max(s.Jitter, 0)
		if s.MaxDelay > 0 {
			return time.Duration(float64(s.MaxDelay) * jitter), nil
		}
		if s.MaxAttempts == 0 {
			return 0, unbounded("SubscriberConfig.Retry has neither MaxDelay nor MaxAttempts")
		}
		// The last wait comes after attempt MaxAttempts-1: Initial ·
		// Multiplier^(MaxAttempts-2).
		// Zero Initial and Multiplier take the outbox package's defaults.
		initial := cmp.Or(s.Initial, outbox.RetryInitialDefault)
		mult := cmp.Or(s.Multiplier, outbox.RetryMultiplierDefault)
		d := float64(initial) * math.Pow(mult, float64(max(s.MaxAttempts-2, 0))) * jitter
		if d >= math.MaxInt64 {
			return 0, unbounded("SubscriberConfig.Retry's longest wait overflows")
		}
		return time.Duration(d), nil
	}
	return 0, unbounded(fmt.Sprintf("SubscriberConfig.Retry is a %T, whose waits this package cannot bound", s))
}

func linearMax(s *outbox.LinearRetry, unbounded func(string) error) (time.Duration, error) {
	switch {
	case s.MaxDelay > 0:
		return s.MaxDelay, nil
	case s.Step == 0:
		return s.Initial, nil
	case s.MaxAttempts > 0:
		return s.Initial + time.Duration(max(s.MaxAttempts-2, 0))*s.Step, nil
	}
	return 0, unbounded("SubscriberConfig.Retry has neither MaxDelay nor MaxAttempts")
}

// validPublishSubject reports whether s is a subject a message can be
// published to: non-empty tokens separated by '.', no white space, no
// wildcards.
func validPublishSubject(s string) bool {
	return validSubject(s, false)
}

// validFilterSubject is validPublishSubject with wildcards: '*' as a
// token, '>' as the last.
func validFilterSubject(s string) bool {
	return validSubject(s, true)
}

func validSubject(s string, wildcards bool) bool {
	if s == "" {
		return false
	}
	tokens := strings.Split(s, ".")
	for i, t := range tokens {
		if t == "" || strings.ContainsAny(t, " \t\r\n\f\v") {
			return false
		}
		if strings.ContainsAny(t, "*>") {
			if !wildcards || (t != "*" && !(t == ">" && i == len(tokens)-1)) {
				return false
			}
		}
	}
	return true
}

// validStreamName reports whether s can name a stream.
func validStreamName(s string) bool {
	return s != "" && !strings.ContainsAny(s, " \t\r\n\f\v.*>/\\")
}
