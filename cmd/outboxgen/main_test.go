package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type result struct {
	code           int
	stdout, stderr string
}

func runCLI(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(t.Context(), args, &out, &errOut, func(k string) string { return env[k] })
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

func TestMigrateUpDownUp(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	env := map[string]string{"DATABASE_URL": pgtest.URL(t)}
	tables := func() []string {
		rows, err := d.Pool.Query(t.Context(),
			"SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY 1", d.Schema)
		if err != nil {
			t.Fatal(err)
		}
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	for _, step := range []struct {
		action string
		want   []string
	}{
		{"up", []string{"events", "events_dlq", "events_goose_version"}},
		{"down", []string{"events_goose_version"}},
		{"up", []string{"events", "events_dlq", "events_goose_version"}},
		{"down-to 1", []string{"events", "events_goose_version"}},
		{"reset", []string{"events_goose_version"}},
		{"up", []string{"events", "events_dlq", "events_goose_version"}},
	} {
		args := append([]string{"migrate", "-schema", d.Schema, "-table", "events"}, strings.Fields(step.action)...)
		r := runCLI(t, env, args...)
		if r.code != 0 {
			t.Fatalf("migrate %s: exit %d: %s", step.action, r.code, r.stderr)
		}
		if diff := cmp.Diff(step.want, tables()); diff != "" {
			t.Errorf("tables after %s (-want +got):\n%s", step.action, diff)
		}
	}
	r := runCLI(t, env, "migrate", "-schema", d.Schema, "-table", "events", "status")
	if r.code != 0 || strings.Count(r.stdout, "pending") != 0 || strings.Count(r.stdout, ".sql") != 4 {
		t.Errorf("status: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

func TestCLIErrors(t *testing.T) {
	t.Parallel()
	dead := map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"}
	tests := []struct {
		name string
		env  map[string]string
		args []string
		code int
		msg  string
	}{
		{"no command", nil, nil, 2, "no command given"},
		{"unknown command", nil, []string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{"unknown flag", nil, []string{"migrate", "-bogus", "up"}, 2, "flag provided but not defined: -bogus"},
		{"no action", nil, []string{"migrate"}, 2, "want one of up, down, down-to N, reset, status"},
		{"down-to without a version", nil, []string{"migrate", "down-to"}, 2, "want one version number"},
		{"down-to a bad version", nil, []string{"migrate", "down-to", "x"}, 2, `version "x" is not a number`},
		{"extra arguments", nil, []string{"migrate", "up", "now"}, 2, "unexpected arguments"},
		{"unknown action", nil, []string{"migrate", "sideways"}, 2, `unknown action "sideways"`},
		{"no database", nil, []string{"migrate", "up"}, 2, "set DATABASE_URL or pass -dsn"},
		{"bad table", dead, []string{"migrate", "-table", "Bad", "up"}, 2, `Config.Table "Bad"`},
		{"unreachable database", dead, []string{"migrate", "up"}, 1, "outbox: migrate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, tt.env, tt.args...)
			if r.code != tt.code || !strings.Contains(r.stderr, tt.msg) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", r.code, r.stderr, tt.code, tt.msg)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"migrate", "migrations", "inspect", "dlq", "bind"} {
		r := runCLI(t, nil, cmd, "-h")
		if r.code != 0 || !strings.Contains(r.stderr, "Example") {
			t.Errorf("%s -h: exit %d, %q", cmd, r.code, r.stderr)
		}
	}
	r := runCLI(t, nil, "help")
	for _, cmd := range []string{"migrate", "migrations", "inspect", "dlq", "bind"} {
		if !strings.Contains(r.stdout, "  "+cmd) {
			t.Errorf("help does not list %s:\n%s", cmd, r.stdout)
		}
	}
}
