package outbox

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/naming"
	"github.com/outboxgen/outboxgen/internal/pgtest"
)

// unreachablePool is a pool that fails any query: New must not need one.
func unreachablePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// unreachablePoolOf is unreachablePool with maxConns connections.
func unreachablePoolOf(t *testing.T, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig("postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func TestNewRejectsBadNames(t *testing.T) {
	t.Parallel()
	pool := unreachablePool(t)
	long := strings.Repeat("t", 50) // 50 + len("_goose_version") = 64
	tests := []struct {
		name string
		cfg  Config
		want ConfigError
	}{
		{"table 64 bytes", Config{Table: strings.Repeat("t", 64)},
			ConfigError{Field: "Config.Table", Value: strings.Repeat("t", 64), Rule: "is 64 bytes; PostgreSQL identifiers are at most 63"}},
		{"derived name over 63", Config{Table: long},
			ConfigError{Field: "Config.Table", Value: long, Rule: `derived name "` + long + `_goose_version" is 64 bytes; PostgreSQL identifiers are at most 63`}},
		{"channel over 63", Config{Schema: strings.Repeat("s", 25), Table: strings.Repeat("t", 25)},
			ConfigError{Field: "Config.Table", Value: strings.Repeat("t", 25),
				Rule: `derived name "outbox_` + strings.Repeat("s", 25) + "." + strings.Repeat("t", 25) + `_scheduled" is 68 bytes; PostgreSQL identifiers are at most 63`}},
		{"injection", Config{Table: `outbox"; drop table x; --`},
			ConfigError{Field: "Config.Table", Value: `outbox"; drop table x; --`, Rule: "must be lower-case letters, digits and underscores, not starting with a digit"}},
		{"upper case", Config{Table: "Outbox"},
			ConfigError{Field: "Config.Table", Value: "Outbox", Rule: "must be lower-case letters, digits and underscores, not starting with a digit"}},
		{"leading digit", Config{Schema: "1s"},
			ConfigError{Field: "Config.Schema", Value: "1s", Rule: "must be lower-case letters, digits and underscores, not starting with a digit"}},
		{"dot in schema", Config{Schema: "a.b"},
			ConfigError{Field: "Config.Schema", Value: "a.b", Rule: "must be lower-case letters, digits and underscores, not starting with a digit"}},
		{"reserved schema", Config{Schema: "select"},
			ConfigError{Field: "Config.Schema", Value: "select", Rule: "must not be an SQL reserved word"}},
		{"system schema", Config{Schema: "pg_catalog"},
			ConfigError{Field: "Config.Schema", Value: "pg_catalog", Rule: `must not start with "pg_" (reserved by PostgreSQL)`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ob, err := New(pool, &tt.cfg)
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("New(%+v) = %v, %v; want a *ConfigError", tt.cfg, ob, err)
			}
			if diff := cmp.Diff(tt.want, *ce); diff != "" {
				t.Errorf("ConfigError (-want +got):\n%s", diff)
			}
			if !strings.Contains(err.Error(), tt.want.Field) {
				t.Errorf("message %q does not name the field", err)
			}
		})
	}
	if _, err := New(nil, nil); err == nil {
		t.Error("New(nil pool) succeeded")
	}
}

func TestNewDefaultsAndDoesNotTouchTheDatabase(t *testing.T) {
	t.Parallel()
	ob, err := New(unreachablePool(t), nil)
	if err != nil {
		t.Fatalf("New with defaults against an unreachable database: %v", err)
	}
	got := []string{ob.Schema(), ob.Table(), ob.DeadLetterTable(), ob.Channel()}
	if diff := cmp.Diff([]string{"public", "outbox", "outbox_dlq", "outbox_outbox"}, got); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
	ob, err = New(unreachablePool(t), &Config{Schema: "billing", Table: "events"})
	if err != nil {
		t.Fatal(err)
	}
	if ob.Channel() != "outbox_billing.events" || ob.ScheduledChannel() != "outbox_billing.events:scheduled" {
		t.Errorf("Channel() = %q, ScheduledChannel() = %q", ob.Channel(), ob.ScheduledChannel())
	}
}

func TestReservedWordsMatchPostgreSQL(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	rows, err := d.Pool.Query(t.Context(), "SELECT word FROM pg_get_keywords() WHERE catcode IN ('R', 'T') ORDER BY word")
	if err != nil {
		t.Fatal(err)
	}
	want, err := pgx.CollectRows(rows, pgx.RowTo[string]) // the server's words
	if err != nil {
		t.Fatal(err)
	}
	// Ours may list words of newer servers (system_user arrived in 16).
	var missing []string
	for _, w := range want {
		if !slices.Contains(reservedWords, w) {
			missing = append(missing, w)
		}
	}
	if len(missing) > 0 {
		t.Errorf("reservedWords lacks this server's reserved key words %v", missing)
	}
}

func TestRenderRejectsUnknownMarkers(t *testing.T) {
	t.Parallel()
	n := naming.Names{Schema: "s", Table: "t"}
	for _, sql := range []string{"SELECT 1 FROM /*outbox:bogus*/outbox", "SELECT 1 FROM /*outbox:table*/events", "SELECT /*outbox:channel*/'events'"} {
		if _, _, err := n.Render(sql); err == nil {
			t.Errorf("render(%q) succeeded", sql)
		}
	}
	got, _, err := n.Render(`SELECT 1 FROM /*outbox:table*/outbox_dlq AS d, /*outbox:name*/outbox_pkey, /*outbox:schema*/public, /*outbox:channel*/'outbox_outbox', /*outbox:channel*/'outbox_outbox_x', /*outbox:listen*/outbox_outbox_x`)
	if err != nil {
		t.Fatal(err)
	}
	want := `SELECT 1 FROM "s"."t_dlq" AS d, "t_pkey", "s", 'outbox_s.t', 'outbox_s.t_x', "outbox_s.t_x"`
	if got != want {
		t.Errorf("render = %s\nwant     %s", got, want)
	}
}
