package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// ConfigError reports a configuration value that breaks a rule. Every
// constructor validates its whole configuration before it touches the
// database, so a ConfigError means nothing was executed.
type ConfigError struct {
	// Field names the offending field, e.g. "Config.Table".
	Field string
	// Value is the offending value as given.
	Value string
	// Rule says what the value must satisfy.
	Rule string
}

// Error implements error.
func (e *ConfigError) Error() string {
	return fmt.Sprintf("outbox: %s %q: %s", e.Field, e.Value, e.Rule)
}

// InputError reports a message or option that breaks a rule. Publish
// returns it before writing anything.
type InputError struct {
	// Field names the offending input, e.g. "PublishOpts.Delay" or
	// `PublishOpts.Headers["x"]`.
	Field string
	// Rule says what the input must satisfy.
	Rule string
	// Err is the underlying error, if any (a codec's encoding error).
	Err error
}

// Error implements error.
func (e *InputError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("outbox: %s: %s: %s", e.Field, e.Rule, unprefixed(e.Err))
	}
	return fmt.Sprintf("outbox: %s: %s", e.Field, e.Rule)
}

// Unwrap returns the underlying error.
func (e *InputError) Unwrap() error { return e.Err }

// ErrTimerExists is returned by [Publisher.Publish] when a row of the same
// queue already holds the timer id: nothing was written, and the caller's
// transaction is still usable.
var ErrTimerExists = errors.New("outbox: Publish: a row with this timer id already exists in the queue")

// errorClass names the kind of err for metrics: "input", "timer_exists",
// "canceled" or "database"; "" for nil.
func errorClass(err error) string {
	var in *InputError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &in):
		return "input"
	case errors.Is(err, ErrTimerExists):
		return "timer_exists"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	default:
		return "database"
	}
}

// opError is the error of an operation (a method's name, with what it
// worked on): "outbox: <op>: " and the underlying error's text, whose own
// "outbox: " prefix is dropped, so no message says it twice.
type opError struct {
	op  string
	err error
}

// wrapOp returns err as the error of op.
func wrapOp(op string, err error) error { return &opError{op: op, err: err} }

// Error implements error.
func (e *opError) Error() string { return "outbox: " + e.op + ": " + unprefixed(e.err) }

// Unwrap returns the underlying error.
func (e *opError) Unwrap() error { return e.err }

// unprefixed is err's text without its leading "outbox: ".
func unprefixed(err error) string { return strings.TrimPrefix(err.Error(), "outbox: ") }
