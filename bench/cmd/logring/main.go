// Command logring measures a prototype of the log tier's storage before it
// is built: an append-only ring of LIST partitions that every writer
// INSERTs into (txid and slot filled by defaults), read per lane by
// snapshot difference with one progress row per batch, and turned by
// TRUNCATE. It answers the two questions that decide whether the tier is
// built:
//
//   - drain: does a keyed drain (rows of many keys, each key's rows in
//     order) keep at least 0.7x the speed of an unkeyed one? Both drains
//     read the same ring; the keyed one also asks, per batch, which of its
//     keys are held in a state table (empty here, as when nothing fails)
//     and runs each key's rows one after another.
//   - rotate: can the ring turn while claims by lock are always open,
//     without making publishers wait? Publishers write one-row
//     transactions as fast as they can while lane readers hold each batch
//     open for -hold; the run is repeated with the rotator on and off
//     (ABBA), and publish latency, turns and truncates are reported.
//
// Every row published is checked to be delivered exactly once. The
// prototype leaves out what the tier keeps from today's table (leases,
// retries, hand-overs, scheduled rows, crash accounting): see the log
// tier's design study for the whole design.
//
//	cd bench && go run ./cmd/logring -dsn "$DATABASE_URL" -rows 200000 -rounds 3
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/bench/internal/procstat"
)

// ring is the number of partitions, lanes the number of lanes per queue.
const (
	ring  = 4
	lanes = 4
	queue = "q"
)

