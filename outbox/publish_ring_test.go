package outbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/internal/pgtest"
)

// A Publisher with Tier TierRing writes into the outbox's ring, through
// the public API, as the publisher role with only its grants.

// numbered returns the payloads "0" to n-1.
func numbered(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprint(i)
	}
	return out
}

// ringPublisher returns a publisher of strings to queue that writes into
// the ring.
func ringPublisher(t *testing.T, e *env, queue string) *Publisher[string] {
	t.Helper()
	return newPublisher(t, e, queue, &PublisherConfig[string]{Tier: TierRing})
}

// Publish and PublishBatch into the ring write rows there, none into the
// outbox table, and only when the caller's transaction commits; every
// subscriber claim path delivers each row once, with the id Publish
// returned and the headers a table row would have.
func TestPublishIntoTheRingDeliversEachCommittedRowOnce(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		e := setupAs(t, TableDefault, true) // as the publisher and subscriber roles
		pub := ringPublisher(t, e, "q")
		want := map[int64]string{}
		if err := pgx.BeginFunc(e.ctx, e.pubPool, func(tx pgx.Tx) error {
			for i := range 5 {
				payload := fmt.Sprint("one-", i)
				id, err := pub.Publish(e.ctx, tx, payload, &PublishOpts{Headers: map[string]string{"tenant": "t1"}})
				if err != nil {
					return err
				}
				want[id] = payload
			}
			return nil
		}); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		var batch []string
		for i := range 20 {
			batch = append(batch, fmt.Sprint("batch-", i))
		}
		ids, err := pub.PublishBatch(e.ctx, e.pubPool, batch, &PublishOpts{Headers: map[string]string{"tenant": "t1"}})
		if err != nil {
			t.Fatalf("PublishBatch: %v", err)
		}
		for i, id := range ids {
			want[id] = batch[i]
		}
		// A transaction that rolls back leaves nothing.
		tx, err := e.pubPool.Begin(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pub.Publish(e.ctx, tx, "rolled back", nil); err != nil {
			t.Fatalf("Publish: %v", err)
		}
		if err := tx.Rollback(e.ctx); err != nil {
			t.Fatal(err)
		}
		if got := []int{e.count("outbox_ring"), e.count("outbox")}; !cmp.Equal(got, []int{len(want), 0}) {
			t.Fatalf("rows in the ring and the outbox table: %v, want [%d 0]", got, len(want))
		}

		var mu sync.Mutex
		got := map[int64]string{}
		deliveries := 0
		var bad []string
		startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
			mu.Lock()
			defer mu.Unlock()
			deliveries++
			got[m.ID] = m.Payload
			if m.Headers["tenant"] != "t1" || m.Headers[HeaderContentType] == "" || m.CorrelationID() == "" || m.Deliveries != 1 {
				bad = append(bad, fmt.Sprintf("%d: headers %v, delivery %d", m.ID, m.Headers, m.Deliveries))
			}
			return nil
		}, onPath(p, fastConfig[string](nil)))
		eventually(t, "every row handled", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(got) == len(want)
		})
		eventually(t, "the ring's rows consumed", func() bool { return e.undelivered("q") == 0 })
		mu.Lock()
		defer mu.Unlock()
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("rows handled (-published +handled):\n%s", diff)
		}
		if deliveries != len(want) || len(bad) > 0 {
			t.Errorf("%d deliveries of %d rows; rows without their headers or delivered again: %v", deliveries, len(want), bad)
		}
		if n := e.count("outbox"); n != 0 {
			t.Errorf("%d rows in the outbox table after the drain", n)
		}
	})
}

