package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/outbox"
)

// msg is the payload of every message the coordinator publishes.
type msg struct {
	ID   int64  `json:"id"`
	Key  string `json:"key,omitempty"`
	Seq  int    `json:"seq,omitempty"`
	Mode string `json:"mode"`
}

// Modes: what a message's handler does.
const (
	modeOK     = "ok"     // succeeds
	modeRetry  = "retry"  // fails its first attempt, then succeeds
	modeReject = "reject" // rejects: dead-lettered at once
	modeFail   = "fail"   // always fails: dead-lettered when retries end
)

// Queues the coordinator publishes to; every subscriber takes both.
var queues = []string{"chaos.a", "chaos.b"}

// Subscribers each worker runs: different lease TTLs, as in a rolling
// deploy, and different batch shapes. Both claim the
// way the public defaults do: by row lock after a claim that found 32
// rows or more (a backlog, as every fault leaves behind), by lease
// otherwise; so every batch here takes more than 32 rows.
var subscribers = []struct {
	name     string
	leaseTTL time.Duration
	workers  int
	batch    int
}{
	{"short-lease", 2 * time.Second, 8, 48},
	{"long-lease", 5 * time.Second, 16, 96},
}

// poolConns is each worker's pool size: room for the claims by lock in
// flight (at most two per subscriber), the subscribers' other statements
// and the records, whatever the machine's number of cores (pgxpool's
// default) is.
const poolConns = 16

// runWorker runs the subscribers of worker n until its standard input
// closes (the coordinator ended or stops it). listenDSN, when set, is
// their LISTEN connection's.
func runWorker(dsn, listenDSN, schema, ends string, n int, log *slog.Logger) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = workerApp(n)
	cfg.MaxConns = poolConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	if err != nil {
		return err
	}
	var listen func(ctx context.Context) (*pgx.Conn, error)
	if listenDSN != "" {
		lc, err := pgx.ParseConfig(listenDSN)
		if err != nil {
			return err
		}
		// Named as the worker, so its terminations end its listener too.
		lc.RuntimeParams["application_name"] = workerApp(n)
		listen = func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, lc.Copy()) }
	}
	endLog, err := openEndLog(ends)
	if err != nil {
		return err
	}
	defer endLog.close()
	rec := &recorder{pool: pool, schema: schema, outbox: pgx.Identifier{schema, ob.Table()}.Sanitize(), ends: endLog,
		worker: n, pid: os.Getpid(), log: log, claimLease: "NULL::timestamptz"}
	ringTable := pgx.Identifier{schema, ob.Table() + "_ring"}.Sanitize()
	var ringPresent bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", ringTable).Scan(&ringPresent); err != nil {
		return err
	}
	if ringPresent {
		// A claim of a lane of the ring records when its lease ends before
		// it hands the lane's rows out: while it holds the lane, its record
		// is the lane's newest (it follows the newest progress; older
		// records, of other subscribers' claims, may have longer leases).
		rec.claimLease = fmt.Sprintf(`(SELECT c.until FROM %s AS r JOIN %s AS c ON c.queue = r.queue AND c.lane = r.lane
			WHERE r.id = $3 ORDER BY c.after_seq DESC, c.xid DESC LIMIT 1)`, ringTable, pgx.Identifier{schema, ob.Table() + "_ring_claims"}.Sanitize())
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(subscribers))
	for _, sc := range subscribers {
		sub, err := outbox.NewSubscriber(ob, queues, rec.handler(sc.name, sc.leaseTTL), &outbox.SubscriberConfig[msg]{
			Name:                fmt.Sprintf("worker-%d/%s", n, sc.name),
			Workers:             sc.workers,
			FetchBatchSize:      sc.batch,
			LeaseTTL:            sc.leaseTTL,
			MinFetchInterval:    10 * time.Millisecond,
			MaxFetchInterval:    500 * time.Millisecond,
			QueryTimeout:        2 * time.Second,
			ListenProbeInterval: time.Second,
			ListenProbeTimeout:  500 * time.Millisecond,
			GracefulTimeout:     3 * time.Second,
			ListenConnect:       listen,
			Retry:               outbox.ConstantRetry{Delay: 50 * time.Millisecond, MaxAttempts: 3},
			Logger:              log,
		})
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := sub.Run(ctx); err != nil && !errors.Is(err, outbox.ErrGracefulTimeout) {
				errs <- err
			}
		}()
	}
	fmt.Println("ready")
	wg.Wait()
	// Handlers that returned after the stop still have records to write.
	rec.pending.Wait()
	close(errs)
	return <-errs
}

