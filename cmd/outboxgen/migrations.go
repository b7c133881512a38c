package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/outbox"
)

const migrationsUsage = `Usage: outboxgen migrations -dir DIR [-schema S] [-table T] [-check]

Writes the outbox's goose migrations, rendered for the schema and table,
into DIR (a consuming repository's migrations directory). Each file is
numbered after the highest version already in DIR, so goose applies it
last. Re-running writes only the migrations DIR lacks and never touches a
file that is there. With -check nothing is written, and the exit status is
1 when DIR lacks any.

Example (from a go:generate line or CI):
  outboxgen migrations -dir db/migrations -schema billing -table outbox

Flags:
`

// fileTag marks a written migration: which outbox and which of its
// migrations the file holds, so a re-run recognises it whatever its number,
// and so does outboxtest.WithMigrations, which reads the same line.
const fileTag = "-- outboxgen: "

var versionRE = regexp.MustCompile(`^(\d+)_.*\.(sql|go)$`)

func migrationsCmd(_ context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fset := newFlags("migrations", migrationsUsage, stderr)
	dir := fset.String("dir", "", "directory of the repository's goose migrations (required)")
	names := nameFlags(fset)
	check := fset.Bool("check", false, "write nothing; exit 1 when -dir lacks migrations")
	pos, err := parseFlags(fset, args, "migrations")
	if err != nil {
		return err
	}
	if err := noArgs(pos, "migrations"); err != nil {
		return err
	}
	if *dir == "" {
		fset.Usage()
		return fmt.Errorf("%w: migrations: -dir is required", errUsage)
	}
	schema, table := names.resolve(getenv)
	files, err := renderedMigrations(schema, table)
	if err != nil {
		return fmt.Errorf("%w: migrations: %s", errUsage, libText(err))
	}
	missing, next, width, err := scanDir(*dir, files)
	if err != nil {
		return fmt.Errorf("migrations: -dir %s: %w", *dir, err)
	}
	// The path each missing migration is written to.
	paths := make([]string, len(missing))
	for i, name := range missing {
		paths[i] = filepath.Join(*dir, fmt.Sprintf("%0*d_%s", width, next+int64(i), outboxFileName(schema, table, name)))
	}
	if *check {
		if len(missing) > 0 {
			return fmt.Errorf("migrations: %s lacks %d outbox migration(s) for %s.%s; outboxgen migrations without -check would write:\n  %s",
				*dir, len(missing), schema, table, strings.Join(paths, "\n  "))
		}
		fmt.Fprintf(stdout, "%s has every outbox migration for %s.%s\n", *dir, schema, table)
		return nil
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return fmt.Errorf("migrations: -dir: %w", err)
	}
	for i, name := range missing {
		if err := os.WriteFile(paths[i], files[name], 0o644); err != nil {
			return fmt.Errorf("migrations: write %s: %w", paths[i], err)
		}
		fmt.Fprintf(stdout, "wrote %s\n", paths[i])
	}
	if len(missing) == 0 {
		fmt.Fprintf(stdout, "%s is up to date\n", *dir)
	}
	return nil
}

// outboxFileName names the file of migration name (NNNNN_what.sql) for
// the outbox schema.table: <schema>_<table>_what.sql, with "create_outbox"
// shortened to "create" (00001_billing_events_create.sql,
// 00002_billing_events_create_dlq.sql), so that a repository holding two
// outboxes tells their files apart by name. Files already in a
// repository keep the names they were written with (earlier releases
// wrote outbox_<table>_what.sql): a run writes only the files a directory
// lacks, and a file is known by its first line, not its name.
func outboxFileName(schema, table, name string) string {
	_, what, _ := strings.Cut(name, "_")
	if rest, ok := strings.CutPrefix(what, "create_outbox"); ok {
		what = "create" + rest
	}
	return schema + "_" + table + "_" + what
}

// renderedMigrations returns the outbox's migrations for schema and table,
// keyed by their embedded names, each tagged and, outside public, creating
// its schema first.
func renderedMigrations(schema, table string) (map[string][]byte, error) {
	fsys, err := outbox.Migrations(&outbox.Config{Schema: schema, Table: table})
	if err != nil {
		return nil, err
	}
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	out := make(map[string][]byte, len(names))
	for i, name := range names {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		text := fileTag + schema + "." + table + " " + name + "\n" + string(b)
		if i == 0 && schema != outbox.SchemaDefault {
			// A consuming repository's goose keeps its version table
			// elsewhere, so the first migration creates the schema.
			text = strings.Replace(text, "-- +goose Up\n",
				"-- +goose Up\nCREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()+";\n\n", 1)
		}
		out[name] = []byte(text)
	}
	return out, nil
}

// scanDir finds which of files dir lacks, the version to give the first
// of them, and the width of version numbers there.
func scanDir(dir string, files map[string][]byte) (missing []string, next int64, width int, err error) {
	width = 5
	present := map[string]bool{}
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, 0, 0, err
	}
	for _, e := range entries {
		m := versionRE.FindStringSubmatch(e.Name())
		if e.IsDir() || m == nil {
			continue
		}
		v, perr := strconv.ParseInt(m[1], 10, 64)
		if perr != nil {
			return nil, 0, 0, fmt.Errorf("%s: version %s: %w", e.Name(), m[1], perr)
		}
		next = max(next, v)
		width = max(width, len(m[1]))
		if m[2] != "sql" {
			continue
		}
		b, rerr := os.ReadFile(filepath.Join(dir, e.Name()))
		if rerr != nil {
			return nil, 0, 0, rerr
		}
		if first, _, _ := strings.Cut(string(b), "\n"); strings.HasPrefix(first, fileTag) {
			present[first] = true
		}
	}
	for name, b := range files {
		first, _, _ := strings.Cut(string(b), "\n")
		if !present[first] {
			missing = append(missing, name)
		}
	}
	slices.Sort(missing)
	return missing, next + 1, width, nil
}
