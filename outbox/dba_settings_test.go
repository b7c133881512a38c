package outbox

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/internal/dbx"
)

// dbaSettings are the server settings DBAs give roles and databases,
// with timeouts scaled down to the test's time: each is shorter than the
// slow handlers below, and than the subscriber's lock window.
var dbaSettings = []struct{ name, value string }{
	{"default_transaction_isolation", "repeatable read"},
	{"default_transaction_isolation", "serializable"},
	{"statement_timeout", "1s"},
	{"idle_in_transaction_session_timeout", "700ms"},
	{"idle_session_timeout", "700ms"},
	{"lock_timeout", "300ms"},
	{"synchronous_commit", "off"},
}

// delivered is one handler call of the settings test.
type deliveredCall struct {
	msg        string
	began, end time.Time
}

// Under each setting DBAs set, given to the publishing and subscribing
// roles: keyed and unkeyed messages published by concurrent transactions
// reach a plain and a transactional subscriber with the default
// configuration, each key's in order, no message handled by two handlers
// at once, each transactional effect once, while some handlers take
// longer than the timeouts.
func TestSubscribersKeepTheirPromisesUnderTheSettingsDBAsSet(t *testing.T) {
	t.Parallel()
	for _, s := range dbaSettings {
		t.Run(s.name+"="+s.value, func(t *testing.T) {
			t.Parallel()
			e := setupRoles(t)
			e.exec(`CREATE TABLE effects (msg text PRIMARY KEY)`)
			e.exec(`GRANT SELECT, INSERT ON effects TO ` + pgx.Identifier{e.roles[2]}.Sanitize())
			for _, r := range e.roles[1:] {
				e.exec(fmt.Sprintf("ALTER ROLE %s SET %s = '%s'", pgx.Identifier{r}.Sanitize(), s.name, s.value))
			}
			e.pub.pool.Reset()
			e.sub.pool.Reset()

			const perQueue, keys = 120, 6
			slow := func(i int) bool { return i%40 == 7 }
			var (
				mu    sync.Mutex
				calls []deliveredCall
			)
			record := func(msg string, began time.Time) {
				mu.Lock()
				defer mu.Unlock()
				calls = append(calls, deliveredCall{msg, began, time.Now()})
			}
			pause := func(ctx context.Context, msg string) {
				var i, k int
				if _, err := fmt.Sscanf(msg, "%d/%d", &k, &i); err == nil && slow(i) {
					select {
					case <-ctx.Done():
					case <-time.After(1200 * time.Millisecond):
					}
				}
			}
			startSub(t, e.sub, []string{"plain"}, func(ctx context.Context, m *Message[string]) error {
				began := time.Now()
				pause(ctx, m.Payload)
				record("plain "+m.Payload, began)
				return ctx.Err()
			}, nil)
			startTxSub(t, e.sub, []string{"tx"}, func(ctx context.Context, tx pgx.Tx, m *Message[string]) error {
				began := time.Now()
				pause(ctx, m.Payload)
				if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, m.Payload); err != nil {
					return err
				}
				record("tx "+m.Payload, began)
				return nil
			}, nil)

			var publishers sync.WaitGroup
			for _, queue := range []string{"plain", "tx"} {
				pub, err := NewPublisher[string](e.pub, queue, nil)
				if err != nil {
					t.Fatal(err)
				}
				for k := range keys {
					publishers.Go(func() {
						for i := k; i < perQueue; i += keys {
							msg := fmt.Sprintf("%d/%d", k, i)
							opts := &PublishOpts{}
							if k%2 == 0 {
								opts.OrderingKey = fmt.Sprint(k)
							}
							// An application at SERIALIZABLE retries its
							// transactions that fail to serialize, and one
							// under a lock_timeout those that time out
							// waiting for a lock (a key's lock, held a
							// moment longer on a loaded machine): for as
							// long as a minute, which no lock is held for
							// unless something is stuck.
							var (
								err      error
								attempts int
							)
							for start := time.Now(); time.Since(start) < time.Minute; {
								attempts++
								err = pgx.BeginFunc(e.ctx, e.pub.pool, func(tx pgx.Tx) error {
									_, err := pub.Publish(e.ctx, tx, msg, opts)
									return err
								})
								if dbx.Classify(err) != dbx.Doomed && dbx.SQLState(err) != "55P03" {
									break
								}
							}
							if err != nil {
								t.Errorf("publish %s (%d attempts): %v", msg, attempts, err)
								return
							}
						}
					})
				}
			}
			publishers.Wait()
			drains(t, "every message handled", func() int { return e.count("outbox") })

			mu.Lock()
			defer mu.Unlock()
			handled := map[string]int{}
			for _, c := range calls {
				handled[c.msg]++
			}
			want := map[string]int{}
			for _, q := range []string{"plain", "tx"} {
				for i := range perQueue {
					want[fmt.Sprintf("%s %d/%d", q, i%keys, i)] = 1
				}
			}
			// A message may be handled again (at least once), never by two
			// handlers at once.
			for msg, n := range handled {
				if n > 1 {
					want[msg] = n
				}
			}
			if diff := cmp.Diff(want, handled); diff != "" {
				t.Errorf("messages handled (-want +got):\n%s", diff)
			}
			for i, a := range calls {
				for _, b := range calls[i+1:] {
					if a.msg == b.msg && a.began.Before(b.end) && b.began.Before(a.end) {
						t.Errorf("%s handled twice at once: %v–%v and %v–%v", a.msg, a.began, a.end, b.began, b.end)
					}
				}
			}
			// Each ordering key's messages were handled in publishing order.
			last := map[string]int{}
			for _, c := range calls {
				var q string
				var k, i int
				if _, err := fmt.Sscanf(c.msg, "%s %d/%d", &q, &k, &i); err != nil || k%2 != 0 {
					continue
				}
				key := fmt.Sprintf("%s %d", q, k)
				if prev, ok := last[key]; ok && i < prev {
					t.Errorf("key %s: message %d handled after %d", key, i, prev)
				}
				last[key] = max(last[key], i)
			}
			var effects int
			if err := e.db.Pool.QueryRow(e.ctx, `SELECT count(*) FROM effects`).Scan(&effects); err != nil {
				t.Fatal(err)
			}
			if effects != perQueue {
				t.Errorf("%d transactional effects, want %d", effects, perQueue)
			}
		})
	}
}

