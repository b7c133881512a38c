// Package engine delivers an outbox's rows to a subscriber's handler, at
// least once, without knowing the message type. It owns a subscriber's
// run from its first claim to its stop: the fetcher, which asks its
// claim.Claimer for rows; the workers' deliveries and the decision of
// each outcome; the acknowledger's batched, lease-filtered writes;
// heartbeats; per-key hand-overs; sleep records; the stop; and the run's
// metric events and log summaries.
//
// It moves rows: an id, payload bytes, headers, a key, counts and a
// lease. The typed layer (package outbox) gives it, per worker, a
// function that decodes a claimed row into a Call of the typed handler,
// and it decides and writes each outcome. It imports the generated
// queries (db), dbx, crew, lease, claim and wakeup; it never imports package outbox,
// whose public types it mirrors (MetricEvent, DeliveryInfo,
// DeliveryOutcome) so the outbox package converts them without copying
// field by field.
package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/claim"
	"github.com/outboxgen/outboxgen/internal/wakeup"
)

// Subscriber is what the engine runs: a resolved subscriber
// configuration (see outbox.SubscriberConfig for each setting's meaning)
// and what it needs of its outbox, without a message type.
type Subscriber struct {
	Name                                    string
	Queues                                  []string
	Workers, FetchBatchSize                 int
	MinFetchInterval, MaxFetchInterval      time.Duration
	LeaseTTL, HeartbeatInterval, LockWindow time.Duration
	MaxDeliveries                           int
	DisableDeadLetter                       bool
	GracefulTimeout                         time.Duration
	AckBatchSize                            int
	AckLinger, QueryTimeout                 time.Duration
	ListenProbeInterval, ListenProbeTimeout time.Duration
	ListenDSN                               string
	ListenConnect                           func(ctx context.Context) (*pgx.Conn, error)
	// MinLockedClaim is the fewest rows a claim must have found for the
	// next one to claim by lock; 0 or negative: every claim by lock.
	MinLockedClaim int
	// Ring: the outbox has the log tier's ring (package ring) beside its
	// table, and the subscriber claims from both (claim.Env.Ring).
	// RingTurnAge is how long writers write into one of its partitions.
	Ring        bool
	RingTurnAge time.Duration

	Retry    Retry
	Metrics  MetricsRecorder  // nil: none
	Observer DeliveryObserver // nil: none
	Log      *slog.Logger

	// Pool is the outbox's pool; Queries runs its statements on a
	// connection, a transaction or the pool.
	Pool    *pgxpool.Pool
	Queries func(db.DBTX) *db.Queries
	// Hubs and Wake are the outbox's LISTEN connections and what they
	// need of it; HandoffChannel carries its hand-over announcements.
	Hubs           *wakeup.Hubs
	Wake           *wakeup.Source
	HandoffChannel string

	// Tx: the handler runs in a transaction of the engine's, which
	// deletes the row (see Call.HandleTx).
	Tx bool
	// Calls returns, for one worker, the function that decodes a claimed
	// row into a call of the handler. An error ends the delivery with
	// reason decode_error.
	Calls func() func(row *db.ClaimRow) (Call, error)
}

// Call is one decoded delivery, ready for the typed handler.
type Call interface {
	// Headers are the message's headers, for an observer.
	Headers() map[string]string
	// Handle runs the handler.
	Handle(ctx context.Context) error
	// HandleTx runs the transactional handler in tx, which the engine
	// commits or rolls back.
	HandleTx(ctx context.Context, tx pgx.Tx) error
}

// Retry is a subscriber's retry strategy, as the engine asks it: both
// methods turn a panic or an unusable answer into a problem, which ends
// the delivery.
type Retry interface {
	// NextDelay is the delay before attempt (the first failure is 1),
	// elapsed after the first, or false to end the delivery.
	NextDelay(attempt int, elapsed time.Duration, err error) (delay time.Duration, ok bool, problem error)
	// Allow reports whether the strategy's caps let a delivery retry
	// after delay, a delay the handler chose (RetryAfter).
	Allow(attempt int, elapsed, delay time.Duration, err error) (ok bool, problem error)
}

// Run delivers rows to s's handler until ctx is done, then stops as
// outbox.Subscriber.Run documents. The caller has checked the schema and
// the pool.
func Run(ctx context.Context, s *Subscriber) error {
	r := newRun(ctx, s)
	if s.Tx {
		r.liftIdle = s.idleLift(ctx)
	}
	// Hand-overs recorded while no subscriber listened are completed
	// before the first claim.
	r.handoffs.pending.Store(true)
	return r.run(ctx)
}

// PoolNeed is what s needs of its pool while it runs, besides a
// transactional handler's transactions: the connections its claims, its
// outcome writes and its heartbeats hold at their busiest.
func PoolNeed(s *Subscriber) int {
	claims := 1
	if claim.LocksRows(s.LockWindow, s.Pool.Config().MaxConns) {
		claims = claim.InFlight
	}
	peak := claims + 1 // and the acknowledger
	if s.HeartbeatInterval > 0 {
		peak++
	}
	return peak
}
