package ring_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/localpg"
	"github.com/outboxgen/outboxgen/internal/naming"
	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/internal/ring"
	"github.com/outboxgen/outboxgen/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// A ring dumped with pg_dump and restored into a cluster whose
// transaction counter is behind the one that wrote it: no snapshot there
// sees its rows until Rebase, which deletes the rows their lanes had
// consumed and has every lane read the rest; a subscriber then delivers
// each row no lane had consumed, once, keys in order.
func TestRebaseMakesARestoredRingReadable(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	for _, bin := range []string{"pg_dump", "psql"} {
		if _, err := localpg.LookBin(bin); err != nil {
			t.Skipf("no %s: %v", bin, err)
		}
	}
	target, err := localpg.StartCluster(ctx)
	if err != nil {
		t.Skipf("no cluster to restore into: %v", err)
	}
	t.Cleanup(target.Stop)
	tpool, err := pgxpool.New(ctx, target.URL+"&pool_max_conns=24")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tpool.Close)
	xid := func(p *pgxpool.Pool) (x int64) {
		t.Helper()
		if err := p.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&x); err != nil {
			t.Fatal(err)
		}
		return x
	}

	d := pgtest.New(t)
	ob, err := outbox.New(d.Pool, &outbox.Config{Schema: d.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	n := naming.Names{Schema: d.Schema, Table: ob.Table()}
	sql := func(stmt string) {
		t.Helper()
		if _, err := d.Pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	// The source's counter well ahead of the target's, whose restore
	// takes a transaction id for each of its statements: each
	// subtransaction that writes takes one.
	sql(`CREATE TABLE burn (i int)`)
	for ahead := xid(tpool) + 20_000; xid(d.Pool) < ahead; {
		sql(`DO $$ BEGIN FOR i IN 1..5000 LOOP BEGIN INSERT INTO burn VALUES (i); EXCEPTION WHEN OTHERS THEN NULL; END; END LOOP; END $$`)
	}
	// Rows the lanes consume, then rows they do not; a claim's record.
	write := func(from, to int) {
		t.Helper()
		if _, err := d.Pool.Exec(ctx, `INSERT INTO outbox_ring (queue, payload, ordering_key)
			SELECT 'q', convert_to(CASE WHEN i % 2 = 0 THEN 'k/' ELSE 'u/' END || i, 'UTF8'), CASE WHEN i % 2 = 0 THEN 'k' END
			FROM generate_series($1::int, $2::int) AS i`, from, to); err != nil {
			t.Fatal(err)
		}
	}
	write(1, 8)
	sql(`INSERT INTO outbox_ring_lanes (queue, lane) SELECT 'q', l FROM generate_series(0, 7) AS l`)
	sql(`INSERT INTO outbox_ring_progress (queue, lane, snap) SELECT 'q', l, pg_current_snapshot() FROM generate_series(0, 7) AS l`)
	write(9, 16)
	sql(`INSERT INTO outbox_ring_claims (queue, lane, after_seq, xid, snap, until)
		SELECT 'q', 0, max(seq), pg_current_xact_id(), pg_current_snapshot(), now() FROM outbox_ring_progress WHERE lane = 0`)

	dump := filepath.Join(t.TempDir(), "dump.sql")
	pgDump, _ := localpg.LookBin("pg_dump")
	psql, _ := localpg.LookBin("psql")
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.CommandContext(ctx, name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", filepath.Base(name), err, out)
		}
	}
	run(pgDump, "--no-owner", "--no-privileges", "--schema", d.Schema, "--file", dump, "--dbname", pgtest.URL(t))
	run(psql, "--quiet", "--no-psqlrc", "--set", "ON_ERROR_STOP=1", "--file", dump, "--dbname", target.URL)
	if err := os.Remove(dump); err != nil {
		t.Fatal(err)
	}

	ringTable := pgx.Identifier{d.Schema, "outbox_ring"}.Sanitize()
	visible := func() (seen int) {
		t.Helper()
		if err := tpool.QueryRow(ctx, `SELECT count(*) FROM `+ringTable+` WHERE pg_visible_in_snapshot(txid, pg_current_snapshot())`).Scan(&seen); err != nil {
			t.Fatal(err)
		}
		return seen
	}
	if v := visible(); v != 0 {
		t.Fatalf("%d restored rows visible before the rebase; want none (the target's counter is behind): the test proves nothing", v)
	}
	got, err := ring.Rebase(ctx, tpool, n)
	if err != nil {
		t.Fatalf("Rebase: %v", err)
	}
	if diff := cmp.Diff(ring.Rebased{Consumed: 8, Kept: 8}, got); diff != "" {
		t.Errorf("Rebase (-want +got):\n%s", diff)
	}
	if v := visible(); v != 8 {
		t.Errorf("%d rows visible after the rebase, want 8", v)
	}

	tob, err := outbox.New(tpool, &outbox.Config{Schema: d.Schema})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		seen []string
		all  = make(chan struct{})
	)
	sub, err := outbox.NewSubscriber(tob, []string{"q"}, func(_ context.Context, m *outbox.Message[[]byte]) error {
		mu.Lock()
		defer mu.Unlock()
		if seen = append(seen, string(m.Payload)); len(seen) == 8 {
			close(all)
		}
		return nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- sub.Run(rctx) }()
	select {
	case <-all:
	case <-time.After(time.Minute):
		t.Error("timed out waiting for the restored rows")
	}
	stop()
	if err := <-ran; err != nil {
		t.Errorf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	var keyed []string
	for _, p := range seen {
		if p[0] == 'k' {
			keyed = append(keyed, p)
		}
	}
	if diff := cmp.Diff([]string{"k/10", "k/12", "k/14", "k/16"}, keyed); diff != "" {
		t.Errorf("the key's rows in the order handled (-want +got):\n%s", diff)
	}
	slices.Sort(seen)
	if diff := cmp.Diff([]string{"k/10", "k/12", "k/14", "k/16", "u/11", "u/13", "u/15", "u/9"}, seen); diff != "" {
		t.Errorf("rows handled (-want +got):\n%s", diff)
	}
}
