// Command dlqactions measures the dead-letter actions at 100,000 and
// 1,000,000 dead letters: the replay's dry run (its time, the row versions
// it leaves, and how long a keyed publish of a key in the set waits while
// it runs), the replay and the purge in their committed batches; and the
// console's dead-letter page over dead letters of 5 MB payloads (its time,
// and the process's memory). For comparison it also runs what the dry run
// was before (the replay's statements in a transaction rolled back) at
// -old rows, and reads the page's rows with their whole payloads.
//
// It works in a schema of its own on $DATABASE_URL (default the test
// database), dropped at the end.
//
//	cd bench && go run ./cmd/dlqactions
//	cd bench && go run ./cmd/dlqactions -sizes 100000 -old 100000
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/console"
	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/outbox"
)

const schema = "dlqactions_bench"

func main() {
	dsn := flag.String("dsn", cmpOr(os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "the database")
	sizes := flag.String("sizes", "100000,1000000", "dead-letter counts to measure at")
	old := flag.Int("old", 100000, "run the earlier dry run (replay rolled back) at this count (0: never)")
	pageRows := flag.Int("page-rows", 60, "dead letters of -payload bytes for the page")
	payload := flag.Int("payload", 5<<20, "payload size of the page's dead letters")
	flag.IntVar(&keys, "keys", keys, "ordering keys the dead letters share (0: none)")
	flag.Parse()
	log.SetFlags(log.Ltime)
	ctx := context.Background()
	if err := run(ctx, *dsn, *sizes, *old, *pageRows, *payload); err != nil {
		log.Fatalf("dlqactions: %v", err)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func run(ctx context.Context, dsn, sizes string, old, pageRows, payload int) error {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	admin, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE; CREATE SCHEMA "+schema); err != nil {
		return err
	}
	defer func() { _, _ = admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") }()
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	ob, err := outbox.New(pool, &outbox.Config{Schema: schema})
	if err != nil {
		return err
	}
	if err := ob.Migrate(ctx); err != nil {
		return err
	}
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		if err := actions(ctx, pool, ob, n, n == old); err != nil {
			return err
		}
	}
	return page(ctx, pool, ob, pageRows, payload)
}

// keys is how many ordering keys the dead letters share (0: none).
var keys = 1000

// fill empties both tables and dead-letters n rows of queue "orders" over
// keys keys, each with a timer id, and one live row holding one of them.
func fill(ctx context.Context, pool *pgxpool.Pool, n int) error {
	if keys < 0 {
		return fmt.Errorf("-keys %d must not be negative", keys)
	}
	start := time.Now()
	if _, err := pool.Exec(ctx, "TRUNCATE outbox, outbox_dlq"); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `INSERT INTO outbox_dlq (id, queue, payload, headers, ordering_key, timer_id, deliveries_count, attempts_count, created_at, failed_at, failure_reason, last_error)
		SELECT i, 'orders', convert_to('{"order": ' || i || ', "note": "' || repeat('x', 60) || '"}', 'UTF8'),
		       '{"content-type": "application/json"}', CASE WHEN $2::int > 0 THEN 'k-' || (i % $2::int) END, 't-' || i, 3, 3, now(), now(), 'retry_exhausted', 'boom'
		FROM generate_series(1, $1::bigint) AS i`, n, keys)
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "INSERT INTO outbox (queue, payload, timer_id) VALUES ('orders', 'live', 't-7')"); err != nil {
		return err
	}
	// Not the outbox: statistics of a table of one row would plan the
	// key trigger's lookup of a key's newest row as a scan of the table,
	// which the replay then grows.
	for _, sql := range []string{"VACUUM ANALYZE outbox_dlq"} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			return err
		}
	}
	log.Printf("filled %d dead letters in %v", n, time.Since(start).Round(time.Millisecond))
	return nil
}

// tableStats are what pg_stat_user_tables counts of both tables.
type tableStats struct{ inserted, deleted, dead int64 }

