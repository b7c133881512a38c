package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
)

// QueueStats describes one queue of an outbox at one moment.
type QueueStats struct {
	// Queue is the queue's name.
	Queue string `json:"queue"`
	// Ready counts rows due now and not leased.
	Ready int64 `json:"ready"`
	// Scheduled counts rows due later (delayed, or waiting to retry).
	Scheduled int64 `json:"scheduled"`
	// Blocked counts rows waiting behind an earlier row of their ordering
	// key; each becomes claimable when the rows before it are finished.
	Blocked int64 `json:"blocked"`
	// Leased counts rows a subscriber holds with a live lease.
	Leased int64 `json:"leased"`
	// Expired counts leased rows whose lease expiry (set by the holder from
	// its own LeaseTTL) has passed: their subscriber stalled or died, and
	// any claim takes them.
	Expired int64 `json:"expired"`
	// OldestAge is the age of the queue's oldest row.
	OldestAge time.Duration `json:"oldest_age_ns"`
	// DeadLettered counts the queue's rows in the dead-letter table.
	DeadLettered int64 `json:"dead_lettered"`
	// HeldKeysRetrying counts ordering keys whose head is waiting for its
	// retry while later rows of the key wait behind it.
	HeldKeysRetrying int64 `json:"held_keys_retrying"`
	// HeldKeysScheduled counts ordering keys whose head is scheduled for
	// later (never handled yet) while later rows of the key wait behind it.
	HeldKeysScheduled int64 `json:"held_keys_scheduled"`
	// OldestHeldKey is the held key (retrying or scheduled) whose waiting
	// rows have waited longest, and OldestHeldAge how long its first
	// waiting row has existed; empty and zero when no key is held.
	OldestHeldKey string        `json:"oldest_held_key,omitempty"`
	OldestHeldAge time.Duration `json:"oldest_held_age_ns,omitempty"`
	// HandOffs counts ordering keys whose head is gone and whose next row
	// waits for a subscriber to complete the hand-over (the deleting
	// transaction could not, because a publisher of the key had not
	// committed). It stays near zero while subscribers run.
	HandOffs int64 `json:"hand_offs"`
	// Paused is the queue's pause ([Outbox.PauseQueue]); nil while it
	// runs.
	Paused *QueuePause `json:"paused,omitempty"`
}

// QueueStats reports every queue that has rows in the outbox or its
// dead-letter table, or is paused, by name. It reads both tables whole: it is for
// operators, not hot paths ([Outbox.QueueDepths] is the cheap read for
// metrics). With the log tier's ring beside the outbox table, every row
// of the ring that no lane has consumed yet counts too, as ready or
// scheduled, and in the oldest age (rows a claim of the ring still holds
// count as ready until it ends). The ring is read before the table, so a
// row that a claim moves from one into the other meanwhile counts twice
// in that read, never in neither. A missing outbox, or one at another
// schema version, gives a *[SchemaError] naming the fix.
func (o *Outbox) QueueStats(ctx context.Context) ([]QueueStats, error) {
	// The ring's rows still to be read, every one of them, first: rows
	// move from the ring into the table only, so a row a claim moves
	// between the two reads is counted twice for a moment, never missed.
	// An outbox without the ring costs one statement more, not a
	// transaction.
	var ring []db.RingQueueDepthsRow
	present, err := o.queries(o.pool).RingPresent(ctx)
	if err == nil && present {
		err = o.inDepthTx(ctx, func(q *db.Queries) (err error) {
			ring, err = q.RingQueueDepths(ctx, math.MaxInt64)
			return err
		})
	}
	if err != nil {
		return nil, o.readError(ctx, "QueueStats", err)
	}
	rows, err := o.queries(o.pool).QueueStats(ctx)
	if err != nil {
		return nil, o.readError(ctx, "QueueStats", err)
	}
	out := make([]QueueStats, len(rows))
	for i, r := range rows {
		out[i] = QueueStats{
			Queue: r.Queue, Ready: r.Ready, Scheduled: r.Scheduled, Blocked: r.Blocked, Leased: r.Leased, Expired: r.Expired,
			OldestAge: dbx.Seconds(r.OldestAgeSeconds), DeadLettered: r.DeadLettered,
			HeldKeysRetrying: r.HeldKeysRetrying, HeldKeysScheduled: r.HeldKeysScheduled,
			OldestHeldKey: r.OldestHeldKey, OldestHeldAge: dbx.Seconds(r.OldestHeldAgeSeconds),
			HandOffs: r.HandOffs,
		}
	}
	statsQueue := func(s *QueueStats) *string { return &s.Queue }
	out = addByQueue(out, ring, ringRowQueue, statsQueue, func(s *QueueStats, r db.RingQueueDepthsRow) {
		s.Ready += r.Ready
		s.Scheduled += r.Scheduled
		s.OldestAge = max(s.OldestAge, dbx.Seconds(r.OldestAgeSeconds))
	})
	paused, err := o.PausedQueues(ctx)
	if err != nil {
		return nil, err
	}
	// A paused queue is listed even without rows.
	return addByQueue(out, paused, func(p QueuePause) string { return p.Queue }, statsQueue, func(s *QueueStats, p QueuePause) {
		s.Paused = &p
	}), nil
}