// undelivered counts queue's rows that QueueDepths says wait or run: in
// the outbox table, and in the ring past where its lanes' newest
// progress has read.
func (e *env) undelivered(queue string) int64 {
	e.t.Helper()
	depths, err := e.ob.QueueDepths(e.ctx, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	var n int64
	for _, d := range depths {
		if d.Queue == queue {
			n += d.Ready + d.Scheduled + d.Leased + d.Expired
		}
	}
	return n
}

// A key's rows published into the ring, one transaction after another
// and in batches, are handled one at a time in the order their
// transactions committed, behind a row of the key that a publisher into
// the outbox table wrote before them (a queue moved to the ring).
func TestPublishIntoTheRingKeepsPerKeyOrder(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		e := setup(t)
		ring, table := ringPublisher(t, e, "q"), newPublisher[string](t, e, "q", nil)
		const keys, rounds = 3, 4
		want := map[string][]string{}
		publish := func(pub *Publisher[string], key string, payloads ...string) {
			t.Helper()
			var err error
			if len(payloads) == 1 {
				_, err = pub.Publish(e.ctx, e.pubPool, payloads[0], &PublishOpts{OrderingKey: key})
			} else {
				_, err = pub.PublishBatch(e.ctx, e.pubPool, payloads, &PublishOpts{OrderingKey: key})
			}
			if err != nil {
				t.Fatal(err)
			}
			want[key] = append(want[key], payloads...)
		}
		publish(table, "k0", "k0/table")
		for r := range rounds {
			for k := range keys {
				key := fmt.Sprint("k", k)
				if r == 2 {
					publish(ring, key, key+"/2a", key+"/2b", key+"/2c")
				} else {
					publish(ring, key, fmt.Sprint(key, "/", r))
				}
			}
		}
		var k keyedDeliveries
		startSub(t, e.ob, []string{"q"}, k.handler(time.Millisecond), onPath(p, fastConfig[string](nil)))
		eventually(t, "every row handled", func() bool {
			for key, rows := range want {
				if len(k.of(key)) < len(rows) {
					return false
				}
			}
			return true
		})
		k.mu.Lock()
		defer k.mu.Unlock()
		if k.overlaps != 0 {
			t.Errorf("a key's rows ran in two handlers at once %d times", k.overlaps)
		}
		if diff := cmp.Diff(want, k.seen); diff != "" {
			t.Errorf("deliveries per key (-want +got):\n%s", diff)
		}
	})
}

// A row published into the ring for later is not handled before it is
// due: it waits in the outbox table, where it moves, and the rows beside
// it are handled.
func TestPublishIntoTheRingForLaterWaitsInTheTable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := ringPublisher(t, e, "q")
	later, err := pub.Publish(e.ctx, e.pubPool, "later", &PublishOpts{Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	now, err := pub.Publish(e.ctx, e.pubPool, "now", nil)
	if err != nil {
		t.Fatal(err)
	}
	handled := make(chan int64, 2)
	startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
		handled <- m.ID
		return nil
	}, fastConfig[string](nil))
	if got := waitFor(t, handled, "the row due now"); got != now {
		t.Errorf("handled row %d first, want %d (the row due now)", got, now)
	}
	eventually(t, "the later row moved into the outbox table", func() bool { return e.count("outbox") == 1 })
	row, ok := e.row(later)
	if !ok {
		t.Fatalf("row %d is not in the outbox table", later)
	}
	if wait := time.Until(row.NextAttemptAt); wait < 50*time.Minute {
		t.Errorf("the later row is due in %v, want about an hour", wait)
	}
	select {
	case id := <-handled:
		t.Errorf("row %d handled before it is due", id)
	default:
	}
}

// A publisher into the ring refuses a timer id, which only the outbox
// table keeps, before it sends anything: the caller's transaction stays
// usable and nothing is written.
func TestPublishIntoTheRingRefusesTimers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := ringPublisher(t, e, "q")
	err := pgx.BeginFunc(e.ctx, e.pubPool, func(tx pgx.Tx) error {
		_, err := pub.Publish(e.ctx, tx, "x", &PublishOpts{TimerID: "t1", Delay: time.Minute})
		var ie *InputError
		if !errors.As(err, &ie) || ie.Field != "PublishOpts.TimerID" {
			t.Errorf("Publish with a timer id: %v; want an *InputError for PublishOpts.TimerID", err)
		}
		_, err = pub.Publish(e.ctx, tx, "after", nil)
		return err
	})
	if err != nil {
		t.Fatalf("the transaction after the refusal: %v", err)
	}
	if got := []int{e.count("outbox_ring"), e.count("outbox")}; !cmp.Equal(got, []int{1, 0}) {
		t.Errorf("rows in the ring and the outbox table: %v, want [1 0]", got)
	}
}

// Publishing into an outbox whose schema lacks what the publisher
// writes gives the *SchemaError that names the fix: no outbox at all,
// or a ring publisher's outbox at a schema older than the ring's.
func TestPublishIntoAMissingTableNamesTheFix(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	e := newEnv(t, d, newOutbox(t, d))
	table := newPublisher[string](t, e, "q", nil)
	ring := ringPublisher(t, e, "q")
	check := func(what string, want int64, err error) {
		t.Helper()
		var se *SchemaError
		if !errors.As(err, &se) || se.Version != want || se.Want != e.ob.LatestSchemaVersion() {
			t.Errorf("%s: %v; want a *SchemaError at version %d", what, err, want)
		}
	}
	_, err := table.Publish(e.ctx, e.pubPool, "x", nil)
	check("Publish with no outbox", 0, err)
	_, err = ring.PublishBatch(e.ctx, e.pubPool, []string{"x"}, nil)
	check("PublishBatch into the ring with no outbox", 0, err)
	migrateTo(t, e.ob, 12)
	_, err = ring.Publish(e.ctx, e.pubPool, "x", nil)
	check("Publish into the ring at schema 12", 12, err)
	if _, err := table.Publish(e.ctx, e.pubPool, "x", nil); err != nil {
		t.Errorf("Publish into the table at schema 12: %v", err)
	}
}