// stats reads them after the backends of pool flushed theirs.
func stats(ctx context.Context, pool *pgxpool.Pool) (tableStats, error) {
	conns := pool.AcquireAllIdle(ctx)
	for _, c := range conns {
		_, _ = c.Exec(ctx, "SELECT pg_stat_force_next_flush()")
		_, _ = c.Exec(ctx, "SELECT 1")
		c.Release()
	}
	var s tableStats
	err := pool.QueryRow(ctx, `SELECT coalesce(sum(n_tup_ins), 0)::bigint, coalesce(sum(n_tup_del), 0)::bigint, coalesce(sum(n_dead_tup), 0)::bigint
		FROM pg_stat_user_tables WHERE schemaname = $1 AND relname IN ('outbox', 'outbox_dlq')`, schema).Scan(&s.inserted, &s.deleted, &s.dead)
	return s, err
}

// publishDuring publishes keyed rows of keys the dead letters hold, one
// at a time, until done is closed, and returns the longest publish.
func publishDuring(ctx context.Context, ob *outbox.Outbox, pool *pgxpool.Pool, done <-chan struct{}) (time.Duration, int, error) {
	pub, err := outbox.NewPublisher[map[string]int](ob, "orders", nil)
	if err != nil {
		return 0, 0, err
	}
	var worst time.Duration
	var n int
	for i := 0; ; i++ {
		select {
		case <-done:
			return worst, n, nil
		default:
		}
		start := time.Now()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := pub.Publish(ctx, tx, map[string]int{"n": i}, &outbox.PublishOpts{OrderingKey: "k-" + strconv.Itoa(i%1000)})
			return err
		})
		if err != nil {
			return worst, n, err
		}
		worst = max(worst, time.Since(start))
		n++
	}
}

// actions measures the dry run, the replay and the purge at n dead
// letters.
func actions(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, n int, old bool) error {
	if err := fill(ctx, pool, n); err != nil {
		return err
	}
	before, err := stats(ctx, pool)
	if err != nil {
		return err
	}
	done := make(chan struct{})
	var worst time.Duration
	var published int
	var pubErr error
	var wg sync.WaitGroup
	wg.Go(func() { worst, published, pubErr = publishDuring(ctx, ob, pool, done) })
	start := time.Now()
	dry, err := ob.ReplayDeadLetters(ctx, outbox.DeadLetterFilter{Queue: "orders"}, &outbox.ReplayOpts{DryRun: true})
	took := time.Since(start)
	close(done)
	wg.Wait()
	if err != nil {
		return err
	}
	if pubErr != nil {
		return pubErr
	}
	after, err := stats(ctx, pool)
	if err != nil {
		return err
	}
	// The publishes inserted rows of their own; the dry run none.
	fmt.Printf("n=%d dry run: %v, matched %d up to id %d, %d would stay; inserted %d rows (the %d publishes), deleted %d, dead row versions %d -> %d; longest keyed publish during it %v\n",
		n, took.Round(time.Millisecond), dry.Matched, dry.UpToID, len(dry.Skipped),
		after.inserted-before.inserted, published, after.deleted-before.deleted, before.dead, after.dead, worst.Round(100*time.Microsecond))
	for _, sql := range []string{"DELETE FROM outbox WHERE payload <> 'live'", "VACUUM outbox"} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			return err
		}
	}

	if old {
		if err := oldDryRun(ctx, pool, ob, n); err != nil {
			return err
		}
	}

	f := outbox.DeadLetterFilter{Queue: "orders", UpToID: &dry.UpToID}
	var batches int
	start = time.Now()
	res, err := ob.ReplayDeadLetters(ctx, f, &outbox.ReplayOpts{Progress: func(done, total int64) { batches++ }})
	if err != nil {
		return err
	}
	fmt.Printf("n=%d replay: %v (%.0f rows/s), %d moved, %d stayed, %d batches\n", n, time.Since(start).Round(time.Millisecond),
		float64(res.Replayed)/time.Since(start).Seconds(), res.Replayed, len(res.Skipped), batches)

	if err := fill(ctx, pool, n); err != nil {
		return err
	}
	batches = 0
	start = time.Now()
	pres, err := ob.PurgeDeadLetters(ctx, outbox.DeadLetterFilter{Queue: "orders"}, &outbox.PurgeOpts{Progress: func(done, total int64) { batches++ }})
	if err != nil {
		return err
	}
	fmt.Printf("n=%d purge: %v (%.0f rows/s), %d deleted, %d batches\n", n, time.Since(start).Round(time.Millisecond),
		float64(pres.Deleted)/time.Since(start).Seconds(), pres.Deleted, batches)
	return nil
}

