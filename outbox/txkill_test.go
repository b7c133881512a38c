package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/childtest"
)

// The child process's settings, from the environment.
const (
	txChildDSN    = "OUTBOX_TX_CHILD_DSN"
	txChildSchema = "OUTBOX_TX_CHILD_SCHEMA"
)

// runTxChild runs a transactional subscriber of the queue "effects" whose
// handler records one effect per message in its transaction, until the
// process is killed.
func runTxChild() error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(txChildDSN))
	if err != nil {
		return err
	}
	ob, err := New(pool, &Config{Schema: os.Getenv(txChildSchema)})
	if err != nil {
		return err
	}
	sub, err := NewTxSubscriber(ob, []string{"effects"}, func(ctx context.Context, tx pgx.Tx, m *Message[string]) error {
		if _, err := tx.Exec(ctx, `INSERT INTO effects (msg, pid) VALUES ($1, pg_backend_pid())`, m.Payload); err != nil {
			return err
		}
		time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
		return nil
	}, &SubscriberConfig[string]{
		Workers: 4, LeaseTTL: time.Second, MinFetchInterval: 5 * time.Millisecond, MaxFetchInterval: 50 * time.Millisecond,
		QueryTimeout: 2 * time.Second, Retry: ConstantRetry{Delay: 20 * time.Millisecond}, MaxDeliveries: -1,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	return sub.Run(ctx)
}

// Transactional handlers whose processes are killed (SIGKILL) and whose
// connections are terminated mid-run still apply each message's effect
// exactly once: 3,000 messages, a quarter keyed, end as 3,000 effects, one
// each, and an empty outbox.
func TestTxEffectsHappenOnceThroughKills(t *testing.T) {
	if testing.Short() {
		t.Skip("runs subscriber processes")
	}
	t.Parallel()
	e := setup(t)
	e.exec(`CREATE TABLE effects (msg text NOT NULL, pid int NOT NULL)`)
	const total = 3000
	pub := newPublisher[string](t, e, "effects", nil)
	// Published a hundred to a transaction: each commit that publishes
	// notifies, and the server serializes those of the whole database, so
	// 3,000 of them took most of the test's time. The children start
	// after, so how the messages were committed does not matter to them.
	for first := 0; first < total; first += 100 {
		if err := pgx.BeginFunc(e.ctx, e.pubPool, func(tx pgx.Tx) error {
			for i := first; i < first+100; i++ {
				var opts *PublishOpts
				if i%4 == 0 {
					opts = &PublishOpts{OrderingKey: fmt.Sprintf("k%d", i%40)}
				}
				if _, err := pub.Publish(e.ctx, tx, fmt.Sprintf("m-%d", i), opts); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	// The children connect as application_name <schema>_child, so their
	// backends can be terminated without the test's own.
	u, err := url.Parse(e.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	app := e.db.Schema + "_child"
	q.Set("application_name", app)
	q.Set("pool_max_conns", "8") // the child's 4 workers' transactions and 3 more
	u.RawQuery = q.Encode()

	startChild := func() *childtest.Child {
		return childtest.Start(t, txChildDSN+"="+u.String(), txChildSchema+"="+e.db.Schema)
	}
	var child *childtest.Child
	// waitEffects waits for n effects as long as they keep coming: on a
	// loaded machine the children are slow, but never stuck for 20 s.
	waitEffects := func(n int) {
		t.Helper()
		got, progressed := e.count("effects"), time.Now()
		for got < n {
			if time.Since(progressed) > 20*time.Second {
				t.Fatalf("%d effects, no new one in 20 s, waiting for %d; the child's log:\n%s", got, n, child.Stderr())
			}
			time.Sleep(10 * time.Millisecond)
			if now := e.count("effects"); now > got {
				got, progressed = now, time.Now()
			}
		}
	}

	child = startChild()
	waitEffects(500)
	child.Kill(t)
	child = startChild()
	waitEffects(1200)
	e.exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app)
	waitEffects(1800)
	child.Kill(t)
	child = startChild()
	waitEffects(2400)
	e.exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app)
	waitEffects(total)
	eventually(t, "an empty outbox", func() bool { return e.count("outbox") == 0 })
	child.Kill(t)

	rows, err := e.db.Pool.Query(e.ctx, `SELECT msg, count(*) FROM effects GROUP BY msg HAVING count(*) <> 1 ORDER BY msg LIMIT 10`)
	if err != nil {
		t.Fatal(err)
	}
	var twice []string
	var msg string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&msg, &n}, func() error { twice = append(twice, fmt.Sprintf("%s x%d", msg, n)); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(twice) > 0 {
		t.Errorf("messages whose effect committed more than once: %v", twice)
	}
	var distinct int
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT count(DISTINCT msg) FROM effects`).Scan(&distinct); err != nil {
		t.Fatal(err)
	}
	if distinct != total {
		t.Errorf("%d messages have an effect, want %d", distinct, total)
	}
}
