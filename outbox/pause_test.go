package outbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/dbx"
)

// fetches counts a subscriber's claims (EventFetched), empty ones
// included.
type fetches struct{ n atomic.Int64 }

func (f *fetches) Record(ev MetricEvent) {
	if ev.Name == EventFetched {
		f.n.Add(1)
	}
}

// handledLog records the payloads handlers ran for, in order.
type handledLog struct {
	mu   sync.Mutex
	rows []string
}

func (h *handledLog) handle(_ context.Context, m *Message[string]) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rows = append(h.rows, m.Payload)
	return nil
}

func (h *handledLog) get() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.rows)
}

// claimedAgain waits until every one of fs has claimed twice more: each
// subscriber has then run a claim that began after the caller's last
// step.
func claimedAgain(t *testing.T, fs ...*fetches) {
	t.Helper()
	from := make([]int64, len(fs))
	for i, f := range fs {
		from[i] = f.n.Load()
	}
	eventually(t, "every subscriber claimed twice more", func() bool {
		for i, f := range fs {
			if f.n.Load() < from[i]+2 {
				return false
			}
		}
		return true
	})
}

// A paused queue's rows are published and kept, and no subscriber of it
// hands one out, on any claim path: not the outbox table's, nor the
// ring's, which move into the table and wait there. A subscriber of the
// paused queue and another goes on with the other. Resumed, every row is
// delivered once, each key's in order. As the publisher and subscriber
// roles in the roles leg.
func TestAPausedQueueKeepsItsRowsUntilItIsResumed(t *testing.T) {
	t.Parallel()
	forEachClaimPath(t, func(t *testing.T, p claimPath) {
		e := setup(t)
		pause, err := e.ob.PauseQueue(e.ctx, "q", "a deploy")
		if err != nil {
			t.Fatalf("PauseQueue: %v", err)
		}
		if diff := cmp.Diff(QueuePause{Queue: "q", Reason: "a deploy"}, pause,
			cmpopts.IgnoreFields(QueuePause{}, "PausedAt", "PausedBy")); diff != "" || pause.PausedAt.IsZero() || pause.PausedBy == "" {
			t.Errorf("PauseQueue returned (-want +got):\n%s%+v", diff, pause)
		}
		table, ring := newPublisher[string](t, e, "q", nil), ringPublisher(t, e, "q")
		other := newPublisher[string](t, e, "other", nil)
		var want []string
		publish := func(pub *Publisher[string], tier, key string, n int) {
			t.Helper()
			var opts *PublishOpts
			if key != "" {
				opts = &PublishOpts{OrderingKey: key}
			}
			var payloads []string
			for i := range n {
				payloads = append(payloads, fmt.Sprintf("%s %s %d", tier, key, i))
			}
			if _, err := pub.PublishBatch(e.ctx, e.pubPool, payloads, opts); err != nil {
				t.Fatalf("PublishBatch: %v", err)
			}
			want = append(want, payloads...)
		}
		publish(table, "table", "", 5)
		publish(table, "table", "k1", 3)
		publish(ring, "ring", "", 5)
		publish(ring, "ring", "k2", 3)
		if _, err := other.Publish(e.ctx, e.pubPool, "other", nil); err != nil {
			t.Fatal(err)
		}

		var qs, both handledLog
		var f1, f2 fetches
		s1 := startSub(t, e.ob, []string{"q"}, qs.handle, onPath(p, fastConfig[string](&f1)))
		s2 := startSub(t, e.ob, []string{"q", "other"}, both.handle, onPath(p, fastConfig[string](&f2)))
		eventually(t, "the other queue's row handled", func() bool { return slices.Contains(both.get(), "other") })
		// The ring's rows of the paused queue move into the table.
		eventually(t, "the paused queue's rows all in the outbox table", func() bool {
			return e.countWhere("queue = 'q'") == len(want)
		})
		claimedAgain(t, &f1, &f2)
		if got := append(qs.get(), slices.DeleteFunc(both.get(), func(s string) bool { return s == "other" })...); len(got) > 0 {
			t.Fatalf("handled while the queue was paused: %q", got)
		}
		paused, err := e.ob.PausedQueues(e.ctx)
		if err != nil {
			t.Fatalf("PausedQueues: %v", err)
		}
		if diff := cmp.Diff([]QueuePause{pause}, paused, cmpopts.EquateApproxTime(0)); diff != "" {
			t.Errorf("PausedQueues (-want +got):\n%s", diff)
		}

		if resumed, err := e.ob.ResumeQueue(e.ctx, "q"); err != nil || !resumed {
			t.Fatalf("ResumeQueue = %v, %v; want true", resumed, err)
		}
		all := func() []string {
			return append(qs.get(), slices.DeleteFunc(both.get(), func(s string) bool { return s == "other" })...)
		}
		eventually(t, "every row handled after the resume", func() bool { return len(all()) >= len(want) })
		for _, s := range []*started{s1, s2} {
			if err := s.stop(); err != nil {
				t.Errorf("Run: %v", err)
			}
		}
		got := all()
		for _, log := range [][]string{qs.get(), both.get()} {
			for _, key := range []string{"k1", "k2"} {
				var seen []string
				for _, s := range log {
					if strings.Contains(s, " "+key+" ") {
						seen = append(seen, s)
					}
				}
				if !slices.IsSorted(seen) {
					t.Errorf("key %s handled out of order: %q", key, seen)
				}
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("handled after the resume (-want +got):\n%s", diff)
		}
		if resumed, err := e.ob.ResumeQueue(e.ctx, "q"); err != nil || resumed {
			t.Errorf("ResumeQueue of a running queue = %v, %v; want false", resumed, err)
		}
	})
}

// A row a handler runs when its queue is paused finishes: its outcome is
// written and it is not handed out again; the rows published after the
// pause wait for the resume. Pausing a paused queue keeps its first
// pause.
func TestAPauseLetsTheRowsInHandFinish(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pub := newPublisher[string](t, e, "q", nil)
	started, release := make(chan struct{}), make(chan struct{})
	var log handledLog
	var f fetches
	s := startSub(t, e.ob, []string{"q"}, func(ctx context.Context, m *Message[string]) error {
		if m.Payload == "running" {
			close(started)
			<-release
		}
		return log.handle(ctx, m)
	}, fastConfig[string](&f))
	id, err := pub.Publish(e.ctx, e.pubPool, "running", nil)
	if err != nil {
		t.Fatal(err)
	}
	<-started
	first, err := e.ob.PauseQueue(e.ctx, "q", "")
	if err != nil {
		t.Fatalf("PauseQueue: %v", err)
	}
	again, err := e.ob.PauseQueue(e.ctx, "q", "another reason")
	if err != nil {
		t.Fatalf("PauseQueue of a paused queue: %v", err)
	}
	if diff := cmp.Diff(first, again); diff != "" {
		t.Errorf("a second pause changed the first (-first +second):\n%s", diff)
	}
	if _, err := pub.Publish(e.ctx, e.pubPool, "after", nil); err != nil {
		t.Fatal(err)
	}
	close(release)
	eventually(t, "the running row's outcome written", func() bool { _, ok := e.row(id); return !ok })
	claimedAgain(t, &f)
	if diff := cmp.Diff([]string{"running"}, log.get()); diff != "" {
		t.Fatalf("handled while paused (-want +got):\n%s", diff)
	}
	if _, err := e.ob.ResumeQueue(e.ctx, "q"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the row published while paused handled", func() bool { return len(log.get()) == 2 })
	if err := s.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	if diff := cmp.Diff([]string{"running", "after"}, log.get()); diff != "" {
		t.Errorf("handled (-want +got):\n%s", diff)
	}
}

// A resume wakes a sleeping subscriber: it claims the queue at once, not
// at its next poll.
func TestAResumeWakesTheQueuesSleepingSubscribers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if _, err := e.ob.PauseQueue(e.ctx, "q", ""); err != nil {
		t.Fatal(err)
	}
	var log handledLog
	var f fetches
	cfg := fastConfig[string](&f)
	cfg.MaxFetchInterval = 10 * time.Minute // it wakes for the resume, or not at all
	s := startSub(t, e.ob, []string{"q"}, log.handle, cfg)
	if _, err := newPublisher[string](t, e, "q", nil).Publish(e.ctx, e.pubPool, "waiting", nil); err != nil {
		t.Fatal(err)
	}
	// Asleep, with a record that leaves the paused queue out (so the
	// publish did not wake it).
	eventually(t, "the subscriber asleep", func() bool {
		var n int
		if err := e.db.Pool.QueryRow(e.ctx, "SELECT count(*) FROM outbox_sleepers WHERE until > now() AND queues = '{}'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	if _, err := e.ob.ResumeQueue(e.ctx, "q"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the row handled after the resume", func() bool { return len(log.get()) == 1 })
	if err := s.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// Only the subscriber (operator) role may pause and resume, and list the
// pauses; the publisher role's attempt is refused and changes nothing.
func TestPausingIsTheSubscriberRolesPrivilege(t *testing.T) {
	t.Parallel()
	e := setupRoles(t)
	if _, err := e.pub.PauseQueue(e.ctx, "q", ""); dbx.SQLState(err) != "42501" {
		t.Errorf("PauseQueue as the publisher = %v; want insufficient_privilege (42501)", err)
	}
	if _, err := e.pub.ResumeQueue(e.ctx, "q"); dbx.SQLState(err) != "42501" {
		t.Errorf("ResumeQueue as the publisher = %v; want insufficient_privilege (42501)", err)
	}
	if _, err := e.sub.PauseQueue(e.ctx, "q", "as the operator"); err != nil {
		t.Fatalf("PauseQueue as the subscriber: %v", err)
	}
	paused, err := e.sub.PausedQueues(e.ctx)
	if err != nil || len(paused) != 1 || paused[0].Queue != "q" {
		t.Fatalf("PausedQueues as the subscriber = %+v, %v", paused, err)
	}
	if resumed, err := e.sub.ResumeQueue(e.ctx, "q"); err != nil || !resumed {
		t.Fatalf("ResumeQueue as the subscriber = %v, %v", resumed, err)
	}
}

// Bad input gives a clear error and pauses nothing; an outbox whose
// schema predates pauses gives the *SchemaError that names the fix.
func TestPauseQueueRefusesBadInputAndAnOldSchema(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var ce *ConfigError
	if _, err := e.ob.PauseQueue(e.ctx, "", ""); !errors.As(err, &ce) || ce.Field != "queue" {
		t.Errorf("PauseQueue of an empty queue name = %v; want a *ConfigError for queue", err)
	}
	if _, err := e.ob.ResumeQueue(e.ctx, strings.Repeat("q", QueueMaxBytes+1)); !errors.As(err, &ce) || ce.Field != "queue" {
		t.Errorf("ResumeQueue of a too long name = %v; want a *ConfigError for queue", err)
	}
	for _, reason := range []string{strings.Repeat("r", PauseReasonMaxBytes+1), "\xff", "a\x00b"} {
		var ie *InputError
		if _, err := e.ob.PauseQueue(e.ctx, "q", reason); !errors.As(err, &ie) || ie.Field != "reason" {
			t.Errorf("PauseQueue with reason %q = %v; want an *InputError for reason", reason, err)
		}
	}
	if paused, err := e.ob.PausedQueues(e.ctx); err != nil || len(paused) != 0 {
		t.Errorf("PausedQueues after refused pauses = %+v, %v; want none", paused, err)
	}

	old := atVersion(t, 13)
	var se *SchemaError
	if _, err := old.ob.PauseQueue(old.ctx, "q", ""); !errors.As(err, &se) || se.Version != 13 || se.Want != old.ob.LatestSchemaVersion() {
		t.Errorf("PauseQueue at schema 13 = %v; want a *SchemaError", err)
	}
	if _, err := old.ob.PausedQueues(old.ctx); !errors.As(err, &se) {
		t.Errorf("PausedQueues at schema 13 = %v; want a *SchemaError", err)
	}
}

// Upgrading from schema 13 keeps rows in every state, the records, and
// the ring's rows, and adds the pauses and the presence records; a queue
// paused at 14 runs again after going down to 13, and up again it is not
// paused.
func TestUpgradeFromSchema13AddsPausesAndPresenceAndKeepsRowsInEveryState(t *testing.T) {
	t.Parallel()
	e := atVersion(t, 13)
	state := e.seedEveryStateAndRecords()
	e.exec(`INSERT INTO outbox_ring (queue, payload) VALUES ('q', 'in the ring')`)
	ringRows := func() string { return fmt.Sprintf("ring rows=%d", e.count("outbox_ring")) }
	before := append(state(), ringRows())
	if err := e.ob.Migrate(e.ctx); err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	upAndBack(t, e.ob, 13, func() {
		if diff := cmp.Diff(before, append(state(), ringRows())); diff != "" {
			t.Errorf("at 13 again (-want +got):\n%s", diff)
		}
		var exists bool
		if err := e.db.Pool.QueryRow(e.ctx, "SELECT to_regclass('outbox_pauses') IS NOT NULL OR to_regclass('outbox_subscribers') IS NOT NULL").Scan(&exists); err != nil || exists {
			t.Errorf("at 13 again, the pauses or the presence table exists = %v, %v", exists, err)
		}
	}, func(step string) {
		if diff := cmp.Diff(before, append(state(), ringRows())); diff != "" {
			t.Errorf("%s (-want +got):\n%s", step, diff)
		}
		paused, err := e.ob.PausedQueues(e.ctx)
		if err != nil || len(paused) != 0 {
			t.Errorf("%s: PausedQueues = %+v, %v; want none", step, paused, err)
		}
		if subs, err := e.ob.Subscribers(e.ctx); err != nil || len(subs) != 0 {
			t.Errorf("%s: Subscribers = %+v, %v; want none", step, subs, err)
		}
		if step == "upgrade" {
			if _, err := e.ob.PauseQueue(e.ctx, "q", "before going down"); err != nil {
				t.Fatal(err)
			}
		}
	})
	e.handlesEveryDueRow("in the ring")
}

// A pause holds every subscriber process of the queue: a subscriber in
// another OS process (a copy of the test binary) and one in this process,
// both started after the rows were published, claim and go to sleep
// without handing one out; the ring's rows move into the outbox table.
// Resumed, the two processes handle every row once, each key's in order
// (recorded in the database, in the order the handlers ran).
func TestAPauseHoldsEverySubscriberProcess(t *testing.T) {
	if url := os.Getenv(keyedChildURLEnv); url != "" {
		pauseChild(t, url, os.Getenv(keyedChildSchemaEnv))
		return
	}
	t.Parallel()
	e := setup(t)
	e.exec(`CREATE TABLE pause_calls (id bigserial PRIMARY KEY, payload text NOT NULL, pid int NOT NULL)`)
	e.exec(`GRANT INSERT ON pause_calls TO PUBLIC`)
	e.exec(`GRANT USAGE ON SEQUENCE pause_calls_id_seq TO PUBLIC`)
	if _, err := e.ob.PauseQueue(e.ctx, "q", "across processes"); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, p := range []struct {
		pub       *Publisher[string]
		tier, key string
	}{{newPublisher[string](t, e, "q", nil), "table", ""}, {newPublisher[string](t, e, "q", nil), "table", "k1"},
		{ringPublisher(t, e, "q"), "ring", ""}, {ringPublisher(t, e, "q"), "ring", "k2"}} {
		var payloads []string
		for i := range 6 {
			payloads = append(payloads, fmt.Sprintf("%s %s %d", p.tier, p.key, i))
		}
		if _, err := p.pub.PublishBatch(e.ctx, e.pubPool, payloads, &PublishOpts{OrderingKey: p.key}); err != nil {
			t.Fatal(err)
		}
		want = append(want, payloads...)
	}
	child := startKeyedChild(t, e.obURL, e.db.Schema)
	select {
	case <-child.ready:
	case <-time.After(time.Minute):
		t.Fatalf("the child did not start:\n%s", child.output())
	}
	parent := startSub(t, e.ob, []string{"q"}, pauseRecorder(e.db.Pool, e.db.Schema), fastConfig[string](nil))
	eventually(t, "both processes' subscribers asleep, their records leaving the paused queue out", func() bool {
		var n int
		if err := e.db.Pool.QueryRow(e.ctx, "SELECT count(*) FROM outbox_sleepers WHERE until > now() AND queues = '{}'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 2
	})
	eventually(t, "the ring's rows moved into the outbox table", func() bool { return e.countWhere("queue = 'q'") == len(want) })
	calls := func() (payloads []string, pids map[int]bool) {
		rows, err := e.db.Pool.Query(e.ctx, "SELECT payload, pid FROM pause_calls ORDER BY id")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		pids = map[int]bool{}
		for rows.Next() {
			var p string
			var pid int
			if err := rows.Scan(&p, &pid); err != nil {
				t.Fatal(err)
			}
			payloads, pids[pid] = append(payloads, p), true
		}
		return payloads, pids
	}
	if got, _ := calls(); len(got) > 0 {
		t.Fatalf("handled while paused: %q", got)
	}
	if _, err := e.ob.ResumeQueue(e.ctx, "q"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "every row handled after the resume", func() bool { got, _ := calls(); return len(got) >= len(want) })
	if err := parent.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	if err := child.stop(); err != nil {
		t.Errorf("child: %v\n%s", err, child.output())
	}
	got, _ := calls()
	for _, key := range []string{"k1", "k2"} {
		var seen []string
		for _, s := range got {
			if strings.Contains(s, " "+key+" ") {
				seen = append(seen, s)
			}
		}
		if !slices.IsSorted(seen) || len(seen) != 6 {
			t.Errorf("key %s handled out of order or not once each: %q", key, seen)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("handled after the resume (-want +got):\n%s", diff)
	}
}

// pauseRecorder returns a handler that records each call in schema's
// pause_calls, with the handling process's id, before it returns.
func pauseRecorder(pool *pgxpool.Pool, schema string) Handler[string] {
	table := pgx.Identifier{schema, "pause_calls"}.Sanitize()
	return func(ctx context.Context, m *Message[string]) error {
		_, err := pool.Exec(ctx, "INSERT INTO "+table+" (payload, pid) VALUES ($1, $2)", m.Payload, os.Getpid())
		return err
	}
}

// pauseChild is TestAPauseHoldsEverySubscriberProcess in child mode: a
// subscriber of queue q of the parent's outbox, at fastConfig, until its
// standard input closes.
func pauseChild(t *testing.T, url, schema string) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	pool := keyedPool(t, url, 8)
	ob, err := New(pool, &Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	s := startSub(t, ob, []string{"q"}, pauseRecorder(pool, schema), fastConfig[string](nil))
	fmt.Println(keyedChildReady)
	<-ctx.Done()
	if err := s.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
}