func workerApp(n int) string { return fmt.Sprintf("chaos-worker-%d", n) }

// recorder writes every handler call into the deliveries table, each in
// its own short statement.
type recorder struct {
	pool   *pgxpool.Pool
	schema string
	outbox string // the outbox table, schema-qualified and quoted
	// claimLease is an SQL expression of row $3's claim's lease end when
	// a claim by lock of the ring holds it (NULL without the ring).
	claimLease string
	ends       *endLog
	log        *slog.Logger
	worker     int
	pid        int
	seq        atomic.Int64
	// pending counts records still being written after their handler
	// returned.
	pending sync.WaitGroup
}

// slowEvery: one handler in slowEvery is slow.
const slowEvery = 20

// recordTimeout bounds each record: a stalled connection fails the handler
// (and so retries its row) instead of hanging it.
const recordTimeout = 2 * time.Second

// handler returns the subscriber's handler: it records the delivery's
// start, handles the message, and, before returning, appends when it
// ended to the worker's end file.
func (r *recorder) handler(sub string, ttl time.Duration) outbox.Handler[msg] {
	return func(ctx context.Context, m *outbox.Message[msg]) error {
		d := delivery{id: int64(r.pid)<<32 | r.seq.Add(1), began: time.Now(), sub: sub, ttl: ttl, m: m}
		var cancelled atomic.Int64
		stop := context.AfterFunc(ctx, func() { cancelled.Store(time.Now().UnixNano()) })
		err := r.handle(ctx, d)
		// The handler is live until it returned or its context ended (the
		// claim was lost, or the subscriber stopped), whichever came
		// first: the overlap check needs no second handler of the row to
		// begin before then. The cancellation's time is when AfterFunc
		// ran, never before it happened.
		end, how := time.Now(), "returned"
		stop()
		if c := cancelled.Load(); c != 0 && c <= end.UnixNano() {
			end, how = time.Unix(0, c), cancelKind(context.Cause(ctx))
		}
		// Written before the handler returns, so an acknowledged
		// delivery (and any delivery its acknowledgement unblocks) always
		// has its end on file, whenever the worker is killed: one
		// append to the page cache, which a SIGKILL does not undo.
		if err := r.ends.write(d.id, end, how); err != nil {
			r.log.Error("chaos: record a handler's end", slog.Any("error", err))
		}
		return err
	}
}

// cancelKind names why a handler's context ended.
func cancelKind(cause error) string {
	switch {
	case errors.Is(cause, outbox.ErrLeaseLost):
		return "lease_lost"
	case errors.Is(cause, outbox.ErrSubscriberStopped):
		return "stopped"
	default:
		return "cancelled"
	}
}

