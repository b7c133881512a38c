package outbox

import (
	"context"

	"github.com/outboxgen/outboxgen/db"
)

// An operator's actions on one row of the outbox table, by id. Each acts
// only on a row no subscriber holds (its lease unset): a leased row's
// handler decides its outcome, and a row a claim by lock holds waits for
// that claim's end. Each reports whether it acted; false means the row is
// gone, leased, or (RetryRowNow) not waiting for a later time. A row in
// the log tier's ring is acted on once it moves into the table.

// RetryRowNow makes the row with the given id due now: a row delayed or
// waiting for its retry, not behind its ordering key's head. Its queue's
// sleeping subscribers are woken.
func (o *Outbox) RetryRowNow(ctx context.Context, id int64) (bool, error) {
	ok, err := o.queries(o.pool).RetryRowNow(ctx, id)
	if err != nil {
		return false, o.readError(ctx, "RetryRowNow", err)
	}
	return ok, nil
}

// CancelRow deletes the row with the given id: it is never delivered.
// When it is its ordering key's head, the key's next row becomes
// claimable, as after a handled row. Log who cancelled what: the row is
// gone for good.
func (o *Outbox) CancelRow(ctx context.Context, id int64) (bool, error) {
	r, err := o.queries(o.pool).CancelRow(ctx, id)
	if err != nil {
		return false, o.readError(ctx, "CancelRow", err)
	}
	return r.Cancelled, nil
}

// DeadLetterRowNoteMaxBytes is the longest note [Outbox.DeadLetterRow]
// takes.
const DeadLetterRowNoteMaxBytes = 1024

// DeadLetterRow moves the row with the given id into the dead-letter
// table, with reason [ReasonRejected] and note (why, and who; valid UTF-8
// without NUL, up to DeadLetterRowNoteMaxBytes) as its last error, the
// row's last handler error kept after it. It can be replayed from there
// as any dead letter. A keyed head's key hands on to its next row.
func (o *Outbox) DeadLetterRow(ctx context.Context, id int64, note string) (bool, error) {
	if err := checkText("note", note, DeadLetterRowNoteMaxBytes, true); err != nil {
		return false, err
	}
	ok, err := o.queries(o.pool).DeadLetterRow(ctx, db.DeadLetterRowParams{ID: id, Note: note})
	if err != nil {
		return false, o.readError(ctx, "DeadLetterRow", err)
	}
	return ok, nil
}
