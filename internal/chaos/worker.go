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
// deploy, and different batch shapes.
var subscribers = []struct {
	name     string
	leaseTTL time.Duration
	workers  int
	batch    int
}{
	{"short-lease", 2 * time.Second, 8, 16},
	{"long-lease", 5 * time.Second, 16, 64},
}

// runWorker runs the subscribers of worker n until its standard input
// closes (the coordinator ended or stops it).
func runWorker(dsn, schema string, n int, log *slog.Logger) error {
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
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	if err != nil {
		return err
	}
	rec := &recorder{pool: pool, schema: schema, worker: n, pid: os.Getpid()}
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
	close(errs)
	return <-errs
}

func workerApp(n int) string { return fmt.Sprintf("chaos-worker-%d", n) }

// recorder writes every handler call into the deliveries table, each in
// its own short statement.
type recorder struct {
	pool   *pgxpool.Pool
	schema string
	worker int
	pid    int
	seq    atomic.Int64
}

// recordTimeout bounds each record: a stalled connection fails the handler
// (and so retries its row) instead of hanging it.
const recordTimeout = 2 * time.Second

func (r *recorder) handler(sub string, ttl time.Duration) outbox.Handler[msg] {
	return func(ctx context.Context, m *outbox.Message[msg]) error {
		d := delivery{id: int64(r.pid)<<32 | r.seq.Add(1), began: time.Now(), sub: sub, ttl: ttl, m: m}
		sctx, cancel := context.WithTimeout(ctx, recordTimeout)
		// started is when the handler began, on this process's clock (every
		// process of the harness runs on one host), as recordFailure
		// records it: when the insert waits on a stalled connection, the
		// server's clock would date the start after the stall, though the
		// delivery, and the claim it belongs to, met the stall.
		_, err := r.pool.Exec(sctx, fmt.Sprintf(`INSERT INTO %q.deliveries
			(id, msg_id, row_id, ordering_key, seq, worker, pid, sub, lease_ttl_ms, attempt, started)
			VALUES ($1, $2, $3, nullif($4, ''), $5, $6, $7, $8, $9, $10, $11)`, r.schema), append(r.args(d), d.began)...)
		cancel()
		if err != nil {
			// The insert may land after its answer was lost.
			go r.recordFailure(d, time.Now())
			return fmt.Errorf("record start: %w", err)
		}
		select {
		case <-time.After(time.Duration(rand.IntN(15)) * time.Millisecond):
		case <-ctx.Done():
			// The lease was lost: the handler gives up.
			go r.recordFailure(d, time.Now())
			return context.Cause(ctx)
		}
		outcome, herr := modeOK, error(nil)
		switch {
		case m.Payload.Mode == modeReject:
			outcome, herr = modeReject, outbox.Reject(errors.New("rejected by design"))
		case m.Payload.Mode == modeFail, m.Payload.Mode == modeRetry && m.Attempts == 0:
			outcome, herr = "fail", errors.New("failed by design")
		}
		sctx, cancel = context.WithTimeout(ctx, recordTimeout)
		_, err = r.pool.Exec(sctx, fmt.Sprintf(`UPDATE %q.deliveries SET ended = clock_timestamp(), outcome = $2 WHERE id = $1`, r.schema), d.id, outcome)
		cancel()
		if err != nil {
			// The handler fails (its row is retried); record that, with
			// the time it ended, once the database answers again.
			go r.recordFailure(d, time.Now())
			return fmt.Errorf("record end: %w", err)
		}
		return herr
	}
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
	return []any{d.id, d.m.Payload.ID, d.m.ID, d.m.Payload.Key, d.m.Payload.Seq, r.worker, r.pid, d.sub, d.ttl.Milliseconds(), d.m.Attempts + 1}
}

// recordFailure records delivery d as failed at ended, whether or not its
// start was recorded (an insert whose answer was lost may even land
// later, and then fails on the key), retrying for up to a minute.
func (r *recorder) recordFailure(d delivery, ended time.Time) {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
		_, err := r.pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %q.deliveries AS d
			(id, msg_id, row_id, ordering_key, seq, worker, pid, sub, lease_ttl_ms, attempt, started, ended, outcome)
			VALUES ($1, $2, $3, nullif($4, ''), $5, $6, $7, $8, $9, $10, $11, $12, 'fail')
			ON CONFLICT (id) DO UPDATE SET ended = excluded.ended, outcome = 'fail' WHERE d.ended IS NULL`, r.schema),
			append(r.args(d), d.began, ended)...)
		cancel()
		if err == nil {
			return
		}
	}
}