// A transactional subscriber handles the ring's rows as the table's:
// each handler's writes commit once, with its row's acknowledgement, a
// failed delivery's writes roll back, and the ring is drained. (Which
// delivery commits is the database's: under SERIALIZABLE, a handler's
// transaction may fail to serialize and its row be delivered again.)
func TestTxHandlerCommitsEachRingRowsEffectsOnce(t *testing.T) {
	t.Parallel()
	e := setupTx(t)
	pub := ringPublisher(t, e.env, "orders")
	var orders, follows []string
	for i := range 20 {
		orders = append(orders, fmt.Sprint("o-", i))
		follows = append(follows, fmt.Sprint("invoiced o-", i))
	}
	if _, err := pub.PublishBatch(e.ctx, e.pubPool, orders, nil); err != nil {
		t.Fatal(err)
	}
	var failed sync.Once
	startTxSub(t, e.ob, []string{"orders"}, func(ctx context.Context, tx pgx.Tx, m *Message[string]) error {
		if err := e.invoice(ctx, tx, m); err != nil {
			return err
		}
		fail := false
		if m.Payload == "o-7" {
			failed.Do(func() { fail = true })
		}
		if fail {
			return errors.New("rolls its invoice back")
		}
		return nil
	}, fastConfig[string](nil))
	eventually(t, "every order invoiced", func() bool { return len(e.invoices()) == len(orders) })
	eventually(t, "the ring's rows consumed", func() bool { return e.undelivered("orders") == 0 })
	invoices := e.invoices()
	if diff := cmp.Diff(orders, slices.Sorted(maps.Keys(invoices)), cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("orders invoiced (-want +got):\n%s", diff)
	}
	if invoices["o-7"] < 2 {
		t.Errorf("o-7 was invoiced by delivery %d, whose writes rolled back; want a later one", invoices["o-7"])
	}
	if diff := cmp.Diff(follows, e.queued("invoiced"), cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("follow-ups (-want +got):\n%s", diff)
	}
}

// Unprocessed lists the ring's rows that no claim has consumed beside
// the outbox table's, oldest first, and UnprocessedTx the ring's rows
// the caller's transaction wrote before it commits.
func TestUnprocessedListsTheRingsRowsBesideTheTables(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ring, table := ringPublisher(t, e, "q"), newPublisher[string](t, e, "q", nil)
	var want []string
	for i := range 3 {
		for _, pub := range []*Publisher[string]{table, ring} {
			payload := fmt.Sprint(pub.tier, "-", i)
			opts := &PublishOpts{Headers: map[string]string{"n": fmt.Sprint(i)}}
			if i == 2 {
				opts.OrderingKey = "k" // a keyed lane of the ring too
			}
			if _, err := pub.Publish(e.ctx, e.pubPool, payload, opts); err != nil {
				t.Fatal(err)
			}
			want = append(want, payload)
		}
	}
	payloads := func(ms []PendingMessage) []string {
		var out []string
		for _, m := range ms {
			out = append(out, string(m.Payload))
			if m.Headers["n"] == "" || m.Queue != "q" {
				t.Errorf("row %d: queue %q, headers %v", m.ID, m.Queue, m.Headers)
			}
		}
		return out
	}
	got, err := e.ob.Unprocessed(e.ctx, "q", 100)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, payloads(got)); diff != "" {
		t.Errorf("Unprocessed (-want +got):\n%s", diff)
	}
	if got, err = e.ob.Unprocessed(e.ctx, "q", 4); err != nil || !cmp.Equal(want[:4], payloads(got)) {
		t.Errorf("Unprocessed, 4 rows: %q, %v; want %q", payloads(got), err, want[:4])
	}

	// Rows a transaction wrote into the ring, seen within it (a test's
	// own connection: the publisher role reads no payloads).
	tx, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	if _, err := ring.PublishBatch(e.ctx, tx, []string{"tx-1", "tx-2"}, &PublishOpts{Headers: map[string]string{"n": "tx"}}); err != nil {
		t.Fatal(err)
	}
	inTx, err := e.ob.UnprocessedTx(e.ctx, tx, "q", 100)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(append(slices.Clone(want), "tx-1", "tx-2"), payloads(inTx)); diff != "" {
		t.Errorf("UnprocessedTx (-want +got):\n%s", diff)
	}
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}

	// Once a subscriber has handled them, none is left in either tier.
	var handled atomic.Int64
	startSub(t, e.ob, []string{"q"}, func(context.Context, *Message[string]) error {
		handled.Add(1)
		return nil
	}, fastConfig[string](nil))
	eventually(t, "every row handled", func() bool { return handled.Load() >= int64(len(want)) })
	eventually(t, "no row left", func() bool {
		got, err := e.ob.Unprocessed(e.ctx, "q", 100)
		return err == nil && len(got) == 0
	})
}

