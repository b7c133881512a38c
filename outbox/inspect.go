package outbox

import (
	"context"
	"fmt"
	"time"
)

// QueueStats describes one queue of an outbox at one moment.
type QueueStats struct {
	// Queue is the queue's name.
	Queue string `json:"queue"`
	// Ready counts rows due now and not leased.
	Ready int64 `json:"ready"`
	// Scheduled counts rows due later (delayed, or waiting to retry).
	Scheduled int64 `json:"scheduled"`
	// Leased counts rows a subscriber holds with a live lease.
	Leased int64 `json:"leased"`
	// Expired counts leased rows whose lease is older than the TTL asked
	// about: their subscriber stalled or died, and any claim takes them.
	Expired int64 `json:"expired"`
	// OldestAge is the age of the queue's oldest row.
	OldestAge time.Duration `json:"oldest_age_ns"`
	// DeadLettered counts the queue's rows in the dead-letter table.
	DeadLettered int64 `json:"dead_lettered"`
}

// QueueStats reports every queue that has rows in the outbox or its
// dead-letter table, by name. Leases older than leaseTTL count as expired.
// It reads both tables whole: it is for operators, not hot paths.
func (o *Outbox) QueueStats(ctx context.Context, leaseTTL time.Duration) ([]QueueStats, error) {
	if leaseTTL <= 0 {
		return nil, &InputError{Field: "leaseTTL", Rule: "must be positive"}
	}
	rows, err := o.queries(o.pool).QueueStats(ctx, leaseTTL.Seconds())
	if err != nil {
		return nil, fmt.Errorf("outbox: QueueStats: %w", err)
	}
	out := make([]QueueStats, len(rows))
	for i, r := range rows {
		out[i] = QueueStats{
			Queue: r.Queue, Ready: r.Ready, Scheduled: r.Scheduled, Leased: r.Leased, Expired: r.Expired,
			OldestAge: time.Duration(r.OldestAgeSeconds * float64(time.Second)), DeadLettered: r.DeadLettered,
		}
	}
	return out, nil
}
