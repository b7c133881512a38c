package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/dbx"
	"github.com/outboxgen/outboxgen/internal/pgtest"
)

// The per-key order test runs subscribers in two OS processes: the test
// itself and a copy of the test binary that it starts in child mode. The
// child finds the parent's outbox through these variables and stops when
// its standard input closes, so it never outlives the parent.
const (
	keyedChildURLEnv    = "OUTBOXGEN_TEST_KEYED_CHILD_URL"
	keyedChildSchemaEnv = "OUTBOXGEN_TEST_KEYED_CHILD_SCHEMA"
	keyedChildReady     = "keyed child: subscribers running"
)

// The volume: 2,500 messages, of 50 keys. The test's time is that of
// its commits, each publishing or handing-over one of which notifies and
// so waits its turn behind every notifying commit of the database (the
// server serializes them). Per key, 50 messages of which one in ten
// fails make each key pass between the four subscribers, and so between
// the two processes, dozens of times, and retry a message several times:
// more messages repeat those hand-overs and retries, not new kinds of
// them (10,000 took 37–43 s under -race on a loaded 2-core machine,
// 2,500 take 12–19 s there).
const (
	keyedQueue   = "keyed"
	keyedKeys    = 50
	keyedPerKey  = 50
	keyedWriters = 6
)

// keyedMsg is one published message: its key and a number unique across
// the test.
type keyedMsg struct {
	K int `json:"k"`
	N int `json:"n"`
}

func keyName(k int) string { return fmt.Sprintf("key-%03d", k) }