// The operators' reads count a row once while claims move it from the
// ring into the outbox table: every row of the test fails and waits an
// hour for its retry in the table, so the queue holds all of them
// throughout, and every QueueDepths and Unprocessed read, taken while the
// moves go on, says so (QueueStats reads the ring first and may count a
// row in motion twice, never miss it).
func TestOperatorsReadsCountARowOnceWhileItMovesFromTheRing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 300
	if _, err := ringPublisher(t, e, "q").PublishBatch(e.ctx, e.pubPool, numbered(n), nil); err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig[string](nil)
	cfg.FetchBatchSize = 10 // many claims, each moving its rows
	startSub(t, e.ob, []string{"q"}, func(context.Context, *Message[string]) error {
		return RetryAfter(errors.New("later"), time.Hour)
	}, cfg)
	var reads int
	for done := false; !done; reads++ {
		depths, err := e.ob.QueueDepths(e.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var total, scheduled int64
		for _, d := range depths {
			if d.Queue == "q" {
				total, scheduled = d.Ready+d.Scheduled+d.Leased+d.Expired, d.Scheduled
			}
		}
		if total != n {
			t.Fatalf("read %d: QueueDepths counts %d rows of %d", reads, total, n)
		}
		rows, err := e.ob.Unprocessed(e.ctx, "q", 2*n)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != n {
			t.Fatalf("read %d: Unprocessed lists %d rows of %d", reads, len(rows), n)
		}
		stats, err := e.ob.QueueStats(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range stats {
			if s.Queue == "q" && s.Ready+s.Scheduled+s.Leased+s.Expired < n {
				t.Fatalf("read %d: QueueStats counts %d rows of %d", reads, s.Ready+s.Scheduled+s.Leased+s.Expired, n)
			}
		}
		// Every row waits for its retry in the table: the moves are over.
		done = scheduled == n && e.count("outbox") == n
	}
	t.Logf("%d reads while the rows moved", reads)
}

// A claim of the ring hands a transaction's rows of a lane whole, more
// than the subscriber's buffer holds (FetchBatchSize), and waits for its
// workers to take them: a subscriber stopped then returns from Run all
// the same, and the rows it never started are delivered by the next.
func TestRunReturnsWhenAClaimOfTheRingHandedMoreRowsThanItsBuffer(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// 75 in each unkeyed lane, one transaction.
	ids, err := ringPublisher(t, e, "q").PublishBatch(e.ctx, e.pubPool, numbered(300), nil)
	if err != nil {
		t.Fatal(err)
	}
	var seen handledIDs
	running, release := make(chan struct{}, 2), make(chan struct{})
	cfg := fastConfig[string](nil)
	cfg.Workers, cfg.FetchBatchSize = 2, 10
	first := startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
		seen.add(m.ID)
		select {
		case running <- struct{}{}:
		default:
		}
		<-release
		return nil
	}, cfg)
	// Both workers hold a row: the claim's hand-out is past the buffer.
	waitFor(t, running, "the first handler")
	waitFor(t, running, "the second handler")
	first.cancel()
	close(release)
	if err := waitForWithin(t, first.done, "Run's return", time.Minute); err != nil {
		t.Errorf("Run: %v", err)
	}
	first.stopped = true
	startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
		seen.add(m.ID)
		return nil
	}, fastConfig[string](nil))
	eventually(t, "every row handled", func() bool { return len(seen.sorted()) >= len(ids) })
	if diff := cmp.Diff(ids, seen.sorted()); diff != "" {
		t.Errorf("rows handled (-published +handled):\n%s", diff)
	}
}
