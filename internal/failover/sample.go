package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Phases of a leg, as the sampler sees them.
const (
	phaseBefore = iota // both servers up
	phaseLag           // the standby held back
	phaseOutage        // the primary stopped, the standby not yet promoted
	phaseAfter         // the standby promoted
	phases
)

var phaseNames = [phases]string{"before", "lag", "outage", "after"}

// sample is what the sampler saw at its busiest in one phase.
type sample struct {
	reads    int   // samples read
	nextXid  int64 // the largest next transaction id seen
	locks    int64 // lock records
	leased   int64 // leased rows
	sleepers int64 // sleep records that hold
	handoffs int64 // recorded hand-overs
}

// sampler reads, every 50 ms, through the multi-host DSN, the state the
// subscribers keep in the database.
type sampler struct {
	pool  *pgxpool.Pool
	mu    sync.Mutex
	phase int
	by    [phases]sample
}

func newSampler(pool *pgxpool.Pool) *sampler { return &sampler{pool: pool} }

func (s *sampler) mark(phase int) {
	s.mu.Lock()
	s.phase = phase
	s.mu.Unlock()
}

func (s *sampler) run(ctx context.Context) {
	for ctx.Err() == nil {
		s.mu.Lock()
		phase := s.phase
		s.mu.Unlock()
		var x sample
		qctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		err := s.pool.QueryRow(qctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
			(SELECT count(*) FROM outbox_locks), (SELECT count(*) FROM outbox WHERE acquired_token IS NOT NULL),
			(SELECT count(*) FROM outbox_sleepers WHERE until > now()), (SELECT count(*) FROM outbox_handoff)`).Scan(&x.nextXid, &x.locks, &x.leased, &x.sleepers, &x.handoffs)
		cancel()
		if err == nil {
			s.mu.Lock()
			if s.phase == phase {
				b := &s.by[phase]
				b.reads++
				b.nextXid = max(b.nextXid, x.nextXid)
				b.locks = max(b.locks, x.locks)
				b.leased = max(b.leased, x.leased)
				b.sleepers = max(b.sleepers, x.sleepers)
				b.handoffs = max(b.handoffs, x.handoffs)
			}
			s.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *sampler) get() [phases]sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.by
}

// snapshot is the state the standby holds when the primary stopped,
// read before its promotion: what the old primary left for the new one.
type snapshot struct {
	ledger, outbox int64
	// orphans are outbox rows without their ledger row: a message whose
	// business row is missing.
	orphans  int64
	leased   int64
	blocked  int64
	locks    int64 // lock records
	lockRows int64 // rows lock records still hold
	// unseenXids are lock records naming a transaction id the standby
	// has not reached.
	unseenXids int64
	sleepers   int64 // sleep records that hold
	handoffs   int64
	nextXid    int64
}

func takeSnapshot(ctx context.Context, c *cluster) (snapshot, error) {
	var s snapshot
	conn, err := pgx.Connect(ctx, c.url("test"))
	if err != nil {
		return s, err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	err = conn.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM ledger), (SELECT count(*) FROM outbox),
		(SELECT count(*) FROM outbox o WHERE NOT EXISTS (SELECT FROM ledger l WHERE l.row_id = o.id)),
		(SELECT count(*) FROM outbox WHERE acquired_token IS NOT NULL), (SELECT count(*) FROM outbox WHERE blocked),
		(SELECT count(*) FROM outbox_locks),
		(SELECT count(*) FROM outbox o WHERE EXISTS (SELECT FROM outbox_locks l WHERE o.id <@ l.ids AND l.until > now())),
		(SELECT count(*) FROM outbox_locks WHERE xid >= pg_snapshot_xmax(pg_current_snapshot())::text::bigint),
		(SELECT count(*) FROM outbox_sleepers WHERE until > now()), (SELECT count(*) FROM outbox_handoff),
		pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(
		&s.ledger, &s.outbox, &s.orphans, &s.leased, &s.blocked, &s.locks, &s.lockRows, &s.unseenXids,
		&s.sleepers, &s.handoffs, &s.nextXid)
	return s, err
}

func (s snapshot) String() string {
	return fmt.Sprintf("%d ledger rows, %d outbox rows (%d without a ledger row, %d leased, %d blocked), "+
		"%d lock records holding %d rows (%d naming an xid it has not reached), %d sleep records, %d hand-overs; next xid %d",
		s.ledger, s.outbox, s.orphans, s.leased, s.blocked, s.locks, s.lockRows, s.unseenXids, s.sleepers, s.handoffs, s.nextXid)
}
