package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/outbox"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// dirFiles reads every file of dir.
func dirFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = string(b)
	}
	return out
}

func TestMigrationsGolden(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ schema, table string }{
		{"public", "outbox"},
		{"billing", "events"},
	} {
		name := c.schema + "." + c.table
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if r := runCLI(t, nil, "migrations", "-dir", dir, "-schema", c.schema, "-table", c.table); r.code != 0 {
				t.Fatalf("exit %d: %s", r.code, r.stderr)
			}
			golden := filepath.Join("testdata", "migrations", name)
			if *update {
				if err := os.RemoveAll(golden); err != nil {
					t.Fatal(err)
				}
				if err := os.CopyFS(golden, os.DirFS(dir)); err != nil {
					t.Fatal(err)
				}
			}
			if diff := cmp.Diff(dirFiles(t, golden), dirFiles(t, dir)); diff != "" {
				t.Errorf("migrations differ from %s (-golden +got; make golden updates it):\n%s", golden, diff)
			}
		})
	}
}

func TestMigrationsAppendsAndNeverRewrites(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// A repository with timestamped goose migrations of its own.
	mine := map[string]string{"20240101120000_users.sql": "-- +goose Up\nSELECT 1;\n", "20240102120000_seed.go": "package m\n"}
	for n, b := range mine {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	names := embeddedMigrations(t)
	lacks := fmt.Sprintf("lacks %d outbox migration(s)", len(names))
	if r := runCLI(t, nil, "migrations", "-dir", dir, "-check"); r.code != 1 || !strings.Contains(r.stderr, lacks) {
		t.Errorf("-check on a directory without them: exit %d, %q; want %q", r.code, r.stderr, lacks)
	}
	if r := runCLI(t, nil, "migrations", "-dir", dir); r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	// Numbered after the repository's highest version, in order
	// (TestMigrationsGolden pins the names).
	got := dirFiles(t, dir)
	for i, name := range names {
		want := fmt.Sprintf("%d_%s", 20240102120001+i, outboxFileName("public", "outbox", name))
		if _, ok := got[want]; !ok {
			t.Errorf("no %s among %v", want, keys(got))
		}
	}
	// A user edits an applied file; a re-run must leave it alone.
	edited := filepath.Join(dir, "20240102120002_public_outbox_create_dlq.sql")
	b, _ := os.ReadFile(edited)
	if err := os.WriteFile(edited, append(b, []byte("-- reviewed\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	before := dirFiles(t, dir)
	if r := runCLI(t, nil, "migrations", "-dir", dir); r.code != 0 || !strings.Contains(r.stdout, "up to date") {
		t.Errorf("re-run: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if diff := cmp.Diff(before, dirFiles(t, dir)); diff != "" {
		t.Errorf("re-run changed the directory:\n%s", diff)
	}
	if r := runCLI(t, nil, "migrations", "-dir", dir, "-check"); r.code != 0 {
		t.Errorf("-check on an up-to-date directory: exit %d, %q", r.code, r.stderr)
	}
	// A second outbox gets its own files after the first's.
	if r := runCLI(t, nil, "migrations", "-dir", dir, "-table", "audit"); r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if _, ok := dirFiles(t, dir)[fmt.Sprintf("%d_public_audit_create.sql", 20240102120001+len(names))]; !ok {
		t.Errorf("second outbox's files: %v", keys(dirFiles(t, dir)))
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestMigrationsBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, args := range [][]string{
		{"migrations"},
		{"migrations", "-dir", dir, "-table", "Bad-Name"},
		{"migrations", "-dir", dir, "-schema", "select"},
		{"migrations", "-dir", dir, "extra"},
	} {
		if r := runCLI(t, nil, args...); r.code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, r.code, r.stderr)
		}
	}
	if files := dirFiles(t, dir); len(files) != 0 {
		t.Errorf("bad input wrote %v", keys(files))
	}
	if r := runCLI(t, nil, "migrations", "-dir", filepath.Join(dir, "x", "\x00bad")); r.code != 1 {
		t.Errorf("unwritable -dir: exit %d (%s)", r.code, r.stderr)
	}
}

// Files written for a repository, applied by goose itself, build the same
// schema as ob.Migrate.
func TestMigrationsAppliedByGooseMatchMigrate(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	dir := t.TempDir()
	if r := runCLI(t, nil, "migrations", "-dir", dir, "-schema", d.Schema, "-table", "jobs"); r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	sqlDB := stdlib.OpenDBFromPool(d.Pool)
	defer sqlDB.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, os.DirFS(dir), goose.WithTableName(d.Schema+".repo_versions"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(t.Context()); err != nil {
		t.Fatalf("goose up: %v", err)
	}
	withoutGoose := func(lines []string) []string {
		var out []string
		for _, l := range lines {
			if !strings.Contains(l, "repo_versions") && !strings.Contains(l, "goose_version") {
				out = append(out, l)
			}
		}
		return out
	}
	byGoose := withoutGoose(pgtest.Catalog(t, d.Pool, d.Schema))
	if _, err := p.DownTo(t.Context(), 0); err != nil {
		t.Fatalf("goose down: %v", err)
	}
	ob, err := outbox.New(d.Pool, &outbox.Config{Schema: d.Schema, Table: "jobs"})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(byGoose, withoutGoose(pgtest.Catalog(t, d.Pool, d.Schema))); diff != "" {
		t.Errorf("catalog (-goose +Migrate):\n%s", diff)
	}
	if len(byGoose) < 20 {
		t.Errorf("goose built only %d objects", len(byGoose))
	}
}

// -check names every missing file by the path a run without it writes.
func TestMigrationsCheckNamesMissingFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "00007_users.sql"), []byte("-- +goose Up\nSELECT 1;\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	named := func(stderr string) []string {
		_, list, _ := strings.Cut(stderr, "would write:\n")
		var out []string
		for l := range strings.Lines(list) {
			out = append(out, strings.TrimSpace(l))
		}
		return out
	}
	wrote := func(stdout string) []string {
		var out []string
		for l := range strings.Lines(stdout) {
			out = append(out, strings.TrimPrefix(strings.TrimSpace(l), "wrote "))
		}
		return out
	}
	// The repository is at 00007: the outbox's files follow it.
	names := embeddedMigrations(t)
	var want []string
	for i, name := range names {
		want = append(want, filepath.Join(dir, fmt.Sprintf("%05d_%s", 8+i, outboxFileName("public", "outbox", name))))
	}
	r := runCLI(t, nil, "migrations", "-dir", dir, "-check")
	if diff := cmp.Diff(want, named(r.stderr)); r.code != 1 || diff != "" {
		t.Errorf("-check: exit %d, files named (-want +got):\n%s\n%s", r.code, diff, r.stderr)
	}
	r = runCLI(t, nil, "migrations", "-dir", dir)
	if diff := cmp.Diff(want, wrote(r.stdout)); r.code != 0 || diff != "" {
		t.Errorf("write: exit %d, files written (-want +got):\n%s", r.code, diff)
	}
	// One lost file comes back numbered after the rest.
	if err := os.Remove(want[1]); err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, nil, "migrations", "-dir", dir, "-check")
	want = []string{filepath.Join(dir, fmt.Sprintf("%05d_%s", 8+len(names), outboxFileName("public", "outbox", names[1])))}
	if diff := cmp.Diff(want, named(r.stderr)); r.code != 1 || diff != "" {
		t.Errorf("-check after a loss: exit %d, files named (-want +got):\n%s\n%s", r.code, diff, r.stderr)
	}
	r = runCLI(t, nil, "migrations", "-dir", dir)
	if diff := cmp.Diff(want, wrote(r.stdout)); r.code != 0 || diff != "" {
		t.Errorf("write after a loss: exit %d, files written (-want +got):\n%s", r.code, diff)
	}
}

// Files an earlier release wrote under its names (outbox_<table>_what.sql)
// stay as they are; only what the directory lacks is written, under the
// names that carry the schema and the table.
func TestMigrationsKeepNamesTheRepositoryHolds(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	names := embeddedMigrations(t)
	if r := runCLI(t, nil, "migrations", "-dir", dir, "-schema", "billing", "-table", "events"); r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	// As an earlier release named them, the last one not yet written.
	var old []string
	for i, name := range names {
		_, what, _ := strings.Cut(name, "_")
		oldName := fmt.Sprintf("%05d_outbox_events_%s", i+1, strings.TrimPrefix(what, "create_outbox_"))
		from := filepath.Join(dir, fmt.Sprintf("%05d_%s", i+1, outboxFileName("billing", "events", name)))
		if i == len(names)-1 {
			if err := os.Remove(from); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.Rename(from, filepath.Join(dir, oldName)); err != nil {
			t.Fatal(err)
		}
		old = append(old, oldName)
	}
	before := dirFiles(t, dir)
	r := runCLI(t, nil, "migrations", "-dir", dir, "-schema", "billing", "-table", "events")
	newName := fmt.Sprintf("%05d_billing_events_%s", len(names), strings.SplitN(names[len(names)-1], "_", 2)[1])
	if want := "wrote " + filepath.Join(dir, newName) + "\n"; r.code != 0 || r.stdout != want {
		t.Fatalf("exit %d, %q %s; want %q", r.code, r.stdout, r.stderr, want)
	}
	after := dirFiles(t, dir)
	for _, n := range old {
		if after[n] != before[n] || after[n] == "" {
			t.Errorf("%s changed or vanished", n)
		}
	}
	if len(after) != len(names) {
		t.Errorf("files: %v", keys(after))
	}
	if r := runCLI(t, nil, "migrations", "-dir", dir, "-schema", "billing", "-table", "events", "-check"); r.code != 0 {
		t.Errorf("-check: exit %d %s", r.code, r.stderr)
	}
}
