package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Settings and data of real deployments that once wedged a claim, each
// checked on every claim path (see forEachClaimPath).

// errorLog keeps the messages of the records a subscriber logs at error
// level.
type errorLog struct {
	mu   sync.Mutex
	msgs []string
}

func (l *errorLog) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelError }
func (l *errorLog) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	l.mu.Lock()
	l.msgs = append(l.msgs, b.String())
	l.mu.Unlock()
	return nil
}
func (l *errorLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *errorLog) WithGroup(string) slog.Handler      { return l }

func (l *errorLog) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.msgs...)
}

// drainAll runs two subscribers of queue on ob, set for claim path p,
// until the outbox is empty, and returns the errors they logged; every
// row must be handled.
func drainAll(t *testing.T, e *env, ob *Outbox, p claimPath, queue string, n int) []string {
	t.Helper()
	var (
		mu      sync.Mutex
		handled = map[int64]bool{}
		log     errorLog
	)
	var subs []*started
	for range 2 {
		cfg := onPath(p, fastConfig[string](nil))
		cfg.FetchBatchSize = 100
		cfg.Logger = slog.New(&log)
		subs = append(subs, startSub(t, ob, []string{queue}, func(_ context.Context, m *Message[string]) error {
			mu.Lock()
			handled[m.ID] = true
			mu.Unlock()
			return nil
		}, cfg))
	}
	eventually(t, "an empty outbox", func() bool { return e.count("outbox") == 0 })
	for _, s := range subs {
		if err := s.stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(handled) != n {
		t.Errorf("%d rows handled, want %d", len(handled), n)
	}
	if d := e.count("outbox_dlq"); d != 0 {
		t.Errorf("%d dead letters, want none", d)
	}
	return log.lines()
}

// publishMany inserts n due rows of queue, every third with one of 10
// ordering keys, and returns their ids.
func (e *env) publishMany(queue string, n int) {
	e.t.Helper()
	e.exec(`INSERT INTO outbox (queue, payload, ordering_key)
		SELECT $1, '{}', CASE WHEN i % 3 = 0 THEN 'k' || (i % 10) END FROM generate_series(1, $2::integer) AS i`, queue, n)
}

// A pool whose default isolation is REPEATABLE READ or SERIALIZABLE still
// drains every row on every claim path, and leaves no claim open: claims
// by lock run at READ COMMITTED, and a serialization failure of a
// statement in autocommit is retried at once.
func TestClaimsDrainWhenThePoolDefaultsToSerializable(t *testing.T) {
	t.Parallel()
	for _, iso := range []string{"serializable", "repeatable read"} {
		t.Run(strings.ReplaceAll(iso, " ", "-"), func(t *testing.T) {
			t.Parallel()
			forEachClaimPath(t, func(t *testing.T, p claimPath) {
				e := setup(t)
				ob := e.outboxOn(func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["default_transaction_isolation"] = iso })
				e.publishMany("q", 2000)
				drainAll(t, e, ob, p, "q", 2000)
				if n := e.count("outbox_locks"); n != 0 {
					t.Errorf("%d lock records left", n)
				}
			})
		})
	}
}

// A statement refused for one row, whatever its SQLSTATE (here a user
// trigger raising P0001 on the delete of one row of 200), harms only that
// row: the other 199 are acknowledged and gone, no claim stays open, and
// the refused row stays in the outbox for another delivery.
func TestRowWhoseDeleteATriggerRefusesIsIsolated(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		e := setup(t)
		e.publishMany("q", 200)
		var bad int64
		if err := e.db.Pool.QueryRow(e.ctx, `SELECT id FROM outbox ORDER BY id OFFSET 100 LIMIT 1`).Scan(&bad); err != nil {
			t.Fatal(err)
		}
		e.exec(fmt.Sprintf(`CREATE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN
				IF OLD.id = %d THEN RAISE EXCEPTION 'this row stays'; END IF;
				RETURN OLD;
			END $$`, bad))
		e.exec(`CREATE TRIGGER refuse_delete BEFORE DELETE ON outbox FOR EACH ROW EXECUTE FUNCTION refuse_delete()`)
		var subs []*started
		for range 2 {
			cfg := onPath(p, fastConfig[string](nil))
			cfg.MaxDeliveries = -1
			subs = append(subs, startSub(t, e.ob, []string{"q"}, func(context.Context, *Message[string]) error { return nil }, cfg))
		}
		eventually(t, "every row but the refused one acknowledged", func() bool { return e.count("outbox") == 1 })
		eventually(t, "no claim by lock open", func() bool { return e.count("outbox_locks") == 0 })
		for _, s := range subs {
			if err := s.stop(); err != nil && !errors.Is(err, ErrGracefulTimeout) {
				t.Errorf("Run: %v", err)
			}
		}
		if _, ok := e.row(bad); !ok {
			t.Errorf("the refused row %d is gone", bad)
		}
	})
}