// handle is the handler proper: it records the delivery's start, with
// which kind of claim holds the row, and its outcome, before it returns
// it, so that every acknowledged message has a successful delivery on
// record.
func (r *recorder) handle(ctx context.Context, d delivery) error {
	m := d.m
	sctx, cancel := context.WithTimeout(ctx, recordTimeout)
	// started is when the handler began, on this process's clock (every
	// process of the harness runs on one host), as recordFailure records
	// it: when the insert waits on a stalled connection, the server's
	// clock would date the start after the stall, though the delivery,
	// and the claim it belongs to, met the stall. claim reads the row as
	// committed: a claim by lock has written nothing to it (it holds it
	// by a row lock, which a plain read passes), a claim by lease has
	// written its token and the lease's expiry.
	_, err := r.pool.Exec(sctx, fmt.Sprintf(`INSERT INTO %[1]q.deliveries
		(id, msg_id, row_id, ordering_key, seq, worker, pid, sub, lease_ttl_ms, attempt, deliveries, started, claim, lease_expires)
		VALUES ($1, $2, $3, nullif($4, ''), $5, $6, $7, $8, $9, $10, $11, $12,
		        coalesce((SELECT CASE WHEN o.acquired_token IS NULL THEN 'lock' ELSE 'lease' END
		                  FROM %[2]s AS o WHERE o.id = $3), 'gone'),
		        coalesce((SELECT o.lease_expires_at FROM %[2]s AS o WHERE o.id = $3), %[3]s))`, r.schema, r.outbox, r.claimLease),
		append(r.args(d), d.began)...)
	cancel()
	if err != nil {
		// The insert may land after its answer was lost.
		r.failed(d, time.Now())
		return fmt.Errorf("record start: %w", err)
	}
	// Most handlers take a few milliseconds; one in slowEvery takes up to
	// 1.5 s, so faults find handlers running, some past LockWindow.
	pause := time.Duration(rand.IntN(15)) * time.Millisecond
	if rand.IntN(slowEvery) == 0 {
		pause = time.Duration(200+rand.IntN(1300)) * time.Millisecond
	}
	select {
	case <-time.After(pause):
	case <-ctx.Done():
		// The lease was lost: the handler gives up.
		r.failed(d, time.Now())
		return context.Cause(ctx)
	}
	outcome, herr := modeOK, error(nil)
	switch {
	case m.Payload.Mode == modeReject:
		outcome, herr = modeReject, outbox.Reject(errors.New("rejected by design"))
	case m.Payload.Mode == modeFail, m.Payload.Mode == modeRetry && m.Attempts == 0:
		outcome, herr = "fail", errors.New("failed by design")
	}
	// A claim by lock writes no lease as its handler begins: the lease,
	// if any, is the one its end wrote (a row that ran past the claim's
	// end), from the end's statement on, which may come before the
	// handler's first line; it is read here, when it has committed, and
	// takes the place of the ring's claim's record (read as the handler
	// began), which it outlasts.
	//
	// The statement may land though its answer never comes (the
	// handler's context ended while it waited): the handler then returns
	// an error, so its row is retried, and recordFailure records the
	// delivery as failed over this record, whichever lands first.
	sctx, cancel = context.WithTimeout(ctx, recordTimeout)
	_, err = r.pool.Exec(sctx, fmt.Sprintf(`UPDATE %[1]q.deliveries AS d SET ended = clock_timestamp(), outcome = $2,
		lease_expires = CASE WHEN d.claim = 'lease' THEN d.lease_expires
		                     ELSE coalesce((SELECT o.lease_expires_at FROM %[2]s AS o WHERE o.id = d.row_id), d.lease_expires) END
		WHERE d.id = $1 AND d.ended IS NULL`, r.schema, r.outbox), d.id, outcome)
	cancel()
	if err != nil {
		// The handler fails (its row is retried); record that, with
		// the time it ended, once the database answers again.
		r.failed(d, time.Now())
		return fmt.Errorf("record end: %w", err)
	}
	return herr
}

// delivery is one handler call being recorded.
type delivery struct {
	id    int64
	began time.Time
	sub   string
	ttl   time.Duration
	m     *outbox.Message[msg]
}

func (r *recorder) args(d delivery) []any {
	return []any{d.id, d.m.Payload.ID, d.m.ID, d.m.Payload.Key, d.m.Payload.Seq, r.worker, r.pid, d.sub, d.ttl.Milliseconds(),
		d.m.Attempts + 1, d.m.Deliveries}
}

// failed records, in the background, delivery d as failed at ended.
func (r *recorder) failed(d delivery, ended time.Time) {
	r.pending.Add(1)
	go func() {
		defer r.pending.Done()
		r.recordFailure(d, ended)
	}()
}

// recordFailure records delivery d as failed at ended, whether or not its
// start was recorded (an insert whose answer was lost may even land
// later, and then fails on the key). Its handler returns an error, so the
// subscriber retries the row (or leaves it to a newer delivery): the
// record says so even over an outcome whose statement landed though its
// answer was lost, which would count the retry as a duplicate.
func (r *recorder) recordFailure(d delivery, ended time.Time) {
	r.retry(fmt.Sprintf(`INSERT INTO %q.deliveries AS d
		(id, msg_id, row_id, ordering_key, seq, worker, pid, sub, lease_ttl_ms, attempt, deliveries, started, ended, outcome)
		VALUES ($1, $2, $3, nullif($4, ''), $5, $6, $7, $8, $9, $10, $11, $12, $13, 'fail')
		ON CONFLICT (id) DO UPDATE SET ended = excluded.ended, outcome = 'fail'`, r.schema),
		append(r.args(d), d.began, ended)...)
}

// retry runs a record's statement until it succeeds, for up to a minute.
func (r *recorder) retry(sql string, args ...any) {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
		_, err := r.pool.Exec(ctx, sql, args...)
		cancel()
		if err == nil {
			return
		}
	}
}
