package outbox

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/claim"
	"github.com/outboxgen/outboxgen/internal/engine"
	"github.com/outboxgen/outboxgen/internal/pgtest"
)

// What each statement on the hot path touches while a snapshot holds the
// vacuum horizon back, after 0 and after 20,000 rows went through the
// outbox since the snapshot was taken. A statement whose figures grow
// with the rows walks row versions vacuum cannot remove. Run it alone
// (-v prints, per statement, the relations and the scans behind its
// figures):
//
//	go test -run '^$' -bench BenchmarkHotPathBuffersUnderAHeldSnapshot -benchtime 1x -v ./outbox
//
// Each statement is sent as the library sends it (its SQL and arguments
// recorded from the generated query), under EXPLAIN (ANALYZE, BUFFERS) in
// a transaction rolled back, on a new session whose caches a first pass
// filled, against the same live rows whatever went before: once before
// the outbox's tables were ever analyzed (stats=none) and once after a
// VACUUM (ANALYZE) (stats=analyzed), since the plans differ (and a
// session's PL/pgSQL functions keep the plans they made first, so each
// is measured on a session of its own). The churn's leases have all
// expired by then, as after a hold longer than the lease. Two figures
// per statement:
//
//   - <name>-buffers: the shared buffers (hit and read) EXPLAIN counts for
//     the statement's plan. It counts what BEFORE row triggers run, but
//     not what AFTER triggers run (EXPLAIN shows them as time only).
//   - <name>-all: the blocks of the outbox's own tables, indexes and
//     sequences that the whole statement asked for (the transaction's
//     pg_stat_get_xact_blocks_fetched before and after): planning, plan,
//     and every trigger and function it fires. Catalog reads are not
//     counted. This is the figure to bound.
//
// The statements the trigger functions run are measured on their own too
// (trg-*), as the functions write them, so that the -all figure of a
// statement can be traced to the trigger statement behind it.
func BenchmarkHotPathBuffersUnderAHeldSnapshot(b *testing.B) {
	for _, n := range []int{0, 20000} {
		b.Run(fmt.Sprintf("rows=%d", n), func(b *testing.B) {
			h := newHotPathBench(b)
			h.churn(n)
			h.settle()
			// Plans follow the statistics: measured before the tables
			// were ever analyzed, and after a VACUUM (ANALYZE) as
			// autovacuum runs it (it removes nothing the snapshot keeps).
			b.Run("stats=none", func(b *testing.B) { h.report(b, n) })
			h.analyze()
			b.Run("stats=analyzed", func(b *testing.B) { h.report(b, n) })
		})
	}
}

// report measures every hot-path statement on behalf of b, the
// benchmark of n rows, and reports the figures.
func (h *hotPathBench) report(b *testing.B, n int) {
	parent := h.tb
	h.tb = b
	defer func() { h.tb = parent }()
	costs := h.measureOnNewSession()
	for b.Loop() {
		costs = h.measure()
	}
	for _, c := range costs {
		b.ReportMetric(float64(c.plan), c.name+"-buffers")
		b.ReportMetric(float64(c.all), c.name+"-all")
		b.Logf("rows=%d %-22s plan %6d  all %6d  %s", n, c.name, c.plan, c.all, c.top())
	}
}

// measureOnNewSession measures every hot-path statement on a new
// session, after a first pass that fills the session's caches of the
// catalogs (which EXPLAIN's buffers count too); the session stays h's.
func (h *hotPathBench) measureOnNewSession() []hotPathCost {
	h.tb.Helper()
	conn, err := pgx.Connect(h.ctx, h.d.URL)
	h.must(err, "connect")
	h.tb.Cleanup(func() { _ = conn.Close(context.Background()) })
	h.conn = conn
	h.measure()
	return h.measure()
}

// hotPathBench is one benchmark's outbox, with a snapshot held open
// since before any of its rows was written.
type hotPathBench struct {
	tb  testing.TB
	ctx context.Context
	d   *pgtest.DB
	ob  *Outbox
	q   *db.Queries
	// sleeper is the id of the live state's sleep record, of the
	// subscriber the benchmark plays, and presence that of its presence
	// record.
	sleeper, presence pgtype.UUID
	// live is the state settle wrote.
	live hotPathLive
	// conn is the session the statements are measured on, a new one for
	// each report: a session's PL/pgSQL functions keep the plans they
	// made first.
	conn *pgx.Conn
}

