package outbox

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/pgtest"
)

func TestMigrateUpDownUpRebuildsIdentically(t *testing.T) {
	t.Parallel()
	e := setupMigrations(t)
	first := pgtest.Catalog(t, e.db.Pool, e.db.Schema)
	if len(first) < 20 {
		t.Fatalf("catalog after Migrate has %d entries:\n%v", len(first), first)
	}

	if err := e.owner.Migrate(e.ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if err := e.owner.MigrateDown(e.ctx); err != nil {
		t.Fatalf("MigrateDown: %v", err)
	}
	// Only goose's own version table (and its sequence and key) is left.
	for _, obj := range pgtest.Catalog(t, e.db.Pool, e.db.Schema) {
		if !strings.Contains(obj, "outbox_goose_version") {
			t.Errorf("left after MigrateDown: %s", obj)
		}
	}
	st, err := e.owner.MigrationStatus(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if s.Applied {
			t.Errorf("migration %d still applied after MigrateDown", s.Version)
		}
	}

	if err := e.owner.Migrate(e.ctx); err != nil {
		t.Fatalf("Migrate after down: %v", err)
	}
	if diff := cmp.Diff(first, pgtest.Catalog(t, e.db.Pool, e.db.Schema)); diff != "" {
		t.Errorf("catalog after up, down, up (-first +again):\n%s", diff)
	}
}

func TestMigrationStatus(t *testing.T) {
	t.Parallel()
	e := setup(t)
	st, err := e.owner.MigrationStatus(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range st {
		if !s.Applied || s.AppliedAt.IsZero() {
			t.Errorf("migration %d: applied %v at %v", s.Version, s.Applied, s.AppliedAt)
		}
		got = append(got, s.Name)
	}
	want := []string{"00001_create_outbox.sql", "00002_create_outbox_dlq.sql", "00003_create_outbox_notify.sql", "00004_lease_expiry_on_row.sql", "00005_per_key_order.sql", "00006_notify_sleepers.sql", "00007_locked_claims.sql", "00008_sleep_horizon.sql", "00009_least_privilege.sql", "00010_cheaper_key_hand_over.sql", "00011_private_owner_functions.sql", "00012_scans_past_the_churn.sql", "00013_log_ring.sql", "00014_operators.sql"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("migrations (-want +got):\n%s", diff)
	}
}

func TestConcurrentMigrateOfOneOutbox(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			ob, err := New(d.Pool, &Config{Schema: d.Schema})
			if err == nil {
				err = ob.Migrate(t.Context())
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Migrate %d: %v", i, err)
		}
	}
}

func TestMigrateReportsADeadDatabase(t *testing.T) {
	t.Parallel()
	ob, err := New(unreachablePool(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(t.Context()); err == nil || !strings.Contains(err.Error(), "outbox: migrate") {
		t.Errorf("Migrate against an unreachable database: %v", err)
	}
}

// Two outboxes in two schemas, and a third sharing the first one's schema
// under another table name, never see each other's rows or notifications.
func TestOutboxesSideBySide(t *testing.T) {
	t.Parallel()
	a := setup(t)
	bdb := pgtest.New(t)
	var obs []*Outbox
	obs = append(obs, a.owner)
	for _, cfg := range []Config{{Schema: bdb.Schema, Table: "events"}, {Schema: a.db.Schema, Table: "events"}} {
		ob, err := New(a.db.Pool, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := ob.Migrate(a.ctx); err != nil {
			t.Fatalf("Migrate %+v: %v", cfg, err)
		}
		obs = append(obs, ob)
	}
	var channels []string
	for _, ob := range obs {
		channels = append(channels, ob.Channel())
		sleepOn(t, ob.queries(a.db.Pool), "shared", "sentinel")
	}
	l := listen(t, a.db.URL, channels...)

	for i, ob := range obs {
		for range i + 1 {
			if _, err := ob.queries(a.db.Pool).Publish(a.ctx, db.PublishParams{Queue: "shared", Payload: []byte{byte(i)}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := obs[0].queries(a.db.Pool).Publish(a.ctx, db.PublishParams{Queue: "sentinel", Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	wantNotes := []string{channels[0] + ":shared", channels[1] + ":shared", channels[1] + ":shared", channels[2] + ":shared", channels[2] + ":shared", channels[2] + ":shared"}
	if diff := cmp.Diff(wantNotes, l.until("sentinel")); diff != "" {
		t.Errorf("notifications (-want +got):\n%s", diff)
	}

	for i, ob := range obs {
		rows, err := ob.queries(a.db.Pool).Claim(a.ctx, db.ClaimParams{Token: newToken(), Queues: []string{"shared"}, MaxRows: 100, LeaseTtlSeconds: 60})
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != i+1 {
			t.Errorf("outbox %d claimed %d rows, want %d", i, len(rows), i+1)
		}
		for _, r := range rows {
			if r.Payload[0] != byte(i) {
				t.Errorf("outbox %d claimed a row of outbox %d", i, r.Payload[0])
			}
		}
		st, err := ob.MigrationStatus(a.ctx)
		if err != nil || len(st) != int(ob.LatestSchemaVersion()) || !st[len(st)-1].Applied {
			t.Errorf("outbox %d migration status %v, %v", i, st, err)
		}
	}
}

// MigrateDownLoss counts what a rollback would drop with the tables it
// drops, and nothing for the tables it keeps.
func TestMigrateDownLoss(t *testing.T) {
	t.Parallel()
	e := setupMigrations(t)
	e.exec(`INSERT INTO outbox (queue, payload) SELECT 'q', 'x' FROM generate_series(1, 3)`)
	e.exec(`INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason)
		VALUES (1, 'q', 'x', 1, 1, now(), 'rejected'), (2, 'q', 'x', 1, 1, now(), 'rejected')`)
	for _, c := range []struct {
		version int64
		want    RollbackLoss
	}{
		{e.ob.LatestSchemaVersion() - 1, RollbackLoss{}},
		{2, RollbackLoss{}},
		{1, RollbackLoss{DeadLetters: 2}},
		{0, RollbackLoss{Rows: 3, DeadLetters: 2}},
	} {
		got, err := e.ob.MigrateDownLoss(e.ctx, c.version)
		if diff := cmp.Diff(c.want, got); err != nil || diff != "" {
			t.Errorf("MigrateDownLoss(%d): %v (-want +got):\n%s", c.version, err, diff)
		}
	}
	var in *InputError
	if _, err := e.ob.MigrateDownLoss(e.ctx, -1); !errors.As(err, &in) {
		t.Errorf("MigrateDownLoss(-1): %v; want an *InputError", err)
	}
	// At version 1 there is no dead-letter table to count.
	if err := e.ob.MigrateDownTo(e.ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got, err := e.ob.MigrateDownLoss(e.ctx, 0); err != nil || got != (RollbackLoss{Rows: 3}) {
		t.Errorf("MigrateDownLoss(0) at version 1: %+v, %v; want 3 rows", got, err)
	}
}