// TestPerKeyOrderAcrossProcesses publishes 50 keys × 50 messages from
// concurrent transactions while four subscribers in two OS processes
// handle them with handlers that fail and stall at random. Every handler
// call is recorded in the database on the server's clock, and the test
// checks that each key's calls never overlap, follow the commit order of
// the publishing transactions, retry a message until it succeeds before
// its successor starts, and handle each committed message successfully
// exactly once.
func TestPerKeyOrderAcrossProcesses(t *testing.T) {
	if url := os.Getenv(keyedChildURLEnv); url != "" {
		keyedChild(t, url, os.Getenv(keyedChildSchemaEnv))
		return
	}
	t.Parallel()
	begun := time.Now()
	e := setup(t)
	// Two processes' pools of 16 and the publishers' 6: about three
	// tests' connections.
	pgtest.Reserve(t, 3)
	e.exec(`CREATE TABLE keyed_calls (
		id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		k           int NOT NULL,
		n           int NOT NULL,
		ordering_key text NOT NULL,
		row_id      bigint NOT NULL,
		attempts    int NOT NULL,
		deliveries  int NOT NULL,
		sub         text NOT NULL,
		pid         int NOT NULL,
		ok          boolean,
		started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
		ended_at    timestamptz)`)

	child := startKeyedChild(t, e.db.URL, e.db.Schema)
	pool := keyedPool(t, e.db.URL, 16)
	ob, err := New(pool, &Config{Schema: e.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	subs, rec := startKeyedSubscribers(t, ob, pool, "parent")
	select {
	case <-child.ready:
	case <-child.exited:
		t.Fatalf("child exited before its subscribers ran: %v\n%s", child.err, child.output())
	case <-time.After(60 * time.Second):
		t.Fatalf("child not running after 60s:\n%s", child.output())
	}

	pub, err := NewPublisher[keyedMsg](ob, keyedQueue, nil)
	if err != nil {
		t.Fatal(err)
	}
	written := publishKeyed(t, pub, keyedPool(t, e.db.URL, keyedWriters))
	published := time.Now()
	committed := written.committed()
	total := 0
	for _, msgs := range committed {
		total += len(msgs)
	}
	if total != keyedKeys*keyedPerKey {
		t.Fatalf("%d messages committed, want %d", total, keyedKeys*keyedPerKey)
	}

	waitKeyed(t, pool, total)
	handled := time.Now()
	if err := child.stop(); err != nil {
		t.Errorf("child: %v\n%s", err, child.output())
	}
	for _, s := range subs {
		if err := s.stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	if got := rec.named(EventLeaseLost); len(got) != 0 {
		t.Errorf("lease_lost events in the parent: %v", got)
	}

	var left struct{ Outbox, DLQ, Handoff int }
	if err := pool.QueryRow(e.ctx, `SELECT
		(SELECT count(*) FROM outbox), (SELECT count(*) FROM outbox_dlq), (SELECT count(*) FROM outbox_handoff)`).
		Scan(&left.Outbox, &left.DLQ, &left.Handoff); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(struct{ Outbox, DLQ, Handoff int }{}, left); diff != "" {
		t.Errorf("rows left at the end (-want +got):\n%s", diff)
	}

	calls := keyedCalls(t, pool)
	checkKeyedCalls(t, committed, written.rolledBack, calls, map[string]int{
		"parent-w8": os.Getpid(), "parent-w16": os.Getpid(),
		"child-w8": child.pid, "child-w16": child.pid,
	})
	failed := 0
	for _, c := range calls {
		if c.OK != nil && !*c.OK {
			failed++
		}
	}
	t.Logf("%d messages (%d rolled back), %d handler calls, %d failed; published in %v, handled in %v",
		total, len(written.rolledBack), len(calls), failed,
		published.Sub(begun).Round(time.Millisecond), handled.Sub(begun).Round(time.Millisecond))
}

// keyedChild is the test in child mode: it serves the parent's outbox with
// two subscribers until its standard input closes.
func keyedChild(t *testing.T, url, schema string) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		// The parent closes our stdin to stop us, and so does its exit.
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	pool := keyedPool(t, url, 16)
	ob, err := New(pool, &Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	subs, rec := startKeyedSubscribers(t, ob, pool, "child")
	fmt.Println(keyedChildReady)
	<-ctx.Done()
	for _, s := range subs {
		if err := s.stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	if got := rec.named(EventLeaseLost); len(got) != 0 {
		t.Errorf("lease_lost events in the child: %v", got)
	}
}

func keyedPool(t *testing.T, url string, conns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

var errKeyedInjected = errors.New("injected failure")

// startKeyedSubscribers runs a process's two subscribers of the keyed
// queue, with different sizes and retry strategies. Their handlers record
// every call in keyed_calls, stall now and then, and fail one call in ten.
func startKeyedSubscribers(t *testing.T, ob *Outbox, pool *pgxpool.Pool, role string) ([]*started, *events) {
	t.Helper()
	rec := &events{}
	pid := os.Getpid()
	var subs []*started
	for _, c := range []struct {
		workers, batch int
		retry          RetryStrategy
	}{
		{8, 4, ConstantRetry{Delay: 5 * time.Millisecond}},
		{16, 32, LinearRetry{Initial: time.Millisecond, Step: 2 * time.Millisecond, MaxDelay: 15 * time.Millisecond}},
	} {
		name := fmt.Sprintf("%s-w%d", role, c.workers)
		cfg := fastConfig[keyedMsg](rec)
		cfg.Name, cfg.Workers, cfg.FetchBatchSize, cfg.Retry = name, c.workers, c.batch, c.retry
		// Generous leases, so no row is handled twice because its lease
		// ran out; retries never give up, so every row ends acknowledged.
		cfg.LeaseTTL, cfg.MaxDeliveries = 30*time.Second, -1
		subs = append(subs, startSub(t, ob, []string{keyedQueue}, func(ctx context.Context, m *Message[keyedMsg]) error {
			var call int64
			if err := pool.QueryRow(ctx, `INSERT INTO keyed_calls (k, n, ordering_key, row_id, attempts, deliveries, sub, pid)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id`,
				m.Payload.K, m.Payload.N, m.OrderingKey, m.ID, m.Attempts, m.Deliveries, name, pid).Scan(&call); err != nil {
				return fmt.Errorf("record the call: %w", err)
			}
			if rand.IntN(10) == 0 {
				time.Sleep(time.Duration(1+rand.IntN(5)) * time.Millisecond)
			}
			fail := rand.IntN(10) == 0
			if _, err := pool.Exec(ctx, `UPDATE keyed_calls SET ended_at = clock_timestamp(), ok = $2 WHERE id = $1`, call, !fail); err != nil {
				return fmt.Errorf("record the call's end: %w", err)
			}
			if fail {
				return errKeyedInjected
			}
			return nil
		}, cfg))
	}
	return subs, rec
}

// keyedChildProc is the child process serving the outbox beside the test.
type keyedChildProc struct {
	cmd    *exec.Cmd
	pid    int
	stdin  io.WriteCloser
	out    *childOutput
	ready  chan struct{}
	exited chan struct{}
	err    error // Wait's result, once exited is closed
	once   sync.Once
}

// childOutput collects the child's stdout and stderr and closes ready when
// the child reports its subscribers running.
type childOutput struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	ready chan struct{}
	seen  bool
}

func (o *childOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf.Write(p)
	if !o.seen && bytes.Contains(o.buf.Bytes(), []byte(keyedChildReady)) {
		o.seen = true
		close(o.ready)
	}
	return len(p), nil
}

func (c *keyedChildProc) output() string {
	c.out.mu.Lock()
	defer c.out.mu.Unlock()
	return c.out.buf.String()
}

// startKeyedChild re-executes the test binary in child mode against the
// outbox in schema. The child is stopped, and killed if it does not stop,
// when the test ends.
func startKeyedChild(t *testing.T, url, schema string) *keyedChildProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.timeout=3m")
	cmd.Env = append(os.Environ(),
		keyedChildURLEnv+"="+url, keyedChildSchemaEnv+"="+schema,
		// The child uses the parent's database, never a container of its own.
		pgtest.EnvURL+"="+pgtest.URL(t))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &childOutput{ready: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &keyedChildProc{cmd: cmd, pid: cmd.Process.Pid, stdin: stdin, out: out, ready: out.ready, exited: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		if err := c.stop(); err != nil && !t.Failed() {
			t.Errorf("child: %v\n%s", err, c.output())
		}
	})
	return c
}

// stop closes the child's stdin, waits for it to exit, kills it after
// 20 s, and returns how it exited.
func (c *keyedChildProc) stop() error {
	c.once.Do(func() {
		_ = c.stdin.Close()
		select {
		case <-c.exited:
		case <-time.After(20 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.exited
			c.err = fmt.Errorf("killed: did not stop within 20s of its stdin closing (%v)", c.err)
		}
	})
	<-c.exited
	return c.err
}

// keyedLog records, per key, the order in which published messages'
// transactions commit. A keyed insert holds its key's lock until its
// transaction ends, so the inserts of one key return in commit order: each
// is recorded as it returns, before its transaction commits or rolls back.
type keyedLog struct {
	mu         sync.Mutex
	byKey      [keyedKeys][]keyedPub
	rolledBack map[int]bool
	remaining  [keyedKeys]int
	next       int
}

type keyedPub struct {
	N  int
	ID int64
}

// keyedGroup is the messages of one key in a transaction.
type keyedGroup struct {
	k    int
	msgs []keyedMsg
}

// plan reserves the messages of a transaction: up to four keys in
// ascending order (so publishers never deadlock on key locks), one to
// five messages each. It returns nil when every key has all its messages.
func (l *keyedLog) plan() []keyedGroup {
	l.mu.Lock()
	defer l.mu.Unlock()
	var open []int
	for k, n := range l.remaining {
		if n > 0 {
			open = append(open, k)
		}
	}
	if len(open) == 0 {
		return nil
	}
	rand.Shuffle(len(open), func(i, j int) { open[i], open[j] = open[j], open[i] })
	open = open[:min(len(open), 1+rand.IntN(4))]
	slices.Sort(open)
	groups := make([]keyedGroup, len(open))
	for i, k := range open {
		n := min(l.remaining[k], 1+rand.IntN(5))
		l.remaining[k] -= n
		g := keyedGroup{k: k}
		for range n {
			g.msgs = append(g.msgs, keyedMsg{K: k, N: l.next})
			l.next++
		}
		groups[i] = g
	}
	return groups
}

func (l *keyedLog) inserted(msgs []keyedMsg, ids []int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, m := range msgs {
		l.byKey[m.K] = append(l.byKey[m.K], keyedPub{N: m.N, ID: ids[i]})
	}
}

func (l *keyedLog) rollBack(groups []keyedGroup) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, g := range groups {
		l.remaining[g.k] += len(g.msgs)
		for _, m := range g.msgs {
			l.rolledBack[m.N] = true
		}
	}
}

// committed returns each key's committed messages in commit order.
func (l *keyedLog) committed() [keyedKeys][]keyedPub {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out [keyedKeys][]keyedPub
	for k, pubs := range l.byKey {
		for _, p := range pubs {
			if !l.rolledBack[p.N] {
				out[k] = append(out[k], p)
			}
		}
	}
	return out
}

// publishKeyed publishes keyedPerKey messages of each key from concurrent
// transactions that mix keys, single publishes and batches; one in twenty
// rolls back (its messages are published again later) and some hold their
// key locks a little before committing.
func publishKeyed(t *testing.T, pub *Publisher[keyedMsg], pool *pgxpool.Pool) *keyedLog {
	t.Helper()
	l := &keyedLog{rolledBack: map[int]bool{}}
	for k := range l.remaining {
		l.remaining[k] = keyedPerKey
	}
	ctx := t.Context()
	var wg sync.WaitGroup
	for range keyedWriters {
		wg.Go(func() {
			for groups := l.plan(); groups != nil; groups = l.plan() {
				err := publishKeyedTx(ctx, pub, pool, l, groups)
				if dbx.Classify(err) == dbx.Doomed {
					// It failed to serialize (the database's default
					// isolation may be SERIALIZABLE): rolled back.
					l.rollBack(groups)
					continue
				}
				if err != nil {
					t.Errorf("publish: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return l
}

func publishKeyedTx(ctx context.Context, pub *Publisher[keyedMsg], pool *pgxpool.Pool, l *keyedLog, groups []keyedGroup) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	for _, g := range groups {
		opts := &PublishOpts{OrderingKey: keyName(g.k)}
		if len(g.msgs) > 1 && rand.IntN(2) == 0 {
			ids, err := pub.PublishBatch(ctx, tx, g.msgs, opts)
			if err != nil {
				return err
			}
			l.inserted(g.msgs, ids)
			continue
		}
		for _, m := range g.msgs {
			id, err := pub.Publish(ctx, tx, m, opts)
			if err != nil {
				return err
			}
			l.inserted([]keyedMsg{m}, []int64{id})
		}
	}
	if rand.IntN(20) == 0 {
		if err := tx.Rollback(ctx); err != nil {
			return err
		}
		l.rollBack(groups)
		return nil
	}
	if rand.IntN(10) == 0 {
		time.Sleep(time.Duration(1+rand.IntN(3)) * time.Millisecond)
	}
	return tx.Commit(ctx)
}

// waitKeyed waits until every committed message has a successful call,
// the outbox is empty and no hand-over waits. It fails, describing the
// rows left, when nothing changes for 15 s.
func waitKeyed(t *testing.T, pool *pgxpool.Pool, total int) {
	t.Helper()
	type progress struct{ done, left, handoffs int }
	last, lastAt := progress{done: -1}, time.Now()
	for {
		var p progress
		if err := pool.QueryRow(t.Context(), `SELECT (SELECT count(DISTINCT n) FROM keyed_calls WHERE ok),
			(SELECT count(*) FROM outbox), (SELECT count(*) FROM outbox_handoff)`).Scan(&p.done, &p.left, &p.handoffs); err != nil {
			if dbx.Classify(err) == dbx.Doomed { // at SERIALIZABLE
				continue
			}
			t.Fatal(err)
		}
		if p == (progress{total, 0, 0}) {
			return
		}
		if p != last {
			last, lastAt = p, time.Now()
		} else if time.Since(lastAt) > 15*time.Second {
			t.Fatalf("no progress for 15s: %d of %d messages succeeded, %d rows and %d hand-overs left\n%s",
				p.done, total, p.left, p.handoffs, keyedStall(t, pool))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// keyedStall describes the keys that still have rows: what state their
// rows are in, and their recorded hand-overs.
func keyedStall(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	rows, err := pool.Query(t.Context(), `
		WITH o AS (
			SELECT ordering_key, count(*) AS n, min(id) AS lowest,
				count(*) FILTER (WHERE NOT blocked) AS unblocked,
				count(*) FILTER (WHERE acquired_token IS NOT NULL) AS leased,
				min(next_attempt_at) - clock_timestamp() AS due
			FROM outbox GROUP BY ordering_key),
		h AS (SELECT ordering_key, count(*) AS n FROM outbox_handoff GROUP BY ordering_key)
		SELECT ordering_key, coalesce(o.n, 0), coalesce(o.lowest, 0), coalesce(o.unblocked, 0),
			coalesce(o.leased, 0), coalesce(o.due, '0'), coalesce(h.n, 0)
		FROM o FULL JOIN h USING (ordering_key) ORDER BY ordering_key LIMIT 20`)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	fmt.Fprintln(&b, "key: rows, lowest id, unblocked, leased, next due in, hand-overs")
	var (
		key                            string
		n, unblocked, leased, handoffs int
		minID                          int64
		due                            time.Duration
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &n, &minID, &unblocked, &leased, &due, &handoffs}, func() error {
		fmt.Fprintf(&b, "%s: %d, %d, %d, %d, %v, %d\n", key, n, minID, unblocked, leased, due, handoffs)
		return nil
	})
	if err != nil {
		fmt.Fprintln(&b, err)
	}
	return b.String()
}

// keyedCall is one recorded handler call.
type keyedCall struct {
	ID          int64
	K, N        int
	OrderingKey string
	RowID       int64
	Attempts    int
	Deliveries  int
	Sub         string
	PID         int
	OK          *bool
	Start       time.Time
	End         *time.Time
}

func (c keyedCall) String() string {
	end := "running"
	if c.End != nil {
		end = c.End.Format("15:04:05.000000")
	}
	ok := "?"
	if c.OK != nil {
		ok = fmt.Sprint(*c.OK)
	}
	return fmt.Sprintf("call %d (message %d, row %d, attempts %d, deliveries %d, %s pid %d, ok %s, %s–%s)",
		c.ID, c.N, c.RowID, c.Attempts, c.Deliveries, c.Sub, c.PID, ok, c.Start.Format("15:04:05.000000"), end)
}

func keyedCalls(t *testing.T, pool *pgxpool.Pool) []keyedCall {
	t.Helper()
	rows, err := pool.Query(t.Context(), `SELECT id, k, n, ordering_key, row_id, attempts, deliveries, sub, pid, ok, started_at, ended_at
		FROM keyed_calls ORDER BY k, started_at, id`)
	if err != nil {
		t.Fatal(err)
	}
	calls, err := pgx.CollectRows(rows, pgx.RowToStructByPos[keyedCall])
	if err != nil {
		t.Fatal(err)
	}
	return calls
}

// checkKeyedCalls checks the recorded calls against the commit order:
// per key, calls never overlap, and in start order they handle the key's
// messages one after another, each failing zero or more times and then
// succeeding once, its n-th call seeing n earlier attempts and n+1
// deliveries. Every subscriber in pids must have handled messages, from
// its own process.
func checkKeyedCalls(t *testing.T, committed [keyedKeys][]keyedPub, rolledBack map[int]bool, calls []keyedCall, pids map[string]int) {
	t.Helper()
	const maxReports = 30
	reports := 0
	report := func(format string, args ...any) {
		t.Helper()
		if reports++; reports <= maxReports {
			t.Errorf(format, args...)
		}
	}
	defer func() {
		if reports > maxReports {
			t.Errorf("... and %d more violations", reports-maxReports)
		}
	}()

	type place struct {
		k, pos int
		id     int64
	}
	where := map[int]place{}
	for k, pubs := range committed {
		for i, p := range pubs {
			if i > 0 && p.ID <= pubs[i-1].ID {
				report("%s: message %d committed after message %d but got a lower id (%d < %d)",
					keyName(k), p.N, pubs[i-1].N, p.ID, pubs[i-1].ID)
			}
			where[p.N] = place{k, i, p.ID}
		}
	}

	byKey := map[int][]keyedCall{}
	handledBy := map[string]int{}
	for _, c := range calls {
		byKey[c.K] = append(byKey[c.K], c)
		if c.OK != nil && *c.OK {
			handledBy[c.Sub]++
		}
		if want, ok := pids[c.Sub]; !ok || c.PID != want {
			report("%v: subscriber %s ran in pid %d, want %d", c, c.Sub, c.PID, want)
		}
	}
	var subs, wantSubs []string
	for s := range handledBy {
		subs = append(subs, s)
	}
	for s := range pids {
		wantSubs = append(wantSubs, s)
	}
	slices.Sort(subs)
	slices.Sort(wantSubs)
	if diff := cmp.Diff(wantSubs, subs); diff != "" {
		t.Errorf("subscribers that handled messages (-want +got):\n%s", diff)
	}

	for k := range keyedKeys {
		kc := byKey[k]
		var wantOrder, gotOrder []int
		for _, p := range committed[k] {
			wantOrder = append(wantOrder, p.N)
		}
		var (
			tries     = map[int]int{}
			succeeded int
			last      *keyedCall // the call that ended last so far
		)
		for i := range kc {
			c := &kc[i]
			at, known := where[c.N]
			switch {
			case rolledBack[c.N]:
				report("%s: %v handles a message whose transaction rolled back", keyName(k), c)
				continue
			case !known:
				report("%s: %v handles a message nobody published", keyName(k), c)
				continue
			case c.End == nil || c.OK == nil:
				report("%s: %v never ended", keyName(k), c)
				continue
			case at.k != k || c.OrderingKey != keyName(k) || c.RowID != at.id:
				report("%s: %v, but message %d was published as row %d of %s", keyName(k), c, c.N, at.id, keyName(at.k))
			}
			if last != nil && c.Start.Before(*last.End) {
				report("%s: calls overlap:\n\t%v\n\t%v", keyName(k), last, c)
			}
			if last == nil || c.End.After(*last.End) {
				last = c
			}
			switch {
			case at.pos < succeeded:
				report("%s: %v handles commit position %d, which had already succeeded", keyName(k), c, at.pos)
			case at.pos > succeeded:
				report("%s: %v handles commit position %d before position %d (message %d) succeeded",
					keyName(k), c, at.pos, succeeded, committed[k][succeeded].N)
			}
			if c.Attempts != tries[c.N] || c.Deliveries != tries[c.N]+1 {
				report("%s: %v is call %d of its message: want attempts %d and deliveries %d",
					keyName(k), c, tries[c.N]+1, tries[c.N], tries[c.N]+1)
			}
			tries[c.N]++
			if *c.OK {
				succeeded++
				gotOrder = append(gotOrder, c.N)
			}
		}
		if diff := cmp.Diff(wantOrder, gotOrder); diff != "" {
			report("%s: messages whose calls succeeded, in start order, against commit order (-want +got):\n%s", keyName(k), diff)
		}
	}
}