// oldDryRun runs what the dry run was before: the replay's batches in one
// transaction, rolled back, with a keyed publish beside it.
func oldDryRun(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, n int) error {
	if err := fill(ctx, pool, n); err != nil {
		return err
	}
	before, err := stats(ctx, pool)
	if err != nil {
		return err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	q := db.New(tx)
	done := make(chan struct{})
	var worst time.Duration
	var pubErr error
	var wg sync.WaitGroup
	start := time.Now()
	wg.Go(func() { worst, _, pubErr = publishDuring(ctx, ob, pool, done) })
	after := int64(math.MinInt64)
	for {
		rows, err := q.ReplayDeadLetters(ctx, db.ReplayDeadLettersParams{Queue: ptr("orders"), AfterID: after, UpToID: math.MaxInt64,
			MaxRows: 500, HeaderReplayedFrom: outbox.HeaderReplayedFrom, HeaderFirstFailedAt: outbox.HeaderFirstFailedAt})
		if err != nil {
			_ = tx.Rollback(ctx)
			close(done)
			wg.Wait()
			return err
		}
		if len(rows) == 0 {
			break
		}
		after = rows[len(rows)-1].ID
	}
	_ = tx.Rollback(ctx)
	took := time.Since(start)
	close(done)
	wg.Wait()
	if pubErr != nil {
		return pubErr
	}
	s, err := stats(ctx, pool)
	if err != nil {
		return err
	}
	fmt.Printf("n=%d earlier dry run (replay rolled back): %v, dead row versions %d -> %d; longest keyed publish during it %v\n",
		n, took.Round(time.Millisecond), before.dead, s.dead, worst.Round(time.Millisecond))
	return nil
}

func ptr[T any](v T) *T { return &v }

// page measures the console's dead-letter page over rows dead letters of
// size-byte payloads, and the same rows read with their whole payloads.
func page(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, rows, size int) error {
	start := time.Now()
	// Incompressible payloads: md5s, as large as asked, one apiece.
	if _, err := pool.Exec(ctx, "TRUNCATE outbox, outbox_dlq"); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason)
		SELECT i, 'orders', p.payload || int8send(i), 1, 1, now(), 'rejected'
		FROM generate_series(1, $1::int) AS i,
		     (SELECT decode(string_agg(md5(j::text), ''), 'hex') AS payload FROM generate_series(1, $2::int / 16) AS j) AS p`, rows, size)
	if err != nil {
		return err
	}
	log.Printf("filled %d dead letters of %d bytes in %v", rows, size, time.Since(start).Round(time.Millisecond))
	h, err := console.New(console.Config{Pool: pool})
	if err != nil {
		return err
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	url := srv.URL + "/o/" + schema + "/outbox/dead"
	var took []time.Duration
	runtime.GC()
	for range 20 {
		start := time.Now()
		resp, err := http.Get(url)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %d", url, resp.StatusCode)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	fmt.Printf("dead-letter page, %d dead letters of %d bytes: median %v, max %v; process RSS %d MB (peak %d MB)\n",
		rows, size, took[len(took)/2].Round(100*time.Microsecond), took[len(took)-1].Round(100*time.Microsecond), rss("VmRSS")>>20, rss("VmHWM")>>20)

	// The same page's rows with whole payloads, as the list read them before.
	took = took[:0]
	for range 5 {
		start := time.Now()
		if _, err := ob.NewestDeadLetters(ctx, outbox.DeadLetterFilter{}, math.MaxInt64, 51); err != nil {
			return err
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	fmt.Printf("the same rows with whole payloads (NewestDeadLetters): median %v; process RSS %d MB (peak %d MB)\n",
		took[len(took)/2].Round(time.Millisecond), rss("VmRSS")>>20, rss("VmHWM")>>20)
	return nil
}

// rss reads a size in bytes from /proc/self/status (VmRSS, VmHWM).
func rss(field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return -1
}
