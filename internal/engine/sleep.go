package engine

import (
	"context"
	"crypto/rand"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
)

// sleeper is the fetcher's record in <table>_sleepers (migration 6).
// Writers of our queues' rows notify only while a subscriber's record
// holds, so a busy subscriber lets publishers commit without NOTIFY, which
// would serialise their commits. The fetcher makes the record when a claim
// finds nothing and ends it once claims keep finding rows.
//
// A writer that looked for records before ours was committed cannot have
// seen it. Such a writer is in progress when the record is made, or has
// committed; so after making the record the fetcher reads the transactions
// in progress, claims again, and until those transactions have ended it
// sleeps only briefly and claims again as they end. No wake-up is lost.
type sleeper struct {
	// id is the record's: a new one for each sleep (see Sleep).
	id pgtype.UUID
	// until is when the record lapses, on this process's clock, never
	// later than on the server's; zero when there is no record.
	until time.Time
	// xids are the transactions that were in progress when the record
	// was made and have not been seen to end.
	xids []int64
	// poll is the wait between checks on xids: sleepPollMin, doubling.
	poll time.Duration
	// found counts consecutive claims that found rows, rows the rows they
	// found, and busySince is when the first of them returned.
	found     int
	rows      int
	busySince time.Time
}

const (
	// sleepPollMin is the first wait for writers in progress when the
	// record was made: most commit within a few milliseconds.
	sleepPollMin = time.Millisecond
	// sleepRecordSlack is how much longer than MaxFetchInterval a record
	// still has to hold to be kept, and how much longer than twice that a
	// new one holds: a subscriber that stops refreshing its record (it
	// crashed) is notified for at most that long.
	sleepRecordSlack = 15 * time.Second
	// wakeAfterFound is how many claims in a row must find rows before
	// the record is ended: a subscriber that claims one row per wake-up
	// (a low publish rate, where NOTIFY costs publishers little) keeps it.
	wakeAfterFound = 2
	// wakeAfterBusy and wakeAfterRows bound how long, and for how many
	// rows, claims that keep finding rows, none of them a full batch, keep
	// the record. A subscriber that keeps up with a steady stream (each
	// claim finds the few rows published since the last) runs dry every
	// few milliseconds: ending its record at every second claim and
	// making it again at the next empty one cost it four statements a
	// cycle, about 125 cycles a second at 1,000 messages/s, and its
	// messages waited behind them. Past a few dozen rows the stream is
	// fast enough that publishers' NOTIFY, which makes their commits take
	// turns, costs them more. A full batch means a backlog, where
	// notifications are of no use: the record ends at the second claim.
	wakeAfterBusy = 50 * time.Millisecond
	wakeAfterRows = 24
)

func newSleeper() sleeper {
	s := sleeper{id: pgtype.UUID{Valid: true}}
	_, _ = rand.Read(s.id.Bytes[:]) // never fails (crypto/rand)
	return s
}

// found ends the record once claims keep finding rows: full batches, or
// some rows for wakeAfterBusy or wakeAfterRows. This claim found n rows;
// full tells whether that is all it asked for.
func (r *run) found(ctx context.Context, q *db.Queries, n int, full bool) {
	s := &r.sleeper
	s.xids = nil
	if s.found == 0 {
		s.busySince, s.rows = time.Now(), 0
	}
	s.found++
	s.rows += n
	// While a key hand-over waits for a publisher of the key to commit,
	// the record stays: that commit's notification retries it at once.
	if s.found < wakeAfterFound || s.until.IsZero() || !r.handoffs.retryAt.IsZero() {
		return
	}
	if !full && s.rows < wakeAfterRows && time.Since(s.busySince) < wakeAfterBusy {
		return
	}
	s.until = time.Time{}
	if err := q.Wake(ctx, s.id); err != nil && ctx.Err() == nil {
		// The record may still hold: writers notify until it lapses.
		r.s.Log.DebugContext(ctx, "outbox: could not end the sleep record", slog.Any("error", err))
	}
}

// asleep readies the fetcher to sleep after a claim that found nothing:
// it makes or refreshes the record and watches the writers that may have
// missed it. It reports whether to claim again before sleeping.
func (r *run) asleep(ctx context.Context, q *db.Queries) bool {
	s := &r.sleeper
	s.found = 0
	if r.deaf.Load() {
		// Writers' notifications would not arrive: poll, spare publishers
		// the NOTIFY a record would ask of them, and watch no writer that
		// may have missed the record.
		s.xids = nil
		if !s.until.IsZero() && q.Wake(ctx, s.id) == nil {
			s.until = time.Time{}
		}
		return false
	}
	if len(s.xids) > 0 {
		still, err := q.StillInFlight(ctx, s.xids)
		if err != nil {
			// Unknown: poll as without a record.
			s.xids = nil
			return false
		}
		ended := len(still) < len(s.xids)
		s.xids = still
		return ended
	}
	cfg := r.s
	now := time.Now()
	if s.until.After(now.Add(cfg.MaxFetchInterval + sleepRecordSlack)) {
		return false
	}
	held := s.until.After(now)
	if !held {
		s.id = newSleeper().id
	}
	d := 2*cfg.MaxFetchInterval + sleepRecordSlack
	if err := q.Sleep(ctx, db.SleepParams{ID: s.id, Queues: r.s.Queues, ForSeconds: d.Seconds()}); err != nil {
		s.until = time.Time{}
		if ctx.Err() == nil {
			r.s.Log.DebugContext(ctx, "outbox: could not record the subscriber's sleep; polling", slog.Any("error", err))
		}
		return false
	}
	s.until = now.Add(d)
	if held {
		// The record held throughout: every writer since saw it.
		return false
	}
	xids, err := q.InFlight(ctx)
	if err != nil {
		return true
	}
	s.xids, s.poll = xids, sleepPollMin
	return true
}

// sleepWait bounds an idle wait while writers that may have missed the
// record are in progress.
func (r *run) sleepWait(d time.Duration) time.Duration {
	s := &r.sleeper
	if len(s.xids) == 0 {
		return d
	}
	d = min(d, s.poll)
	s.poll = min(2*s.poll, r.s.MaxFetchInterval)
	return d
}

// leave removes the record when the run stops.
func (r *run) leave() {
	if err := r.queries().Leave(r.writes, r.sleeper.id); err != nil {
		r.s.Log.Debug("outbox: could not remove the sleep record; it lapses on its own", slog.Any("error", err))
	}
}