// Lock records naming transactions of another cluster (a restored dump,
// a logical-replication cut-over: ids this server has not reached) are
// treated as ended: claims and sweeps never ask for their status, which
// would fail, the backlog drains, and the records are swept.
func TestLockRecordsOfAnotherClusterAreTreatedAsEnded(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		e := setup(t)
		e.publishMany("q", 1000)
		var first int64
		if err := e.db.Pool.QueryRow(e.ctx, `SELECT min(id) FROM outbox`).Scan(&first); err != nil {
			t.Fatal(err)
		}
		e.exec(`INSERT INTO outbox_locks (xid, ids, until)
			SELECT pg_current_xact_id()::text::bigint + 1000000000 + n, int8multirange(int8range($1 + n, $1 + n + 1)),
			       now() - interval '1 minute'
			FROM generate_series(0, 9) AS n`, first)
		e.exec(`INSERT INTO outbox_locks (xid, ids, until)
			VALUES (pg_current_xact_id()::text::bigint + 2000000000, '{[1,2]}', now() - interval '1 minute')`)
		if logged := drainAll(t, e, e.ob, p, "q", 1000); len(logged) > 0 {
			t.Errorf("errors logged:\n%s", strings.Join(logged, "\n"))
		}
		cfg := onPath(p, fastConfig[string](nil))
		s := startSub(t, e.ob, []string{"q"}, func(context.Context, *Message[string]) error { return nil }, cfg)
		eventually(t, "the foreign records swept", func() bool { return e.count("outbox_locks") == 0 })
		if err := s.stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// A row whose id is the largest bigint is claimed, handled and
// acknowledged on every claim path, beside rows of ordinary ids.
func TestRowIDAtTheTopOfBigintIsDelivered(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		e := setup(t)
		e.publishMany("q", 99)
		e.exec(`INSERT INTO outbox (id, queue, payload) OVERRIDING SYSTEM VALUE VALUES (9223372036854775807, 'q', '{}')`)
		e.exec(`INSERT INTO outbox (id, queue, payload) OVERRIDING SYSTEM VALUE VALUES (9223372036854775806, 'q', '{}')`)
		if logged := drainAll(t, e, e.ob, p, "q", 101); len(logged) > 0 {
			t.Errorf("errors logged:\n%s", strings.Join(logged, "\n"))
		}
		if n := e.count("outbox_locks"); n != 0 {
			t.Errorf("%d lock records left", n)
		}
	})
}

