package outbox

import (
	"context"
	"time"

	"github.com/outboxgen/outboxgen/db"
)

// pausesSchema is the schema version that has queue pauses.
const pausesSchema = 14

// PauseReasonMaxBytes is the longest reason [Outbox.PauseQueue] takes.
const PauseReasonMaxBytes = 1024

// QueuePause is a paused queue (see [Outbox.PauseQueue]).
type QueuePause struct {
	// Queue is the paused queue.
	Queue string `json:"queue"`
	// PausedAt is when it was paused, on the database's clock.
	PausedAt time.Time `json:"paused_at"`
	// PausedBy is the database role (session_user) that paused it.
	PausedBy string `json:"paused_by"`
	// Reason is what the pause was given as its reason; may be empty.
	Reason string `json:"reason"`
}

// PauseQueue pauses queue: from their next claim on, the subscribers of
// the queue, in every process, claim none of its rows, whether due,
// retrying or with an expired lease, from the outbox table or the log
// tier's ring; rows they claimed before finish, and their outcomes are
// written as usual. Publishing goes on, and the queue's rows wait in the
// outbox until [Outbox.ResumeQueue]. Rows written into the ring meanwhile
// move into the outbox table, where they wait (so the ring keeps
// turning). A subscriber of several queues goes on claiming the others.
//
// The pause is a row in the outbox's <table>_pauses (schema 14): it
// survives restarts of subscribers and of the database. reason (free text,
// up to [PauseReasonMaxBytes] bytes of UTF-8; may be empty) is kept with
// it. Pausing a paused queue keeps its first pause, and returns it. The
// queue need not exist yet. It needs the subscriber role's grants
// ([Roles]); the publisher role may not pause. Invalid input gives an
// *[InputError], and an outbox whose schema predates pauses a
// *[SchemaError].
func (o *Outbox) PauseQueue(ctx context.Context, queue, reason string) (QueuePause, error) {
	if err := checkQueueToRead("queue", queue); err != nil {
		return QueuePause{}, err
	}
	if err := checkText("reason", reason, PauseReasonMaxBytes, false); err != nil {
		return QueuePause{}, err
	}
	r, err := o.queries(o.pool).PauseQueue(ctx, db.PauseQueueParams{Queue: queue, Reason: reason})
	if err != nil {
		return QueuePause{}, o.readError(ctx, "PauseQueue", err)
	}
	return QueuePause{Queue: r.Queue, PausedAt: r.PausedAt, PausedBy: r.PausedBy, Reason: r.Reason}, nil
}

// ResumeQueue resumes queue, paused by [Outbox.PauseQueue], and wakes its
// sleeping subscribers, which claim its rows at once (a subscriber that
// misses the wake-up claims within its MaxFetchInterval). It reports
// whether the queue was paused. Errors are as PauseQueue's.
func (o *Outbox) ResumeQueue(ctx context.Context, queue string) (bool, error) {
	if err := checkQueueToRead("queue", queue); err != nil {
		return false, err
	}
	n, err := o.queries(o.pool).ResumeQueue(ctx, queue)
	if err != nil {
		return false, o.readError(ctx, "ResumeQueue", err)
	}
	return n > 0, nil
}

// PausedQueues returns the paused queues in name order (none: an empty
// slice). It needs the subscriber role's grants, as PauseQueue does.
func (o *Outbox) PausedQueues(ctx context.Context) ([]QueuePause, error) {
	rows, err := o.queries(o.pool).PausedQueues(ctx)
	if err != nil {
		return nil, o.readError(ctx, "PausedQueues", err)
	}
	out := make([]QueuePause, len(rows))
	for i, r := range rows {
		out[i] = QueuePause(r)
	}
	return out, nil
}
