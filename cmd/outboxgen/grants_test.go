package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
)

// grants prints the statements for the roles, schema and table it is
// given, as the golden files under testdata/grants hold them.
func TestGrantsGolden(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		args []string
	}{
		{"public.outbox.sql", []string{"-publisher", "app", "-subscriber", "worker"}},
		{"billing.events.sql", []string{"-schema", "billing", "-table", "events", "-publisher", "App Role", "-subscriber", `wor"ker`}},
		{"publisher-only.sql", []string{"-publisher", "app"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runCLI(t, nil, append([]string{"grants"}, c.args...)...)
			if r.code != 0 {
				t.Fatalf("exit %d: %s", r.code, r.stderr)
			}
			golden := filepath.Join("testdata", "grants", c.name)
			if *update {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, []byte(r.stdout), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(string(want), r.stdout); diff != "" {
				t.Errorf("grants differ from %s (-golden +got; make golden updates it):\n%s", golden, diff)
			}
		})
	}
}

// grants without a role, or with an argument, is a usage error.
func TestGrantsUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"grants"}, {"grants", "app"}, {"grants", "-publisher", strings.Repeat("r", 64)}} {
		if r := runCLI(t, nil, args...); r.code != 2 {
			t.Errorf("%q: exit %d, want 2: %s", args, r.code, r.stderr)
		}
	}
}

// grants -apply gives the roles their privileges on the outbox, and
// running it again changes nothing.
func TestGrantsApply(t *testing.T) {
	t.Parallel()
	d, _, env, flags := migrated(t)
	ctx := t.Context()
	pub, sub := d.Schema+"_pub", d.Schema+"_sub"
	for _, r := range []string{pub, sub} {
		if _, err := d.Pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{r}.Sanitize()+" NOLOGIN"); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, r := range []string{pub, sub} {
			if _, err := d.Pool.Exec(context.Background(), "DROP OWNED BY "+pgx.Identifier{r}.Sanitize()+"; DROP ROLE "+pgx.Identifier{r}.Sanitize()); err != nil {
				t.Errorf("drop role %s: %v", r, err)
			}
		}
	})
	privileges := func() []string {
		t.Helper()
		rows, err := d.Pool.Query(ctx, `SELECT r.rolname || ' ' || c.relname || ' ' || p.privilege
			FROM pg_class AS c
			CROSS JOIN unnest(array['SELECT', 'INSERT', 'UPDATE', 'DELETE']) AS p(privilege)
			CROSS JOIN (VALUES ($1::text), ($2::text)) AS r(rolname)
			WHERE c.relnamespace = $3::regnamespace AND c.relkind = 'r'
			  AND has_table_privilege(r.rolname, c.oid, p.privilege)
			ORDER BY 1`, pub, sub, d.Schema)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := privileges(); len(got) != 0 {
		t.Fatalf("privileges before grants: %v", got)
	}
	want := []string{
		pub + " outbox DELETE", pub + " outbox INSERT",
		sub + " outbox DELETE", sub + " outbox INSERT", sub + " outbox SELECT", sub + " outbox UPDATE",
		sub + " outbox_dlq DELETE", sub + " outbox_dlq INSERT", sub + " outbox_dlq SELECT", sub + " outbox_dlq UPDATE",
		sub + " outbox_handoff SELECT",
		sub + " outbox_locks DELETE", sub + " outbox_locks INSERT", sub + " outbox_locks SELECT", sub + " outbox_locks UPDATE",
		sub + " outbox_pauses DELETE", sub + " outbox_pauses INSERT", sub + " outbox_pauses SELECT",
		sub + " outbox_ring_acks DELETE", sub + " outbox_ring_acks INSERT", sub + " outbox_ring_acks SELECT",
		sub + " outbox_ring_claims DELETE", sub + " outbox_ring_claims INSERT", sub + " outbox_ring_claims SELECT",
		sub + " outbox_ring_lanes INSERT", sub + " outbox_ring_lanes SELECT", sub + " outbox_ring_lanes UPDATE",
		sub + " outbox_ring_progress DELETE", sub + " outbox_ring_progress INSERT", sub + " outbox_ring_progress SELECT",
		sub + " outbox_ring_turns SELECT", sub + " outbox_ring_turns UPDATE",
		sub + " outbox_sleepers DELETE", sub + " outbox_sleepers INSERT", sub + " outbox_sleepers SELECT", sub + " outbox_sleepers UPDATE",
		sub + " outbox_subscribers DELETE", sub + " outbox_subscribers INSERT", sub + " outbox_subscribers SELECT", sub + " outbox_subscribers UPDATE",
	}
	for range 2 {
		r := runCLI(t, env, append([]string{"grants", "-apply", "-publisher", pub, "-subscriber", sub}, flags...)...)
		if r.code != 0 || stripHeader(r.stdout) != "granted: 20 statements\n" {
			t.Fatalf("exit %d: %s%s", r.code, r.stdout, r.stderr)
		}
		if diff := cmp.Diff(want, privileges()); diff != "" {
			t.Errorf("privileges (-want +got):\n%s", diff)
		}
	}
}