// OutboxName names an outbox: the schema and the table of its rows.
type OutboxName struct {
	Schema string `json:"schema"`
	Table  string `json:"table"`
}

// String returns schema.table.
func (n OutboxName) String() string { return n.Schema + "." + n.Table }

// Outboxes returns every outbox in the database o's pool reaches, o's own
// included when it exists, ordered by schema and table: every table that
// has an outbox table's shape, whatever its schema version. It is for
// operators (outboxgen lists them when the outbox it was pointed at does
// not exist); it reads the catalog only.
func (o *Outbox) Outboxes(ctx context.Context) ([]OutboxName, error) {
	var rows []db.ListOutboxesRow
	err := pgx.BeginTxFunc(ctx, o.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		q := o.queries(tx)
		if err := q.DisableJIT(ctx); err != nil {
			return err
		}
		var err error
		rows, err = q.ListOutboxes(ctx)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: Outboxes: %w", err)
	}
	out := make([]OutboxName, len(rows))
	for i, r := range rows {
		out[i] = OutboxName{Schema: r.SchemaName, Table: r.TableName}
	}
	return out, nil
}

// readError is the error of a read of the outbox's tables that failed:
// when a table, column or function it needs does not exist and the
// schema is missing or at another version, the *SchemaError that names
// the fix; otherwise err, wrapped with the method's name.
func (o *Outbox) readError(ctx context.Context, method string, err error) error {
	if se := o.missingObject(ctx, err); se != nil {
		return se
	}
	return fmt.Errorf("outbox: %s: %w", method, err)
}

// missingObject is the *SchemaError that names the fix when err says a
// table, column or function does not exist and the outbox's schema is
// missing or at another version (read on the outbox's own pool); nil
// otherwise.
func (o *Outbox) missingObject(ctx context.Context, err error) *SchemaError {
	switch dbx.SQLState(err) {
	case "42P01", "42703", "42883": // undefined table, column, function
		if have, verr := o.SchemaVersion(ctx); verr == nil {
			return o.schemaMismatch(have)
		}
	}
	return nil
}

// RetryBacklog describes the rows of some queues that were handled at
// least once and are not finished: each waits for its retry, is due for
// it, or is being handled again.
type RetryBacklog struct {
	// Rows counts them.
	Rows int64
	// NextDueIn is how long, on the server's clock, until the earliest of
	// them is due, a row being handled counting as due now: negative when
	// one is overdue, zero when Rows is zero.
	NextDueIn time.Duration
}

// RetryBacklog reports the rows of queues that failed and are not
// finished. Rows scheduled at publish and never handled do not count. Like
// QueueStats it reads without locks, for operators and tests, not hot
// paths. Any queue name the table can hold may be given, also one a
// subscriber cannot serve.
func (o *Outbox) RetryBacklog(ctx context.Context, queues []string) (RetryBacklog, error) {
	if len(queues) == 0 {
		return RetryBacklog{}, &InputError{Field: "queues", Rule: "must name at least one queue"}
	}
	for i, q := range queues {
		if err := checkQueueToRead(fmt.Sprintf("queues[%d]", i), q); err != nil {
			return RetryBacklog{}, err
		}
	}
	r, err := o.queries(o.pool).RetryBacklog(ctx, queues)
	if err != nil {
		return RetryBacklog{}, fmt.Errorf("outbox: RetryBacklog: %w", err)
	}
	return RetryBacklog{Rows: r.Retrying, NextDueIn: dbx.Seconds(r.NextDueInSeconds)}, nil
}

