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
		id := int64(r.pid)<<32 | r.seq.Add(1)
		sctx, cancel := context.WithTimeout(ctx, recordTimeout)
		_, err := r.pool.Exec(sctx, fmt.Sprintf(`INSERT INTO %q.deliveries
			(id, msg_id, row_id, ordering_key, seq, worker, pid, sub, lease_ttl_ms, attempt)
			VALUES ($1, $2, $3, nullif($4, ''), $5, $6, $7, $8, $9, $10)`, r.schema),
			id, m.Payload.ID, m.ID, m.Payload.Key, m.Payload.Seq, r.worker, r.pid, sub, ttl.Milliseconds(), m.Attempts+1)
		cancel()
		if err != nil {
			// The insert may have landed before its answer was lost.
			go r.recordFailure(id, time.Now())
			return fmt.Errorf("record start: %w", err)
		}
		select {
		case <-time.After(time.Duration(rand.IntN(15)) * time.Millisecond):
		case <-ctx.Done():
			// The lease was lost: the handler gives up.
			go r.recordFailure(id, time.Now())
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
		_, err = r.pool.Exec(sctx, fmt.Sprintf(`UPDATE %q.deliveries SET ended = clock_timestamp(), outcome = $2 WHERE id = $1`, r.schema), id, outcome)
		cancel()
		if err != nil {
			// The handler fails (its row is retried); record that, with
			// the time it ended, once the database answers again.
			go r.recordFailure(id, time.Now())
			return fmt.Errorf("record end: %w", err)
		}
		return herr
	}
}

// recordFailure marks delivery id as failed at ended, retrying for up to a
// minute.
func (r *recorder) recordFailure(id int64, ended time.Time) {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
		_, err := r.pool.Exec(ctx, fmt.Sprintf(`UPDATE %q.deliveries SET ended = $2, outcome = 'fail' WHERE id = $1 AND ended IS NULL`, r.schema), id, ended)
		cancel()
		if err == nil {
			return
		}
	}
}
