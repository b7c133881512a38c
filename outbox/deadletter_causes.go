package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxgen/outboxgen/db"
)

// Bounds of [Outbox.DeadLetterCauses].
const (
	// DeadLetterCauseSampleDefault and DeadLetterCauseSampleMax: how many
	// of the newest dead letters it groups, by default and at most.
	DeadLetterCauseSampleDefault = 10_000
	DeadLetterCauseSampleMax     = 100_000
	// DeadLetterCauseLimitDefault and DeadLetterCauseLimitMax: how many
	// groups it returns, by default and at most.
	DeadLetterCauseLimitDefault = 20
	DeadLetterCauseLimitMax     = 1000
)

// DeadLetterCauseOptions choose what [Outbox.DeadLetterCauses] groups. A
// nil *DeadLetterCauseOptions means the defaults.
type DeadLetterCauseOptions struct {
	// Queue groups only this queue's dead letters; empty: every queue's.
	Queue string
	// Sample is how many of the newest dead letters (by id) are grouped.
	// Default: DeadLetterCauseSampleDefault; at most
	// DeadLetterCauseSampleMax.
	Sample int
	// Limit is how many groups are returned, the largest first. Default:
	// DeadLetterCauseLimitDefault; at most DeadLetterCauseLimitMax.
	Limit int
	// Contains, when set, groups only the sample's dead letters whose last
	// error holds it, case-insensitively: a search within the sample (up
	// to 1,024 bytes of UTF-8 without NUL).
	Contains string
}

// DeadLetterCause is a group of dead letters that failed alike: one queue,
// one reason, and one cause.
type DeadLetterCause struct {
	Queue  string `json:"queue"`
	Reason string `json:"reason"`
	// Cause is the group's last error with every run of digits and every
	// id-like hexadecimal run written as "#".
	Cause string `json:"cause"`
	// Rows is how many dead letters of the sample it holds.
	Rows int64 `json:"rows"`
	// NewestID, NewestFailedAt and NewestError are its newest dead
	// letter's id, failure time and last error as written.
	NewestID       int64     `json:"newest_id"`
	NewestFailedAt time.Time `json:"newest_failed_at"`
	NewestError    string    `json:"newest_error"`
}

// DeadLetterCauses groups the newest dead letters by why they failed, the
// largest groups first, and returns the groups and how many dead letters
// it grouped. It reads the newest opts.Sample rows by id, through the
// dead-letter table's primary key (or a queue's index): a bounded read
// whatever the table holds; older dead letters are not counted. Invalid
// options give an *[InputError].
func (o *Outbox) DeadLetterCauses(ctx context.Context, opts *DeadLetterCauseOptions) ([]DeadLetterCause, int64, error) {
	var opt DeadLetterCauseOptions
	if opts != nil {
		opt = *opts
	}
	if opt.Sample == 0 {
		opt.Sample = DeadLetterCauseSampleDefault
	}
	if opt.Limit == 0 {
		opt.Limit = DeadLetterCauseLimitDefault
	}
	if opt.Sample < 0 || opt.Sample > DeadLetterCauseSampleMax {
		return nil, 0, &InputError{Field: "DeadLetterCauseOptions.Sample", Rule: fmt.Sprintf("must be 1 to %d", DeadLetterCauseSampleMax)}
	}
	if opt.Limit < 0 || opt.Limit > DeadLetterCauseLimitMax {
		return nil, 0, &InputError{Field: "DeadLetterCauseOptions.Limit", Rule: fmt.Sprintf("must be 1 to %d", DeadLetterCauseLimitMax)}
	}
	if opt.Queue != "" {
		if err := checkQueueToRead("DeadLetterCauseOptions.Queue", opt.Queue); err != nil {
			return nil, 0, err
		}
	}
	if err := checkText("DeadLetterCauseOptions.Contains", opt.Contains, 1024, false); err != nil {
		return nil, 0, err
	}
	rows, err := o.queries(o.pool).DeadLetterCauses(ctx, db.DeadLetterCausesParams{Queue: orNil(opt.Queue), Sample: int32(opt.Sample),
		MaxGroups: int32(opt.Limit), Contains: orNil(opt.Contains)})
	if err != nil {
		return nil, 0, o.readError(ctx, "DeadLetterCauses", err)
	}
	out := make([]DeadLetterCause, len(rows))
	var sampled int64
	for i, r := range rows {
		out[i] = DeadLetterCause{Queue: r.Queue, Reason: r.FailureReason, Cause: r.Cause, Rows: r.Rows, NewestID: r.NewestID,
			NewestFailedAt: r.NewestFailedAt, NewestError: r.NewestError}
		sampled = r.Sampled
	}
	return out, sampled, nil
}