// PendingMessage is a row still in the outbox, as [Outbox.Unprocessed]
// reads it: not yet acknowledged, whether due, scheduled or leased.
type PendingMessage struct {
	// ID is the row's id.
	ID int64
	// Queue is its queue.
	Queue string
	// Payload is the encoded message; decode it with the publisher's codec.
	Payload []byte
	// Headers are its headers.
	Headers map[string]string
	// RawHeaders holds the headers column as stored when it is not an
	// object of strings (another client wrote it; a subscriber ends such a
	// row with reason decode_error), and Headers is nil. Otherwise it is
	// nil.
	RawHeaders json.RawMessage
	// Deliveries counts its claims so far.
	Deliveries int
	// Leased says whether a subscriber holds it now.
	Leased bool
	// DueAt is when it becomes (or became) deliverable, server clock.
	DueAt time.Time
}

// Unprocessed returns up to limit rows of queue still in the outbox,
// oldest first (by id), without claiming them: it takes no lease and
// changes nothing, so it is safe beside running subscribers (tests,
// debugging). The rows in the ring (PublisherConfig.Tier TierRing) that
// no claim has consumed are among them, with no deliveries and not
// leased, also while a claim in flight holds their lane; it reads the
// queue's whole unconsumed backlog in the ring to order it.
// Any queue name the table can hold may be given, also one that
// [ValidateQueue] refuses (rows other clients wrote). It reads through the
// outbox's pool, so it sees committed rows only; [Outbox.UnprocessedTx]
// reads within a transaction.
func (o *Outbox) Unprocessed(ctx context.Context, queue string, limit int) ([]PendingMessage, error) {
	return o.unprocessed(ctx, "Unprocessed", o.pool, queue, limit)
}

// UnprocessedTx is [Outbox.Unprocessed] read through tx: the caller's
// transaction, whose own uncommitted rows it sees beside the committed
// ones, as a test asserting on what the code under test published before
// it commits does. It takes no lock and writes nothing, so it leaves tx
// as it found it.
func (o *Outbox) UnprocessedTx(ctx context.Context, tx DBTX, queue string, limit int) ([]PendingMessage, error) {
	if tx == nil {
		return nil, &InputError{Field: "tx", Rule: "must not be nil"}
	}
	return o.unprocessed(ctx, "UnprocessedTx", tx, queue, limit)
}

// unprocessed is Unprocessed and UnprocessedTx, reading through conn.
func (o *Outbox) unprocessed(ctx context.Context, method string, conn DBTX, queue string, limit int) ([]PendingMessage, error) {
	if err := checkQueueToRead("queue", queue); err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, &InputError{Field: "limit", Rule: "must be positive"}
	}
	maxRows := int32(min(limit, 1<<30))
	q := o.queries(conn)
	// The ring first: rows move from the ring into the table only, so a
	// row a claim moves between the two reads is read twice (and kept
	// once, as the table holds it), never missed.
	ringRows, err := q.RingUnprocessed(ctx, db.RingUnprocessedParams{Queue: queue, MaxRows: maxRows})
	if err != nil {
		return nil, o.readError(ctx, method, err)
	}
	rows, err := q.FetchUnprocessed(ctx, db.FetchUnprocessedParams{Queue: queue, MaxRows: maxRows})
	if err != nil {
		return nil, o.readError(ctx, method, err)
	}
	var hc headerCache
	out := make([]PendingMessage, 0, len(rows)+len(ringRows))
	for _, r := range rows {
		m := PendingMessage{ID: r.ID, Queue: r.Queue, Payload: r.Payload, Deliveries: int(r.DeliveriesCount),
			Leased: r.AcquiredToken.Valid, DueAt: r.NextAttemptAt}
		m.Headers, m.RawHeaders = readHeaders(&hc, r.Headers)
		out = append(out, m)
	}
	for _, r := range ringRows {
		m := PendingMessage{ID: r.ID, Queue: queue, Payload: r.Payload, DueAt: r.NextAttemptAt}
		m.Headers, m.RawHeaders = readHeaders(&hc, r.Headers)
		out = append(out, m)
	}
	// A stable sort keeps the table's row of an id ahead of the ring's.
	slices.SortStableFunc(out, func(a, b PendingMessage) int { return cmp.Compare(a.ID, b.ID) })
	out = slices.CompactFunc(out, func(a, b PendingMessage) bool { return a.ID == b.ID })
	return out[:min(len(out), limit)], nil
}