// A backlog that the record of an ended claim by lock still names (its
// process crashed, or its server failed over, mid-drain: thousands of
// rows) is taken in claims as large as any other, on every claim path and
// by subscribers of one queue and of two: counting that claim's delivery
// on each row costs a claim time linear in its rows. Every row's
// Message.Deliveries counts the ended claim's delivery.
func TestBacklogNamedByAnEndedClaimDrainsAtFullSpeed(t *testing.T) {
	t.Parallel()
	const rows = 6000
	for _, queues := range [][]string{{"q"}, {"q", "r"}} {
		t.Run(fmt.Sprintf("queues=%d", len(queues)), func(t *testing.T) {
			t.Parallel()
			forEachClaimPath(t, func(t *testing.T, p claimPath) {
				e := setup(t)
				e.exec(`INSERT INTO outbox (queue, payload) SELECT ($1::text[])[1 + i % cardinality($1::text[])], '{}'
					FROM generate_series(1, $2::integer) AS i`, queues, rows)
				// The ended claim: a transaction that rolled back, whose
				// record names every row and whose hold has ended.
				e.endedClaimOfEveryRow()
				var (
					mu         sync.Mutex
					deliveries = map[int64]int{}
				)
				cfg := onPath(p, fastConfig[string](nil))
				cfg.Workers, cfg.FetchBatchSize = 16, rows
				began := time.Now()
				s := startSub(t, e.ob, queues, func(_ context.Context, m *Message[string]) error {
					mu.Lock()
					deliveries[m.ID] = m.Deliveries
					mu.Unlock()
					return nil
				}, cfg)
				eventually(t, "an empty outbox", func() bool { return e.count("outbox") == 0 })
				took := time.Since(began)
				if err := s.stop(); err != nil {
					t.Errorf("Run: %v", err)
				}
				// A claim quadratic in its rows took 20 s and more here.
				if bound := 10 * time.Second; took > bound {
					t.Errorf("%d rows drained in %v, want within %v", rows, took, bound)
				}
				mu.Lock()
				defer mu.Unlock()
				wrong := 0
				for _, n := range deliveries {
					if n != 2 {
						wrong++
					}
				}
				if len(deliveries) != rows || wrong > 0 {
					t.Errorf("%d rows handled, %d of them not on their second delivery; want %d, all on their second", len(deliveries), wrong, rows)
				}
			})
		})
	}
}

// A claim by lock that takes rows an ended claim's record names, and
// gives some of them back unstarted when its LockWindow ends, leaves their
// count in that record: the claim that next takes them counts the ended
// delivery still, and MaxDeliveries with it.
func TestRowsGivenBackKeepTheDeliveryOfAnEndedClaim(t *testing.T) {
	t.Parallel()
	const rows = 60
	e := setup(t)
	e.exec(`INSERT INTO outbox (queue, payload) SELECT 'q', '{}' FROM generate_series(1, $1::integer)`, rows)
	e.endedClaimOfEveryRow()
	var (
		mu         sync.Mutex
		deliveries = map[int64]int{}
	)
	// One worker, 50 ms a row: a LockWindow of 500 ms starts about ten
	// rows of each claim and gives the rest back.
	cfg := onPath(pathLock, fastConfig[string](nil))
	cfg.Workers, cfg.LockWindow = 1, 500*time.Millisecond
	s := startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
		mu.Lock()
		deliveries[m.ID] = m.Deliveries
		mu.Unlock()
		time.Sleep(50 * time.Millisecond)
		return nil
	}, cfg)
	eventually(t, "an empty outbox", func() bool { return e.count("outbox") == 0 })
	if err := s.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	got := map[int]int{} // deliveries: rows
	for _, n := range deliveries {
		got[n]++
	}
	if diff := cmp.Diff(map[int]int{2: rows}, got); diff != "" {
		t.Errorf("rows by Message.Deliveries (-want +got):\n%s", diff)
	}
}

// endedClaimOfEveryRow records a claim by lock of every row of the outbox
// whose transaction locked them and rolled back and whose hold has ended,
// as a claim's record is left by a crash or a failover.
func (e *env) endedClaimOfEveryRow() {
	e.t.Helper()
	var xid int64
	tx, err := e.db.Pool.Begin(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := tx.QueryRow(e.ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&xid); err != nil {
		e.t.Fatal(err)
	}
	if _, err := tx.Exec(e.ctx, `SELECT id FROM outbox FOR UPDATE`); err != nil {
		e.t.Fatal(err)
	}
	if err := tx.Rollback(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	e.exec(`INSERT INTO outbox_locks (xid, ids, claimed_at, until)
		SELECT $1, range_agg(int8range(id, id + 1)), now() - interval '1 minute', now() - interval '30 seconds'
		FROM outbox`, xid)
}
