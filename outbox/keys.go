package outbox

import (
	"context"
	"math"
	"time"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
)

// Head states of a [HeldKey].
const (
	// HeadLeased: a subscriber holds the key's head (its lease may have
	// expired: see [HeldKey.Until]).
	HeadLeased = "leased"
	// HeadRetrying: the head failed and waits for its retry.
	HeadRetrying = "retrying"
	// HeadScheduled: the head was published to be delivered later.
	HeadScheduled = "scheduled"
)

// HeldKeyOptions configures [Outbox.HeldKeys]. A nil *HeldKeyOptions means
// every default.
type HeldKeyOptions struct {
	// Queues are the queues to look at; empty means every queue
	// [Outbox.QueueDepths] lists.
	Queues []string
	// Limit is how many keys to return, longest held first. Default 100.
	Limit int
	// Scan is how many heads of each queue to look at, among its leased
	// rows (earliest lease expiry first) and among its rows due later
	// (earliest first). Default 1,000.
	Scan int
	// WaitingCap is where each key's count of waiting rows stops.
	// Default 1,000.
	WaitingCap int
}

// HeldKey is an ordering key whose head holds rows back.
type HeldKey struct {
	// Queue and Key name the key.
	Queue string `json:"queue"`
	// Key: see Queue.
	Key string `json:"key"`
	// HeadID is the id of the key's head, the row that must finish first.
	HeadID int64 `json:"head_id"`
	// State is the head's: HeadLeased, HeadRetrying or HeadScheduled.
	State string `json:"state"`
	// Attempts counts the head's handled attempts.
	Attempts int `json:"attempts"`
	// Until is, for a leased head, the time left on its lease (negative
	// once it expired), and otherwise the time until it comes due, on the
	// server's clock.
	Until time.Duration `json:"until_ns"`
	// Held is how long the key's first waiting row has waited.
	Held time.Duration `json:"held_ns"`
	// Waiting counts the rows behind the head, up to
	// [HeldKeyOptions.WaitingCap].
	Waiting int64 `json:"waiting"`
}

// HeldKeys lists the ordering keys whose head (leased, waiting for its
// retry, or scheduled for later) holds back rows published after it,
// longest held first. Its cost is bounded by opts, not by the backlog: it
// reads at most Scan heads of each queue from the lease-expiry and pending
// indexes, and each key's waiting rows from the ordering index up to
// WaitingCap. A key whose head is due now is not listed: it moves as soon
// as a subscriber claims it.
func (o *Outbox) HeldKeys(ctx context.Context, opts *HeldKeyOptions) ([]HeldKey, error) {
	var opt HeldKeyOptions
	if opts != nil {
		opt = *opts
	}
	for _, f := range []struct {
		name string
		v    *int
		def  int
	}{{"HeldKeyOptions.Limit", &opt.Limit, 100}, {"HeldKeyOptions.Scan", &opt.Scan, 1000},
		{"HeldKeyOptions.WaitingCap", &opt.WaitingCap, 1000}} {
		switch {
		case *f.v < 0:
			return nil, &InputError{Field: f.name, Rule: "must not be negative"}
		case *f.v == 0:
			*f.v = f.def
		}
		*f.v = min(*f.v, math.MaxInt32)
	}
	queues := opt.Queues
	if len(queues) == 0 {
		// Only the names: a cap of 1 stops each count at its first entry.
		depths, err := o.QueueDepths(ctx, &DepthOptions{Cap: 1})
		if err != nil {
			return nil, err
		}
		for _, d := range depths {
			queues = append(queues, d.Queue)
		}
	}
	rows, err := o.queries(o.pool).HeldKeys(ctx, db.HeldKeysParams{
		Queues: queues, ScanRows: int32(opt.Scan), MaxRows: int32(opt.Limit), CountCap: int32(opt.WaitingCap),
	})
	if err != nil {
		return nil, o.readError(ctx, "HeldKeys", err)
	}
	out := make([]HeldKey, len(rows))
	for i, r := range rows {
		out[i] = HeldKey{
			Queue: r.Queue, Key: r.OrderingKey, HeadID: r.ID, State: r.State, Attempts: int(r.AttemptsCount),
			Until: dbx.Seconds(r.UntilSeconds), Held: dbx.Seconds(r.HeldSeconds), Waiting: r.Waiting,
		}
	}
	return out, nil
}