func main() {
	dsn := flag.String("dsn", os.Getenv("DATABASE_URL"), "database to measure on (default $DATABASE_URL)")
	rows := flag.Int("rows", 100000, "rows per drain")
	rounds := flag.Int("rounds", 3, "rounds of each measurement (ABBA order)")
	batch := flag.Int("batch", 1000, "rows per batch a lane reader takes at most")
	dur := flag.Duration("duration", 15*time.Second, "length of one rotate run")
	hold := flag.Duration("hold", 20*time.Millisecond, "how long a rotate run's reader keeps each batch open, as a handler would")
	every := flag.Duration("every", time.Second, "how often the rotator tries to turn the ring")
	writers := flag.Int("writers", 8, "publishing connections of a rotate run")
	which := flag.String("run", "drain,rotate,publish", "measurements to run: drain, rotate, publish")
	held := flag.Bool("held", false, "hold a REPEATABLE READ snapshot, idle, on a connection of its own for the whole run, as a report or pg_dump would")
	flag.BoolVar(&dispatch, "dispatch", true, "drains hand every row to a pool of workers, each key's rows one after another (false: to see what that costs)")
	flag.BoolVar(&explainRead, "explain", false, "print the plan of each drain's first read of lane 0")
	flag.BoolVar(&probeKeys, "probe", true, "keyed drains ask the state table which of a batch's keys it holds (false: to see what the probe costs)")
	flag.StringVar(&keyRead, "keyread", "txid", "how keyed drains read a lane: txid (batches cut at whole transactions, as unkeyed ones) or id (in id order, the progress holding an id bound; adds an index on (queue, lane, id))")
	flag.Parse()
	if *dsn == "" {
		log.Fatal("logring: set DATABASE_URL or pass -dsn")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, *dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if *held {
		conn, err := pgx.Connect(ctx, *dsn)
		must(err)
		defer func() { _ = conn.Close(context.Background()) }()
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		must(err)
		_, err = tx.Exec(ctx, "SELECT 1")
		must(err)
		fmt.Println("a REPEATABLE READ snapshot is held for the whole run")
	}
	if strings.Contains(*which, "drain") {
		drains(ctx, pool, *rows, *rounds, *batch)
	}
	if strings.Contains(*which, "rotate") {
		rotations(ctx, pool, *rounds, *batch, *dur, *hold, *every, *writers)
	}
	if strings.Contains(*which, "publish") {
		publishes(ctx, *dsn, *rounds, *dur)
	}
}

// publishes measures one-row publishing transactions into the ring
// against the same INSERT into a bare table (an identity primary key, no
// partitions, no txid or slot), at 8 and 32 connections, ABBA. Commits
// do not wait for the disk (synchronous_commit off), so the figures are
// the server's work, not the disk's.
func publishes(ctx context.Context, dsn string, rounds int, dur time.Duration) {
	cfg, err := pgxpool.ParseConfig(dsn)
	must(err)
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	must(err)
	defer pool.Close()
	fmt.Printf("publish: one-row transactions, synchronous_commit off, %v per run\n", dur)
	for _, writers := range []int{8, 32} {
		res := map[string][]float64{}
		for i := range rounds {
			order := []string{"log", "bare", "bare", "log"}
			if i%2 == 1 {
				order = []string{"bare", "log", "log", "bare"}
			}
			for _, table := range order {
				res[table] = append(res[table], publishRun(ctx, pool, table, writers, dur))
			}
		}
		ring, bare := median(res["log"]), median(res["bare"])
		fmt.Printf("  %2d writers: ring %8.0f/s  bare table %8.0f/s  ring/bare %.2fx  (ring %v, bare %v)\n",
			writers, ring, bare, ring/bare, res["log"], res["bare"])
	}
}

// publishRun inserts one row per transaction into table of a fresh ring
// from writers connections for dur, and returns rows per second.
func publishRun(ctx context.Context, pool *pgxpool.Pool, table string, writers int, dur time.Duration) float64 {
	s := schema(ctx, pool)
	defer func() { _ = exec(context.Background(), pool, "DROP SCHEMA "+s+" CASCADE") }()
	sql := `INSERT INTO ` + s + `.` + table + ` (queue, payload, lane) VALUES ($1, '\x7b7d', 0)`
	stopAt := time.Now().Add(dur)
	var n atomic.Int64
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for time.Now().Before(stopAt) {
				if _, err := pool.Exec(ctx, sql, queue); err != nil {
					log.Fatalf("publish: %v", err)
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	return float64(n.Load()) / dur.Seconds()
}

// schema makes a fresh schema with the ring in it and returns its name.
func schema(ctx context.Context, pool *pgxpool.Pool) string {
	name := fmt.Sprintf("logring_%d", rand.Uint32())
	must(exec(ctx, pool, "DROP SCHEMA IF EXISTS "+name+" CASCADE; CREATE SCHEMA "+name))
	var b strings.Builder
	fmt.Fprintf(&b, "SET LOCAL search_path = %s;\n", name)
	// The slot is read from a sequence, outside any snapshot: a turn is
	// seen at once. pg_sequence_last_value, not a SELECT from the
	// sequence: that runs a query per row, which cost a quarter of a
	// one-row publish. txid is declared before slot, so its default runs
	// first: a transaction has its xid before it reads the slot.
	fmt.Fprintf(&b, `CREATE SEQUENCE slot_seq MINVALUE 0 MAXVALUE %d START 0 CYCLE;
SELECT nextval('slot_seq');
CREATE FUNCTION cur_slot() RETURNS smallint LANGUAGE sql VOLATILE AS 'SELECT pg_sequence_last_value(''%s.slot_seq'')::smallint';
CREATE TABLE log (
	id bigint GENERATED ALWAYS AS IDENTITY,
	queue text COLLATE "C" NOT NULL,
	payload bytea NOT NULL,
	ordering_key text COLLATE "C",
	created_at timestamptz NOT NULL DEFAULT now(),
	txid xid8 NOT NULL DEFAULT pg_current_xact_id(),
	slot smallint NOT NULL DEFAULT cur_slot(),
	lane smallint NOT NULL
) PARTITION BY LIST (slot);
`, ring-1, name)
	for p := range ring {
		fmt.Fprintf(&b, "CREATE TABLE log_p%d PARTITION OF log FOR VALUES IN (%d) WITH (autovacuum_enabled = off);\n", p, p)
	}
	fmt.Fprintf(&b, `CREATE INDEX log_lane_idx ON log (queue, lane, txid, id);
CREATE TABLE lanes (queue text COLLATE "C", lane smallint, PRIMARY KEY (queue, lane));
INSERT INTO lanes SELECT '%[1]s', l FROM generate_series(0, %[2]d) AS l;
CREATE TABLE progress (queue text COLLATE "C", lane smallint, seq bigint GENERATED ALWAYS AS IDENTITY, snap pg_snapshot NOT NULL,
	below bigint NOT NULL DEFAULT 0, PRIMARY KEY (queue, lane, seq));
INSERT INTO progress (queue, lane, snap) SELECT '%[1]s', l, pg_current_snapshot() FROM generate_series(0, %[2]d) AS l;
CREATE TABLE turns (slot smallint PRIMARY KEY, done_below xid8);
INSERT INTO turns SELECT p, NULL FROM generate_series(0, %[3]d) AS p;
CREATE TABLE state (queue text COLLATE "C", ordering_key text COLLATE "C", id bigint);
CREATE TABLE bare (
	id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	queue text COLLATE "C" NOT NULL,
	payload bytea NOT NULL,
	ordering_key text COLLATE "C",
	created_at timestamptz NOT NULL DEFAULT now(),
	lane smallint NOT NULL
);
CREATE INDEX state_key_idx ON state (queue, ordering_key);
`, queue, lanes-1, ring-1)
	if keyRead == "id" {
		b.WriteString("CREATE INDEX log_lane_id_idx ON log (queue, lane, id);\n")
	}
	tx, err := pool.Begin(ctx)
	must(err)
	_, err = tx.Exec(ctx, b.String())
	must(err)
	must(tx.Commit(ctx))
	return name
}

func exec(ctx context.Context, pool *pgxpool.Pool, sql string) error {
	_, err := pool.Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol)
	return err
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// probeKeys is -probe, dispatch -dispatch, explainRead -explain.
var probeKeys, dispatch, explainRead bool

// keyRead is -keyread: how a keyed drain reads a lane.
//
// A batch cut at whole transactions in txid order can break a key's
// order: a key's rows take ids in commit order (under the key's lock),
// but a transaction may take its xid before an earlier writer of the key
// takes its own. With transaction V (xid 100) waiting on the key's lock
// while U (xid 101) writes the key's row 5 and commits, V writes row 6;
// a cut after xid 100 hands out row 6 a batch before row 5.
//
// Read in id order instead, a batch is every row its snapshot sees that
// the lane's progress has not consumed, smallest ids first: a progress
// (snap, below) consumes the rows snap sees with ids up to below. A
// key's earlier row committed before its later row drew its id, so any
// snapshot that sees the later row sees the earlier, and its smaller id
// puts it in the same batch or an earlier one.
var keyRead string

// reader is one lane reader: it claims a free lane, reads the batch after
// the lane's newest progress, hands it out, and writes the progress.
type reader struct {
	pool   *pgxpool.Pool
	schema string
	batch  int
	keyed  bool
	// hold is how long the batch is kept open after it is read.
	hold time.Duration
	// seen marks every id delivered; dup counts ids delivered twice.
	seen *sync.Map
	dup  *atomic.Int64
	got  *atomic.Int64
}

// batchRow is one row a batch hands out.
type batchRow struct {
	id   int64
	txid uint64
	key  *string
}

// laneRead is the read of a lane's batch in schema s: slots, queue,
// lane, the previous progress's xmin, that progress, the current
// snapshot, and the most rows.
func laneRead(s string) string {
	return `SELECT id, txid, ordering_key FROM ` + s + `.log
		WHERE slot = ANY($1::smallint[]) AND queue = $2 AND lane = $3 AND txid >= $4::xid8
		  AND NOT pg_visible_in_snapshot(txid, $5::text::pg_snapshot) AND pg_visible_in_snapshot(txid, $6::text::pg_snapshot)
		ORDER BY txid, id LIMIT $7`
}

// scanBatchRow reads one row of a batch.
func scanBatchRow(row pgx.CollectableRow) (batchRow, error) {
	var b batchRow
	return b, row.Scan(&b.id, &b.txid, &b.key)
}

// claim takes one batch of a free lane and ends it; it returns the rows
// handed out, 0 when no lane was free or the lane had nothing.
func (r *reader) claim(ctx context.Context) (int, error) {
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	s := r.schema
	var lane int16
	err = tx.QueryRow(ctx, `SELECT lane FROM `+s+`.lanes WHERE queue = $1 ORDER BY random() LIMIT 1 FOR UPDATE SKIP LOCKED`, queue).Scan(&lane)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	} else if err != nil {
		return 0, err
	}
	// The lane's newest progress, the current snapshot, and the
	// partitions the range can reach: those not yet done below the
	// range's start.
	var prev, cur string
	var from uint64
	var slots []int16
	err = tx.QueryRow(ctx, `SELECT p.snap::text, pg_current_snapshot()::text, pg_snapshot_xmin(p.snap)::text::bigint,
			(SELECT array_agg(t.slot) FROM `+s+`.turns AS t WHERE t.done_below IS NULL OR t.done_below > pg_snapshot_xmin(p.snap))
		FROM `+s+`.progress AS p WHERE p.queue = $1 AND p.lane = $2 ORDER BY p.seq DESC LIMIT 1`, queue, lane).
		Scan(&prev, &cur, &from, &slots)
	if err != nil {
		return 0, fmt.Errorf("progress: %w", err)
	}
	// Rows visible now and not in the previous batch's snapshot, in
	// txid order, cut after the txid where the batch fills (whole
	// transactions). An unnamed statement, planned for its arguments
	// each time: the partitions outside slots are pruned when planning,
	// so not even locked.
	var got []batchRow
	snap := cur
	var below int64
	if r.keyed && keyRead == "id" {
		got, below, err = r.readByID(ctx, tx, lane, slots, from, prev, cur)
	} else {
		var rows pgx.Rows
		rows, err = tx.Query(ctx, laneRead(s), pgx.QueryExecModeExec, slots, queue, lane, from, prev, cur, r.batch)
		if err == nil {
			got, err = pgx.CollectRows(rows, scanBatchRow)
		}
	}
	if err != nil {
		return 0, err
	}
	if len(got) == r.batch && !(r.keyed && keyRead == "id") {
		// Full: the rest of the last transaction's rows, then a
		// progress that says everything up to that txid is done.
		last := got[len(got)-1]
		rows, err := tx.Query(ctx, `SELECT id, txid, ordering_key FROM `+s+`.log
			WHERE slot = ANY($1::smallint[]) AND queue = $2 AND lane = $3 AND txid = $4::xid8 AND id > $5 ORDER BY id`,
			pgx.QueryExecModeExec, slots, queue, lane, last.txid, last.id)
		if err != nil {
			return 0, err
		}
		rest, err := pgx.CollectRows(rows, scanBatchRow)
		if err != nil {
			return 0, err
		}
		got = append(got, rest...)
		snap = cutSnapshot(cur, last.txid+1)
	}
	if r.keyed && probeKeys && len(got) > 0 {
		// Which keys of the batch the state tier holds: one probe per
		// distinct key.
		keys := make([]string, 0, len(got))
		for _, b := range got {
			if b.key != nil {
				keys = append(keys, *b.key)
			}
		}
		slices.Sort(keys)
		keys = slices.Compact(keys)
		rows, err := tx.Query(ctx, `SELECT k FROM unnest($2::text[]) AS k
			WHERE EXISTS (SELECT FROM `+s+`.state AS st WHERE st.queue = $1 AND st.ordering_key = k)`, queue, keys)
		if err != nil {
			return 0, err
		}
		held, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return 0, err
		}
		if len(held) > 0 {
			return 0, fmt.Errorf("keys held in an empty state table: %v", held)
		}
	}
	r.handle(got)
	if r.hold > 0 && len(got) > 0 {
		time.Sleep(r.hold)
	}
	if len(got) == 0 && snap == prev {
		return 0, nil
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+s+`.progress (queue, lane, snap, below) VALUES ($1, $2, $3::pg_snapshot, $4)`, queue, lane, snap, below); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	// Delivered once the progress that acknowledges them is committed:
	// a batch that ends any other way is delivered again.
	for _, b := range got {
		r.mark(b.id)
	}
	return len(got), nil
}

// readByID reads a keyed lane's batch in id order (see keyRead): the
// rows of transactions that committed since the previous progress with
// ids up to its bound, and up to r.batch rows above the bound that cur
// sees; below is the new bound.
func (r *reader) readByID(ctx context.Context, tx pgx.Tx, lane int16, slots []int16, from uint64, prev, cur string) (got []batchRow, below int64, err error) {
	s := r.schema
	if err := tx.QueryRow(ctx, `SELECT below FROM `+s+`.progress WHERE queue = $1 AND lane = $2 ORDER BY seq DESC LIMIT 1`,
		queue, lane).Scan(&below); err != nil {
		return nil, 0, err
	}
	rows, err := tx.Query(ctx, `SELECT id, txid, ordering_key FROM `+s+`.log
		WHERE slot = ANY($1::smallint[]) AND queue = $2 AND lane = $3 AND txid >= $4::xid8 AND id <= $5
		  AND NOT pg_visible_in_snapshot(txid, $6::text::pg_snapshot) AND pg_visible_in_snapshot(txid, $7::text::pg_snapshot)`,
		pgx.QueryExecModeExec, slots, queue, lane, from, below, prev, cur)
	if err != nil {
		return nil, 0, err
	}
	late, err := pgx.CollectRows(rows, scanBatchRow)
	if err != nil {
		return nil, 0, err
	}
	rows, err = tx.Query(ctx, `SELECT id, txid, ordering_key FROM `+s+`.log
		WHERE slot = ANY($1::smallint[]) AND queue = $2 AND lane = $3 AND id > $4
		  AND pg_visible_in_snapshot(txid, $5::text::pg_snapshot)
		ORDER BY queue, lane, id LIMIT $6`,
		pgx.QueryExecModeExec, slots, queue, lane, below, cur, r.batch)
	if err != nil {
		return nil, 0, err
	}
	above, err := pgx.CollectRows(rows, scanBatchRow)
	if err != nil {
		return nil, 0, err
	}
	if len(above) > 0 {
		below = above[len(above)-1].id
	}
	got = append(late, above...)
	slices.SortFunc(got, func(a, b batchRow) int { return cmp.Compare(a.id, b.id) })
	return got, below, nil
}

// handle hands the batch out on a pool of workers, as a subscriber does:
// an unkeyed row is a unit of work of its own, a key's rows one unit run
// one after another in id order.
func (r *reader) handle(got []batchRow) {
	if !dispatch {
		return
	}
	var units [][]int64
	if r.keyed {
		at := map[string]int{}
		for _, b := range got {
			i, ok := at[*b.key]
			if !ok {
				i = len(units)
				at[*b.key] = i
				units = append(units, nil)
			}
			units[i] = append(units[i], b.id)
		}
	} else {
		units = make([][]int64, len(got))
		for i, b := range got {
			units[i] = []int64{b.id}
		}
	}
	var wg sync.WaitGroup
	work := make(chan []int64, 64)
	for range 8 {
		wg.Go(func() {
			for ids := range work {
				if !slices.IsSorted(ids) {
					log.Fatalf("a key's rows out of order: %v", ids)
				}
			}
		})
	}
	for _, ids := range units {
		work <- ids
	}
	close(work)
	wg.Wait()
}

func (r *reader) mark(id int64) {
	if _, loaded := r.seen.LoadOrStore(id, true); loaded {
		r.dup.Add(1)
	}
	r.got.Add(1)
}

// cutSnapshot is a snapshot that says every transaction below xmax that
// cur does not list as in progress is done: the progress of a batch cut
// at txid xmax-1.
func cutSnapshot(cur string, xmax uint64) string {
	parts := strings.Split(cur, ":")
	var xip []string
	lowest := xmax
	if parts[2] != "" {
		for _, x := range strings.Split(parts[2], ",") {
			v, _ := strconv.ParseUint(x, 10, 64)
			if v < xmax {
				xip = append(xip, x)
				lowest = min(lowest, v)
			}
		}
	}
	curMin, _ := strconv.ParseUint(parts[0], 10, 64)
	return fmt.Sprintf("%d:%d:%s", min(lowest, curMin, xmax), xmax, strings.Join(xip, ","))
}

// drains measures unkeyed and keyed drains of n rows, ABBA.
func drains(ctx context.Context, pool *pgxpool.Pool, n, rounds, batch int) {
	res := map[bool][]float64{}
	cpu, wal := map[bool][]float64{}, map[bool][]float64{}
	for i := range rounds {
		order := []bool{false, true, true, false}
		if i%2 == 1 {
			order = []bool{true, false, false, true}
		}
		for _, keyed := range order {
			rate, c := drain(ctx, pool, n, batch, keyed)
			res[keyed] = append(res[keyed], rate)
			cpu[keyed] = append(cpu[keyed], c.cpu)
			wal[keyed] = append(wal[keyed], c.wal)
		}
	}
	un, ke := median(res[false]), median(res[true])
	fmt.Printf("drain of %d rows, %d lanes, batches of %d, %d readers, medians of %d:\n", n, lanes, batch, lanes, 2*rounds)
	fmt.Printf("  unkeyed  %8.0f rows/s  %v\n", un, res[false])
	fmt.Printf("  keyed    %8.0f rows/s  %v (10 rows on each of %d keys)\n", ke, res[true], n/10)
	fmt.Printf("  keyed / unkeyed: %.2fx\n", ke/un)
	fmt.Printf("  server per row drained (every postgres process on this machine): unkeyed %.2f µs, %.1f B of WAL; keyed %.2f µs, %.1f B of WAL\n",
		median(cpu[false]), median(wal[false]), median(cpu[true]), median(wal[true]))
}

// drain fills a fresh ring with n rows, in transactions of 100, and times
// lanes readers that drain it.
func drain(ctx context.Context, pool *pgxpool.Pool, n, batch int, keyed bool) (float64, drainCost) {
	s := schema(ctx, pool)
	defer func() { _ = exec(context.Background(), pool, "DROP SCHEMA "+s+" CASCADE") }()
	for done := 0; done < n; done += 100 {
		var err error
		if keyed {
			// 10 rows of each key, the key's rows spread over 10
			// transactions, as orders that change over time.
			_, err = pool.Exec(ctx, `INSERT INTO `+s+`.log (queue, payload, ordering_key, lane)
				SELECT $1, '\x7b7d', k, abs(hashtext(k)) % `+strconv.Itoa(lanes)+`
				FROM (SELECT 'k' || ((($2 + g) % ($3 / 10)))::text AS k FROM generate_series(0, 99) AS g) AS x`, queue, done, n)
		} else {
			_, err = pool.Exec(ctx, `INSERT INTO `+s+`.log (queue, payload, lane)
				SELECT $1, '\x7b7d', ($2 + g) % `+strconv.Itoa(lanes)+` FROM generate_series(0, 99) AS g`, queue, done)
		}
		must(err)
	}
	must(exec(ctx, pool, "VACUUM ANALYZE "+s+".log"))
	if explainRead {
		var prev, cur string
		var from uint64
		must(pool.QueryRow(ctx, `SELECT snap::text, pg_current_snapshot()::text, pg_snapshot_xmin(snap) FROM `+s+`.progress
			WHERE queue = $1 AND lane = 0 ORDER BY seq DESC LIMIT 1`, queue).Scan(&prev, &cur, &from))
		rows, err := pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+laneRead(s), pgx.QueryExecModeExec,
			[]int16{0, 1, 2, 3}, queue, 0, from, prev, cur, batch)
		must(err)
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		must(err)
		fmt.Printf("keyed=%v:\n%s\n", keyed, strings.Join(plan, "\n"))
	}
	r := &reader{pool: pool, schema: s, batch: batch, keyed: keyed, seen: &sync.Map{}, dup: &atomic.Int64{}, got: &atomic.Int64{}}
	cpu0, wal0 := procstat.Postgres(), walPosition(ctx, pool)
	start := time.Now()
	var wg sync.WaitGroup
	for range lanes {
		wg.Go(func() {
			for r.got.Load() < int64(n) {
				if _, err := r.claim(ctx); err != nil {
					log.Fatalf("claim: %v", err)
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	c := drainCost{cpu: float64(procstat.Postgres()-cpu0) / float64(time.Microsecond) / float64(n),
		wal: float64(walPosition(ctx, pool)-wal0) / float64(n)}
	if r.got.Load() != int64(n) || r.dup.Load() != 0 {
		log.Fatalf("drain: delivered %d of %d, %d twice", r.got.Load(), n, r.dup.Load())
	}
	return float64(n) / took.Seconds(), c
}

// drainCost is what a drain cost the server per row: CPU in µs, WAL in
// bytes.
type drainCost struct{ cpu, wal float64 }

// walPosition is the server's WAL insert position in bytes.
func walPosition(ctx context.Context, pool *pgxpool.Pool) int64 {
	var pos int64
	must(pool.QueryRow(ctx, "SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint").Scan(&pos))
	return pos
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return (s[(len(s)-1)/2] + s[len(s)/2]) / 2
}

// rotations runs rotate with the rotator on and off, ABBA.
func rotations(ctx context.Context, pool *pgxpool.Pool, rounds, batch int, dur, hold, every time.Duration, writers int) {
	fmt.Printf("rotate: %d writers of one-row transactions, %d lane readers holding each batch %v, ring of %d turned every %v, %v per run\n",
		writers, lanes, hold, ring, every, dur)
	var on, off []rotateResult
	for i := range rounds {
		order := []bool{true, false, false, true}
		if i%2 == 1 {
			order = []bool{false, true, true, false}
		}
		for _, turn := range order {
			r := rotate(ctx, pool, batch, dur, hold, every, writers, turn)
			fmt.Printf("  rotator %-3s %s\n", map[bool]string{true: "on", false: "off"}[turn], r)
			if turn {
				on = append(on, r)
			} else {
				off = append(off, r)
			}
		}
	}
	med := func(rs []rotateResult, f func(rotateResult) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		return median(v)
	}
	for _, m := range []struct {
		name string
		f    func(rotateResult) float64
	}{
		{"publish/s", func(r rotateResult) float64 { return r.rate }},
		{"publish p50 ms", func(r rotateResult) float64 { return r.p50 }},
		{"publish p99 ms", func(r rotateResult) float64 { return r.p99 }},
		{"publish max ms", func(r rotateResult) float64 { return r.max }},
	} {
		a, b := med(on, m.f), med(off, m.f)
		fmt.Printf("  %-15s on %8.2f  off %8.2f  on/off %.2fx\n", m.name, a, b, a/b)
	}
}

type rotateResult struct {
	rate, p50, p99, max float64
	turns, truncates    int
	busy                int
	left                int64
	dead                int64
}

func (r rotateResult) String() string {
	return fmt.Sprintf("publish %6.0f/s p50 %5.2f ms p99 %6.2f ms max %7.2f ms; turns %d, truncates %d, truncates refused (locked) %d; rows at the end %d, dead tuples %d",
		r.rate, r.p50, r.p99, r.max, r.turns, r.truncates, r.busy, r.left, r.dead)
}

// rotate runs writers, readers and (if turn) the rotator on a fresh ring
// for dur, then drains what is left and checks every row was delivered
// once.
func rotate(ctx context.Context, pool *pgxpool.Pool, batch int, dur, hold, every time.Duration, writers int, turn bool) rotateResult {
	s := schema(ctx, pool)
	defer func() { _ = exec(context.Background(), pool, "DROP SCHEMA "+s+" CASCADE") }()
	r := &reader{pool: pool, schema: s, batch: batch, hold: hold, seen: &sync.Map{}, dup: &atomic.Int64{}, got: &atomic.Int64{}}
	runCtx, stop := context.WithTimeout(ctx, dur)
	defer stop()
	var published atomic.Int64
	lat := make([][]time.Duration, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for runCtx.Err() == nil {
				t := time.Now()
				// Not cancelled mid-statement: every row counted is
				// one committed.
				_, err := pool.Exec(ctx, `INSERT INTO `+s+`.log (queue, payload, lane) VALUES ($1, '\x7b7d', (random() * 3)::int)`, queue)
				if err != nil {
					log.Fatalf("publish: %v", err)
				}
				lat[w] = append(lat[w], time.Since(t))
				published.Add(1)
			}
		})
	}
	for range lanes {
		wg.Go(func() {
			for runCtx.Err() == nil {
				n, err := r.claim(runCtx)
				if err != nil && runCtx.Err() == nil {
					log.Fatalf("claim: %v", err)
				}
				if n == 0 {
					time.Sleep(2 * time.Millisecond)
				}
			}
		})
	}
	var res rotateResult
	if turn {
		wg.Go(func() {
			t := time.NewTicker(every)
			defer t.Stop()
			for {
				select {
				case <-runCtx.Done():
					return
				case <-t.C:
				}
				turned, truncated, busy, err := rotateOnce(runCtx, pool, s)
				if err != nil && runCtx.Err() == nil {
					log.Fatalf("rotate: %v", err)
				}
				res.turns += turned
				res.truncates += truncated
				res.busy += busy
			}
		})
	}
	wg.Wait()
	// Drain what is left.
	for r.got.Load() < published.Load() {
		if _, err := r.claim(ctx); err != nil {
			log.Fatalf("claim: %v", err)
		}
	}
	if r.got.Load() != published.Load() || r.dup.Load() != 0 {
		log.Fatalf("rotate: delivered %d of %d, %d twice", r.got.Load(), published.Load(), r.dup.Load())
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	res.rate = float64(published.Load()) / dur.Seconds()
	res.p50, res.p99, res.max = ms(all[len(all)/2]), ms(all[len(all)*99/100]), ms(all[len(all)-1])
	must(pool.QueryRow(ctx, `SELECT count(*) FROM `+s+`.log`).Scan(&res.left))
	must(pool.QueryRow(ctx, `SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE schemaname = $1`, s).Scan(&res.dead))
	return res
}

// rotateOnce turns the ring when the next partition is empty (truncated),
// and truncates, without waiting for a lock, every partition that every
// lane's progress is past.
func rotateOnce(ctx context.Context, pool *pgxpool.Pool, s string) (turned, truncated, busy int, err error) {
	var cur, next int16
	if err := pool.QueryRow(ctx, `SELECT last_value::smallint FROM `+s+`.slot_seq`).Scan(&cur); err != nil {
		return 0, 0, 0, err
	}
	next = (cur + 1) % ring
	var empty bool
	if err := pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT FROM `+s+`.log_p`+strconv.Itoa(int(next))+`)`).Scan(&empty); err != nil {
		return 0, 0, 0, err
	}
	if empty {
		// The next partition is marked as written before any writer
		// can write into it, so that no reader leaves it out; then the
		// turn; then below which txid the old partition is done being
		// written: every writer that read the old slot had its xid by
		// then.
		if _, err := pool.Exec(ctx, `UPDATE `+s+`.turns SET done_below = NULL WHERE slot = $1`, next); err != nil {
			return 0, 0, 0, err
		}
		if _, err := pool.Exec(ctx, `SELECT nextval('`+s+`.slot_seq')`); err != nil {
			return 0, 0, 0, err
		}
		if _, err := pool.Exec(ctx, `UPDATE `+s+`.turns SET done_below = pg_snapshot_xmax(pg_current_snapshot()) WHERE slot = $1`, cur); err != nil {
			return 0, 0, 0, err
		}
		turned = 1
	}
	// Partitions every lane is past.
	rows, err := pool.Query(ctx, `SELECT t.slot FROM `+s+`.turns AS t
		WHERE t.done_below IS NOT NULL AND t.done_below <= (
			SELECT min(pg_snapshot_xmin(p.snap)) FROM (SELECT DISTINCT ON (lane) snap FROM `+s+`.progress
			WHERE queue = $1 ORDER BY lane, seq DESC) AS p)`, queue)
	if err != nil {
		return 0, 0, 0, err
	}
	done, err := pgx.CollectRows(rows, pgx.RowTo[int16])
	if err != nil {
		return 0, 0, 0, err
	}
	for _, p := range done {
		did, locked, err := truncate(ctx, pool, s+".log_p"+strconv.Itoa(int(p)))
		if err != nil {
			return 0, 0, 0, err
		}
		if did {
			truncated++
		}
		if locked {
			busy++
		}
	}
	return turned, truncated, busy, nil
}

// truncate empties the partition part unless it is empty already; locked
// says it was not tried because a transaction holds a lock on it.
func truncate(ctx context.Context, pool *pgxpool.Pool, part string) (did, locked bool, err error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return false, false, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(ctx, `LOCK TABLE `+part+` IN ACCESS EXCLUSIVE MODE NOWAIT`)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		return false, true, nil
	} else if err != nil {
		return false, false, err
	}
	var rows bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+part+`)`).Scan(&rows); err != nil {
		return false, false, err
	}
	if rows {
		if _, err := tx.Exec(ctx, `TRUNCATE `+part); err != nil {
			return false, false, err
		}
	}
	return rows, false, tx.Commit(ctx)
}