// hotPathQueue is the queue the benchmark churns; hotPathOther is a
// second queue of the claims of several queues, always empty.
const (
	hotPathQueue = "q"
	hotPathOther = "r"
	// hotPathKeys is how many ordering keys the churn cycles through: each
	// is drained and used again.
	hotPathKeys = 20
	// hotPathRound is how many rows each round of the churn publishes and
	// drains.
	hotPathRound = 100
	// hotPathClaim is the rows of one claim, as a subscriber's batch.
	hotPathClaim = 50
	// hotPathChurnTTL is the lease, in seconds, of the churn's claims by
	// lease and the hold of its records of claims by lock: short, so that
	// every one has ended when the statements are measured, as after a
	// hold longer than LeaseTTL.
	hotPathChurnTTL = 1
	// hotPathExpiredWithin is how long ago, in seconds, the expired
	// leases a claim reads expired: a subscriber that claims all the time
	// read them all about a second ago, and looks FloorMargin further back.
	hotPathExpiredWithin = 2.0
)

// newHotPathBench migrates an outbox into a fresh schema and holds a
// REPEATABLE READ snapshot (one that has read something) until tb ends.
func newHotPathBench(tb testing.TB) *hotPathBench {
	tb.Helper()
	d, ob := benchOutbox(tb)
	holdSnapshot(tb, d.URL, "")
	return &hotPathBench{tb: tb, ctx: tb.Context(), d: d, ob: ob, q: ob.queries(d.Pool), sleeper: newSleepID()}
}

// must fails b on err.
func (h *hotPathBench) must(err error, what string) {
	h.tb.Helper()
	if err != nil {
		h.tb.Fatalf("%s: %v", what, err)
	}
}