// A role's idle_session_timeout does not end the LISTEN connection, which
// idles between notifications: it stays, and a row published after it
// idled past the timeout wakes the subscriber at once.
func TestListenConnectionOutlivesAnIdleSessionTimeout(t *testing.T) {
	t.Parallel()
	e := setupRoles(t)
	e.exec(fmt.Sprintf("ALTER ROLE %s SET idle_session_timeout = '300ms'", pgx.Identifier{e.roles[2]}.Sanitize()))
	e.sub.pool.Reset()
	cfg := fastConfig[string](nil)
	cfg.MinFetchInterval, cfg.MaxFetchInterval = 30*time.Second, 30*time.Second
	handled := make(chan time.Time, 1)
	startSub(t, e.sub, []string{"q"}, func(context.Context, *Message[string]) error {
		handled <- time.Now()
		return nil
	}, cfg)
	var first []int32
	eventually(t, "the LISTEN connection", func() bool { first = e.listeners(e.sub.Channel()); return len(first) == 1 })
	// A session of the subscriber's role, opened once the LISTEN
	// connection idles: when the timeout has ended it, the LISTEN
	// connection has idled as long.
	idle, err := pgx.Connect(e.ctx, e.db.URLAs(t, e.roles[2]))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = idle.Close(context.Background()) }()
	idler := idle.PgConn().PID()
	eventually(t, "an idle session of the role ended by the timeout", func() bool {
		var n int
		if err := e.db.Pool.QueryRow(e.ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", idler).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	if now := e.listeners(e.sub.Channel()); !cmp.Equal(first, now) {
		t.Errorf("LISTEN connections %v, then %v after idling past the timeout", first, now)
	}
	pub, err := NewPublisher[string](e.pub, "q", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(e.ctx, e.pub.pool, "x", nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-handled:
	case <-time.After(3 * time.Second):
		t.Fatal("not handled within 3 s of its commit (polls are 30 s apart): the notification was not heard")
	}
}