// churn publishes and drains n rows of hotPathQueue in rounds of
// hotPathRound, as a subscriber of that queue and its publishers do:
// each round the subscriber sleeps (its record written, the transactions
// in flight read), rows are published (unkeyed, keyed one at a time and
// keyed in batches, over keys used again and again), the subscriber
// wakes and claims until nothing is left, by lease in even rounds and
// by lock in odd ones. Claims by lease extend their leases, retry one row
// in 20 once and dead-letter one in 100; claims by lock delete their
// rows. Every claim is preceded by the hand-over call, and every idle
// subscriber asks for the next due time and sweeps the lock records.
// It returns when every lease it wrote expired longer ago than a claim
// that reads from the floors looks back.
func (h *hotPathBench) churn(n int) {
	h.tb.Helper()
	payload := []byte(`{"n":1}`)
	start := time.Now()
	for done := 0; done < n; done += hotPathRound {
		round := done / hotPathRound
		// Each sleep has a record of its own, as the subscriber's.
		sleeper := newSleepID()
		h.must(h.q.Sleep(h.ctx, db.SleepParams{ID: sleeper, Queues: []string{hotPathQueue}, ForSeconds: 2}), "Sleep")
		_, err := h.q.InFlight(h.ctx)
		h.must(err, "InFlight")
		for i := 0; i < hotPathRound-44; i++ {
			_, err := h.q.Publish(h.ctx, db.PublishParams{Queue: hotPathQueue, Payload: payload})
			h.must(err, "Publish")
		}
		for i := range 4 {
			k := fmt.Sprintf("k%d", (round*4+i)%hotPathKeys)
			_, err := h.q.Publish(h.ctx, db.PublishParams{Queue: hotPathQueue, Payload: payload, OrderingKey: &k})
			h.must(err, "Publish keyed")
		}
		for i := range 4 {
			k := fmt.Sprintf("k%d", (round*4+i+2)%hotPathKeys)
			_, err := h.q.PublishBatch(h.ctx, db.PublishBatchParams{Queue: hotPathQueue, OrderingKey: &k,
				Payloads: slices.Repeat([][]byte{payload}, 10)})
			h.must(err, "PublishBatch")
		}
		h.must(h.q.Wake(h.ctx, sleeper), "Wake")
		// A subscriber writes its presence record every 5 s: a round is
		// 100 rows, about every 50 rounds at 1,000 rows a second.
		if round%50 == 0 {
			h.must(h.q.Present(h.ctx, h.presenceRecord()), "Present")
		}
		for {
			_, err := h.q.HandOff(h.ctx, db.HandOffParams{Queues: []string{hotPathQueue}, MaxKeys: engine.HandoffMaxKeys})
			h.must(err, "HandOff")
			var got int
			if round%2 == 1 {
				got = h.drainByLock()
			} else {
				got = h.drainByLease()
			}
			if got == 0 {
				break
			}
		}
		_, err = h.q.NextDueIn(h.ctx, db.NextDueInParams{Queues: []string{hotPathQueue}, SinceClaimSeconds: 0.01})
		if err != nil && err != pgx.ErrNoRows {
			h.tb.Fatalf("NextDueIn: %v", err)
		}
		_, err = h.q.SweepLocks(h.ctx)
		h.must(err, "SweepLocks")
	}
	var left int
	h.must(h.d.Pool.QueryRow(h.ctx, "SELECT count(*) FROM outbox").Scan(&left), "count")
	if left != 0 {
		h.tb.Fatalf("%d rows left after the churn", left)
	}
	if n > 0 {
		h.tb.Logf("churned %d rows in %v", n, time.Since(start).Round(time.Millisecond))
	}
	// Every lease the churn wrote expires.
	var end time.Time
	h.must(h.d.Pool.QueryRow(h.ctx, "SELECT clock_timestamp()").Scan(&end), "now")
	for past := false; !past; {
		h.must(h.d.Pool.QueryRow(h.ctx, "SELECT clock_timestamp() > $1::timestamptz + make_interval(secs => $2::float8)",
			end, hotPathChurnTTL+hotPathExpiredWithin+claim.FloorMargin.Seconds()).Scan(&past), "now")
		if !past {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// drainByLease claims up to hotPathClaim rows by lease and ends their
// deliveries as the lease path writes them; it returns the rows claimed.
func (h *hotPathBench) drainByLease() int {
	h.tb.Helper()
	tok := newToken()
	rows, err := h.q.ClaimQueue(h.ctx, db.ClaimQueueParams{Token: tok, Queue: hotPathQueue, MaxRows: hotPathClaim, LeaseTtlSeconds: hotPathChurnTTL})
	h.must(err, "ClaimQueue")
	if len(rows) == 0 {
		return 0
	}
	all := idsOf(rows, func(r db.ClaimQueueRow) int64 { return r.ID })
	_, err = h.q.ExtendLeases(h.ctx, db.ExtendLeasesParams{LeaseTtlSeconds: hotPathChurnTTL, Ids: all, Tokens: slices.Repeat([]pgtype.UUID{tok}, len(all))})
	h.must(err, "ExtendLeases")
	var acked, retried []int64
	for _, r := range rows {
		switch {
		case r.ID%100 == 1:
			_, err := h.q.DeadLetterWithLease(h.ctx, db.DeadLetterWithLeaseParams{Attempted: true, Reason: "retry_exhausted", ID: r.ID, Token: tok})
			h.must(err, "DeadLetterWithLease")
		case r.ID%20 == 0 && r.DeliveriesCount == 1:
			retried = append(retried, r.ID)
		default:
			acked = append(acked, r.ID)
		}
	}
	if len(retried) > 0 {
		_, err := h.q.MarkPendingBatchWithLease(h.ctx, db.MarkPendingBatchWithLeaseParams{Ids: retried,
			Tokens: slices.Repeat([]pgtype.UUID{tok}, len(retried)), DelaySeconds: make([]float64, len(retried)),
			LastErrors: slices.Repeat([]string{"failed"}, len(retried))})
		h.must(err, "MarkPendingBatchWithLease")
	}
	if len(acked) > 0 {
		_, err := h.q.DeleteBatchWithLease(h.ctx, db.DeleteBatchWithLeaseParams{Ids: acked, Tokens: slices.Repeat([]pgtype.UUID{tok}, len(acked))})
		h.must(err, "DeleteBatchWithLease")
	}
	return len(rows)
}

// idsOf returns the ids of rows, in their order.
func idsOf[R any](rows []R, id func(R) int64) []int64 {
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = id(r)
	}
	return ids
}

// drainByLock claims up to hotPathClaim rows by lock, records the claim,
// and ends it by deleting every row; it returns the rows claimed.
func (h *hotPathBench) drainByLock() int {
	h.tb.Helper()
	tx, err := h.d.Pool.Begin(h.ctx)
	h.must(err, "begin")
	defer func() { _ = tx.Rollback(context.Background()) }()
	q := h.ob.queries(tx)
	rows, err := q.LockQueue(h.ctx, db.LockQueueParams{Queue: hotPathQueue, MaxRows: hotPathClaim, IdleTimeoutMs: 30000})
	h.must(err, "LockQueue")
	if len(rows) == 0 {
		return 0
	}
	lower, upper := claim.Runs(idsOf(rows, func(r db.LockQueueRow) int64 { return r.ID }))
	_, err = h.q.RecordLock(h.ctx, db.RecordLockParams{Lower: lower, Upper: upper, Xid: rows[0].Xid, LeaseTtlSeconds: hotPathChurnTTL})
	h.must(err, "RecordLock")
	h.must(q.ConfirmLocked(h.ctx), "ConfirmLocked")
	_, err = q.DeleteLocked(h.ctx, db.DeleteLockedParams{Lower: lower, Upper: upper})
	h.must(err, "DeleteLocked")
	h.must(q.EndLockRecord(h.ctx, db.EndLockRecordParams{Xid: rows[0].Xid}), "EndLockRecord")
	h.must(tx.Commit(h.ctx), "commit")
	return len(rows)
}

// hotPathLive is the outbox's live state that every statement is measured
// against, the same whatever the churn before it.
type hotPathLive struct {
	// leased holds key k0's head and an unkeyed row, leased with token.
	leased []int64
	token  pgtype.UUID
	// due are unkeyed rows due now, unleased.
	due []int64
	// floor is where a subscriber's claims of the queue read from:
	// FloorMargin before its oldest row due.
	floor time.Time
	// expired is the row whose lease expired.
	expired int64
}

// settle writes the live state: a fresh sleep record, key k0's head and
// the next row behind it, a dozen unkeyed rows of which two are leased
// and one's lease expired, a scheduled row with a timer id.
func (h *hotPathBench) settle() {
	h.tb.Helper()
	payload := []byte(`{"n":1}`)
	h.must(h.q.Sleep(h.ctx, db.SleepParams{ID: h.sleeper, Queues: []string{hotPathQueue}, ForSeconds: 600}), "Sleep")
	k0 := "k0"
	for range 2 {
		_, err := h.q.Publish(h.ctx, db.PublishParams{Queue: hotPathQueue, Payload: payload, OrderingKey: &k0})
		h.must(err, "Publish keyed")
	}
	for range 12 {
		_, err := h.q.Publish(h.ctx, db.PublishParams{Queue: hotPathQueue, Payload: payload})
		h.must(err, "Publish")
	}
	timer := "t1"
	_, err := h.q.PublishTimer(h.ctx, db.PublishTimerParams{Queue: hotPathQueue, Payload: payload, TimerID: timer, DelaySeconds: 3600})
	h.must(err, "PublishTimer")
	tok := newToken()
	leased, err := h.q.ClaimQueue(h.ctx, db.ClaimQueueParams{Token: tok, Queue: hotPathQueue, MaxRows: 2, LeaseTtlSeconds: 600})
	h.must(err, "ClaimQueue")
	if len(leased) != 2 || leased[0].OrderingKey == nil {
		h.tb.Fatalf("leased %d rows, want k0's head and an unkeyed row", len(leased))
	}
	expired, err := h.q.ClaimQueue(h.ctx, db.ClaimQueueParams{Token: newToken(), Queue: hotPathQueue, MaxRows: 1, LeaseTtlSeconds: -1})
	h.must(err, "ClaimQueue expired")
	if len(expired) != 1 {
		h.tb.Fatalf("leased %d rows with an expired lease, want 1", len(expired))
	}
	var sizes string
	h.must(h.d.Pool.QueryRow(h.ctx, `SELECT string_agg(c.relname || '=' || pg_relation_size(c.oid) / 8192, ' ' ORDER BY c.relname)
		FROM pg_class AS c WHERE c.relnamespace = (SELECT n.oid FROM pg_namespace AS n WHERE n.nspname = $1) AND c.relkind IN ('r', 'i')`,
		h.d.Schema).Scan(&sizes), "sizes")
	h.tb.Logf("pages: %s", sizes)
	live := hotPathLive{leased: []int64{leased[0].ID, leased[1].ID}, token: tok, expired: expired[0].ID}
	rows, err := h.d.Pool.Query(h.ctx, `SELECT id FROM outbox WHERE acquired_token IS NULL AND ordering_key IS NULL
		AND next_attempt_at <= now() ORDER BY id`)
	h.must(err, "due rows")
	live.due, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	h.must(err, "due rows")
	if len(live.due) != 10 {
		h.tb.Fatalf("%d unkeyed rows due, want 10", len(live.due))
	}
	h.must(h.d.Pool.QueryRow(h.ctx, `SELECT min(next_attempt_at) - make_interval(secs => $1::float8) FROM outbox
		WHERE acquired_token IS NULL AND NOT blocked AND next_attempt_at <= now()`, claim.FloorMargin.Seconds()).Scan(&live.floor), "floor")
	h.live = live
	// Autovacuum analyzes the small tables the subscribers write within
	// their first few dozen changes; the outbox's own table is measured
	// before its first analysis too (report, stats=none).
	for _, t := range []string{"outbox_locks", "outbox_sleepers", "outbox_handoff"} {
		_, err := h.d.Pool.Exec(h.ctx, "ANALYZE "+t)
		h.must(err, "ANALYZE "+t)
	}
}

// analyze vacuums and analyzes the outbox's tables as autovacuum would:
// the held snapshot keeps every dead row version.
func (h *hotPathBench) analyze() {
	h.tb.Helper()
	for _, t := range []string{"outbox", "outbox_locks", "outbox_sleepers", "outbox_handoff"} {
		_, err := h.d.Pool.Exec(h.ctx, "VACUUM (ANALYZE) "+t)
		h.must(err, "VACUUM "+t)
	}
}

// hotPathCost is what one statement touched.
type hotPathCost struct {
	name string
	// plan is the shared buffers EXPLAIN counts for the statement's plan;
	// all is the blocks of the outbox's relations the whole statement
	// asked for, by relation in rels.
	plan, all int
	rels      map[string]int
	// scans are the plan's costliest scans.
	scans []string
	// probes is the rows of the plan's function scans: for in-flight,
	// the transactions in progress it looked up.
	probes float64
}

// perProbe is c, of a statement that probes the outbox once per
// transaction in progress in the cluster (in-flight), counted per probe,
// rounded up: how many transactions other sessions (other tests) hold
// open as it runs is not the outbox's doing.
func (c hotPathCost) perProbe() hotPathCost {
	probes := max(int(c.probes), 1)
	per := func(n int) int { return (n + probes - 1) / probes }
	out := hotPathCost{name: c.name, plan: per(c.plan), all: per(c.all), rels: map[string]int{}, scans: c.scans}
	for r, n := range c.rels {
		out.rels[r] = per(n)
	}
	return out
}

// top names the relations behind c.all, the most blocks first.
func (c hotPathCost) top() string {
	names := make([]string, 0, len(c.rels))
	for r := range c.rels {
		names = append(names, r)
	}
	slices.SortFunc(names, func(a, b string) int {
		if c.rels[a] != c.rels[b] {
			return c.rels[b] - c.rels[a]
		}
		return strings.Compare(a, b)
	})
	var s []string
	for _, r := range names {
		s = append(s, fmt.Sprintf("%s=%d", r, c.rels[r]))
	}
	out := strings.Join(s, " ")
	if len(c.scans) > 0 {
		out += " | plan: " + strings.Join(c.scans, " ")
	}
	return out
}

// measure runs every hot-path statement against the live state and
// returns what each touched, in the order of the path: publish,
// claim, heartbeat, outcomes, hand-over, sleep and wake-up.
func (h *hotPathBench) measure() []hotPathCost {
	h.tb.Helper()
	live, ctx := h.live, h.ctx
	q1, both := []string{hotPathQueue}, []string{hotPathQueue, hotPathOther}
	payload := []byte(`{"n":1}`)
	k0, k1, k2 := "k0", "k1", "k2"
	toks := func(n int) []pgtype.UUID { return slices.Repeat([]pgtype.UUID{live.token}, n) }
	due5 := live.due[:5]
	// Expired leases are read from FloorMargin before the live expired
	// lease expired, as by a claim that read them all just before it
	// did: how long ago that is, as each statement is sent.
	within := func() *float64 {
		var w float64
		h.must(h.conn.QueryRow(ctx, `SELECT extract(epoch FROM now() - lease_expires_at)::float8 + $2 FROM outbox WHERE id = $1`,
			live.expired, claim.FloorMargin.Seconds()).Scan(&w), "expired within")
		return &w
	}
	// Claims by lock start at the floor: past every row due before it.
	from := int64(math.MinInt64 + 1)
	lower, upper := claim.Runs(due5)
	// RecordLock records only the claim of a transaction in progress.
	claimTx, err := h.d.Pool.Begin(ctx)
	h.must(err, "begin")
	defer func() { _ = claimTx.Rollback(context.Background()) }()
	var xid int64
	h.must(claimTx.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&xid), "xid")
	other := newSleepID()

	statements := []struct {
		name string
		call func(q *db.Queries)
	}{
		{"publish", func(q *db.Queries) {
			_, _ = q.Publish(ctx, db.PublishParams{Queue: hotPathQueue, Payload: payload})
		}},
		{"publish-key-drained", func(q *db.Queries) {
			_, _ = q.Publish(ctx, db.PublishParams{Queue: hotPathQueue, Payload: payload, OrderingKey: &k1})
		}},
		{"publish-key-held", func(q *db.Queries) {
			_, _ = q.Publish(ctx, db.PublishParams{Queue: hotPathQueue, Payload: payload, OrderingKey: &k0})
		}},
		{"publish-batch-keyed", func(q *db.Queries) {
			_, _ = q.PublishBatch(ctx, db.PublishBatchParams{Queue: hotPathQueue, OrderingKey: &k2, Payloads: slices.Repeat([][]byte{payload}, 10)})
		}},
		{"publish-batch", func(q *db.Queries) {
			_, _ = q.PublishBatch(ctx, db.PublishBatchParams{Queue: hotPathQueue, Payloads: slices.Repeat([][]byte{payload}, 10)})
		}},
		{"publish-ring", func(q *db.Queries) {
			_, _ = q.PublishRing(ctx, db.PublishRingParams{Queue: hotPathQueue, Payload: payload})
		}},
		{"publish-ring-keyed", func(q *db.Queries) {
			_, _ = q.PublishRing(ctx, db.PublishRingParams{Queue: hotPathQueue, Payload: payload, OrderingKey: &k0})
		}},
		{"publish-ring-batch", func(q *db.Queries) {
			_, _ = q.PublishRingBatch(ctx, db.PublishRingBatchParams{Queue: hotPathQueue, Payloads: slices.Repeat([][]byte{payload}, 10)})
		}},
		{"publish-timer", func(q *db.Queries) {
			_, _ = q.PublishTimer(ctx, db.PublishTimerParams{Queue: hotPathQueue, Payload: payload, TimerID: "t2"})
		}},
		{"cancel-timer", func(q *db.Queries) {
			_, _ = q.CancelTimer(ctx, db.CancelTimerParams{Queue: hotPathQueue, TimerID: "t1"})
		}},
		{"claim-queue", func(q *db.Queries) {
			_, _ = q.ClaimQueue(ctx, db.ClaimQueueParams{Token: newToken(), Queue: hotPathQueue, Floor: &live.floor,
				MaxRows: hotPathClaim, LeaseTtlSeconds: 30, ExpiredWithin: within()})
		}},
		{"claim", func(q *db.Queries) {
			_, _ = q.Claim(ctx, db.ClaimParams{Token: newToken(), Queues: both, Floors: []time.Time{live.floor, {}},
				MaxRows: hotPathClaim, LeaseTtlSeconds: 30, ExpiredWithin: within()})
		}},
		{"lock-queue", func(q *db.Queries) {
			_, _ = q.LockQueue(ctx, db.LockQueueParams{Queue: hotPathQueue, MaxRows: hotPathClaim, IdleTimeoutMs: 30000,
				AfterAt: &live.floor, AfterID: &from})
		}},
		{"lock", func(q *db.Queries) {
			_, _ = q.Lock(ctx, db.LockParams{Queues: both, PerQueue: hotPathClaim / 2, MaxRows: hotPathClaim, IdleTimeoutMs: 30000,
				AfterAt: []time.Time{live.floor, {}}, AfterID: []int64{from, math.MinInt64}})
		}},
		{"claim-queue-sweep", func(q *db.Queries) {
			_, _ = q.ClaimQueue(ctx, db.ClaimQueueParams{Token: newToken(), Queue: hotPathQueue, MaxRows: hotPathClaim, LeaseTtlSeconds: 30})
		}},
		{"claim-expired", func(q *db.Queries) {
			_, _ = q.ClaimExpired(ctx, db.ClaimExpiredParams{Token: newToken(), Queues: q1, MaxRows: hotPathClaim, LeaseTtlSeconds: 30,
				ExpiredWithin: within()})
		}},
		{"recorded-among", func(q *db.Queries) { _, _ = q.RecordedAmong(ctx, due5) }},
		{"record-lock", func(q *db.Queries) {
			_, _ = q.RecordLock(ctx, db.RecordLockParams{Lower: lower, Upper: upper, Xid: xid, LeaseTtlSeconds: 30})
		}},
		{"ring-in-use", func(q *db.Queries) { _, _ = q.RingInUse(ctx, both) }},
		{"next-due-in", func(q *db.Queries) {
			_, _ = q.NextDueIn(ctx, db.NextDueInParams{Queues: q1, SinceClaimSeconds: 0.01})
		}},
		{"extend-leases", func(q *db.Queries) {
			_, _ = q.ExtendLeases(ctx, db.ExtendLeasesParams{LeaseTtlSeconds: 30, Ids: live.leased, Tokens: toks(2)})
		}},
		{"ack-batch", func(q *db.Queries) {
			_, _ = q.DeleteBatchWithLease(ctx, db.DeleteBatchWithLeaseParams{Ids: live.leased, Tokens: toks(2)})
		}},
		{"ack-one", func(q *db.Queries) {
			_, _ = q.DeleteWithLease(ctx, db.DeleteWithLeaseParams{ID: live.leased[1], Token: live.token})
		}},
		{"delete-locked", func(q *db.Queries) {
			_, _ = q.DeleteLocked(ctx, db.DeleteLockedParams{Lower: lower, Upper: upper})
		}},
		{"lease-locked", func(q *db.Queries) {
			_, _ = q.LeaseLocked(ctx, db.LeaseLockedParams{Token: newToken(), LeaseTtlSeconds: 30, Ids: due5, Deliveries: []int32{1, 1, 1, 1, 1}})
		}},
		{"forget-aborted", func(q *db.Queries) {
			_ = q.ForgetAborted(ctx, db.ForgetAbortedParams{Xid: xid, Ids: due5})
		}},
		{"end-lock-record", func(q *db.Queries) {
			_ = q.EndLockRecord(ctx, db.EndLockRecordParams{Xid: xid})
		}},
		{"retry", func(q *db.Queries) {
			_, _ = q.MarkPendingBatchWithLease(ctx, db.MarkPendingBatchWithLeaseParams{Ids: live.leased, Tokens: toks(2),
				DelaySeconds: []float64{1, 1}, LastErrors: []string{"failed", "failed"}})
		}},
		{"release", func(q *db.Queries) {
			_, _ = q.ReleaseBatchWithLease(ctx, db.ReleaseBatchWithLeaseParams{Ids: live.leased, Tokens: toks(2)})
		}},
		{"dead-letter", func(q *db.Queries) {
			_, _ = q.DeadLetterWithLease(ctx, db.DeadLetterWithLeaseParams{Attempted: true, Reason: "retry_exhausted", ID: live.leased[0], Token: live.token})
		}},
		{"hand-off", func(q *db.Queries) {
			_, _ = q.HandOff(ctx, db.HandOffParams{Queues: q1, MaxKeys: engine.HandoffMaxKeys})
		}},
		{"sweep-locks", func(q *db.Queries) { _, _ = q.SweepLocks(ctx) }},
		{"sleep", func(q *db.Queries) {
			_ = q.Sleep(ctx, db.SleepParams{ID: h.sleeper, Queues: q1, ForSeconds: 2})
		}},
		{"wake", func(q *db.Queries) { _ = q.Wake(ctx, h.sleeper) }},
		{"present", func(q *db.Queries) { _ = q.Present(ctx, h.presenceRecord()) }},
		{"absent", func(q *db.Queries) { _ = q.Absent(ctx, other) }},
		{"leave", func(q *db.Queries) { _ = q.Leave(ctx, other) }},
		{"in-flight", func(q *db.Queries) { _, _ = q.InFlight(ctx) }},
	}
	costs := make([]hotPathCost, 0, len(statements)+len(hotPathTriggerStatements))
	for _, s := range statements {
		c := h.cost(s.name, s.call)
		if s.name == "in-flight" {
			c = c.perProbe()
		}
		costs = append(costs, c)
	}
	var next int64
	h.must(h.conn.QueryRow(ctx, "SELECT pg_sequence_last_value('outbox_id_seq') + 1").Scan(&next), "last id")
	for _, s := range hotPathTriggerStatements {
		args := s.args
		switch s.name {
		case "trg-key-count":
			args = []any{hotPathQueue, "k0", next}
		case "trg-unblock-heads":
			args = []any{[]string{hotPathQueue}, []string{"k0"}, []int64{live.leased[0]}}
		}
		costs = append(costs, h.costOf(s.name, s.sql, args...))
	}
	return costs
}

// hotPathTriggerStatements are the statements the outbox's trigger
// functions (schema 12) run on the hot path, as they run them, with
// arguments of the live state: EXPLAIN shows what a trigger does only as
// time, and the -all figure of the statement that fires it does not say
// which of its statements touched what.
var hotPathTriggerStatements = []struct {
	name string
	sql  string
	args []any
}{
	// outbox_key_insert: whether the key has a row, a key that was
	// drained.
	{"trg-key-insert-drained", hotPathKeyProbe, []any{hotPathQueue, "k1"}},
	// The same, a key with rows (k0: its head and the row behind it).
	{"trg-key-insert-held", hotPathKeyProbe, []any{hotPathQueue, "k0"}},
	// outbox_notify at READ COMMITTED: the key's rows from the
	// statement's first on (the first id the statement would draw).
	{"trg-key-count", `SELECT count(*) FROM outbox AS o
		WHERE o.ordering_key IS NOT NULL AND o.queue = $1 AND o.ordering_key = $2 AND o.id >= $3`, nil},
	// outbox_unblock_heads (the delete trigger's hand-over and
	// outbox_hand_off): each key's next row past the head deleted, for
	// k0 (its head, the live state's first row, and the row behind it).
	{"trg-unblock-heads", `SELECT h.id, h.blocked
		FROM (SELECT u.q, u.k, min(coalesce(u.a, -9223372036854775808)) AS a
		      FROM unnest($1::text[], $2::text[], $3::bigint[]) AS u(q, k, a) GROUP BY u.q, u.k) AS k
		LEFT JOIN LATERAL (
		    SELECT o.id, o.blocked FROM outbox AS o
		    WHERE o.ordering_key IS NOT NULL AND o.queue = k.q COLLATE "C"
		      AND (o.ordering_key, o.id) > (k.k COLLATE "C", k.a)
		      AND (o.ordering_key, o.id) <= (k.k COLLATE "C", 9223372036854775807)
		    ORDER BY o.queue, o.ordering_key, o.id LIMIT 1
		) AS h ON true`, nil},
	// outbox_notify and outbox_wake: whether anyone sleeps.
	{"trg-notify-sleepers", `SELECT coalesce((SELECT true FROM outbox_sleepers AS s WHERE s.until > now()
		ORDER BY s.until DESC LIMIT 1), false)`, nil},
	{"trg-wake-sleepers", `SELECT coalesce((SELECT true FROM outbox_sleepers AS s WHERE s.until > now() AND $1 = ANY (s.queues)
		ORDER BY s.until DESC LIMIT 1), false)`, []any{hotPathQueue}},
	// outbox_set_sleep_horizon, after every change to the sleep records.
	{"trg-sleep-horizon", `SELECT ceil(date_part('epoch', max(s.until)) * 1000)::bigint
		FROM outbox_sleepers AS s WHERE s.until > now()`, nil},
}

// hotPathKeyProbe is outbox_key_insert's look for a row of key $2 of
// queue $1 (schema 12).
const hotPathKeyProbe = `SELECT coalesce((SELECT true FROM outbox AS o
	WHERE o.ordering_key IS NOT NULL AND o.queue = $1::text COLLATE "C"
	  AND (o.ordering_key, o.id) <= ($2::text COLLATE "C", 9223372036854775807)
	  AND (o.ordering_key, o.id) >= ($2::text COLLATE "C", -9223372036854775808)
	ORDER BY o.queue DESC, o.ordering_key DESC, o.id DESC LIMIT 1), false)`

// scanBuffers lists the scans under n with the buffers each touched,
// those that touched more than 10.
func (n *planNode) scanBuffers() []string {
	var out []string
	if strings.Contains(n.NodeType, "Scan") && n.Hit+n.Read > 10 {
		out = append(out, fmt.Sprintf("%s(%s%s)=%d", n.NodeType, n.RelationName, n.IndexName, n.Hit+n.Read))
	}
	for i := range n.Plans {
		out = append(out, n.Plans[i].scanBuffers()...)
	}
	return out
}

// cost runs the statement that call sends under EXPLAIN (ANALYZE,
// BUFFERS) in a transaction it rolls back, and returns what it touched.
func (h *hotPathBench) cost(name string, call func(q *db.Queries)) hotPathCost {
	h.tb.Helper()
	rec := &recorder{}
	call(h.ob.queries(rec))
	if rec.sql == "" {
		h.tb.Fatalf("%s: no SQL recorded", name)
	}
	return h.costOf(name, rec.sql, rec.args...)
}

// costOf runs sql with args under EXPLAIN (ANALYZE, BUFFERS) in a
// transaction it rolls back, and returns what it touched.
func (h *hotPathBench) costOf(name, sql string, args ...any) hotPathCost {
	h.tb.Helper()
	tx, err := h.conn.Begin(h.ctx)
	h.must(err, "begin")
	defer func() { _ = tx.Rollback(context.Background()) }()
	before := h.blocks(tx)
	var plan []struct{ Plan planNode }
	if err := tx.QueryRow(h.ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&plan); err != nil {
		h.tb.Fatalf("EXPLAIN %s: %v", name, err)
	}
	c := blocksBetween(name, before, h.blocks(tx))
	c.plan, c.scans, c.probes = plan[0].Plan.Hit+plan[0].Plan.Read, plan[0].Plan.scanBuffers(), plan[0].Plan.functionRows()
	return c
}

// functionRows sums the rows the function scans under n returned.
func (n *planNode) functionRows() float64 {
	rows := 0.0
	if n.NodeType == "Function Scan" {
		rows += n.ActualRows
	}
	for i := range n.Plans {
		rows += n.Plans[i].functionRows()
	}
	return rows
}

// blocksBetween is what a statement called name touched: the blocks per
// relation asked for between the counts before and after it.
func blocksBetween(name string, before, after map[string]int) hotPathCost {
	c := hotPathCost{name: name, rels: map[string]int{}}
	for rel, n := range after {
		if d := n - before[rel]; d > 0 {
			c.rels[rel] = d
			c.all += d
		}
	}
	return c
}

// blocks returns, per relation of the outbox's schema, the blocks this
// transaction has asked for so far.
func (h *hotPathBench) blocks(tx pgx.Tx) map[string]int {
	h.tb.Helper()
	rows, err := tx.Query(h.ctx, `SELECT c.relname::text, pg_stat_get_xact_blocks_fetched(c.oid)::int
		FROM pg_class AS c WHERE c.relnamespace = (SELECT n.oid FROM pg_namespace AS n WHERE n.nspname = $1)`, h.d.Schema)
	h.must(err, "blocks")
	m := map[string]int{}
	for rows.Next() {
		var rel string
		var n int
		h.must(rows.Scan(&rel, &n), "blocks")
		m[rel] = n
	}
	h.must(rows.Err(), "blocks")
	return m
}

// presenceRecord is the presence record of the subscriber the benchmark
// plays, with an id drawn once.
func (h *hotPathBench) presenceRecord() db.PresentParams {
	if !h.presence.Valid {
		h.presence = newSleepID()
	}
	return db.PresentParams{ID: h.presence, Name: "bench", Host: "h", Pid: 1, Queues: []string{hotPathQueue}, Workers: 4,
		ClaimPath: "lock", State: "claiming", StateSince: time.Now(), EverySeconds: 5}
}
