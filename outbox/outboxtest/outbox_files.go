package outboxtest

import (
	"bufio"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"testing/fstest"

	"github.com/outboxgen/outboxgen/outbox"
)

// outboxFileTag begins the first line of every migration `outboxgen
// migrations` writes: "-- outboxgen: <schema>.<table> <migration>", the
// outbox it is for and the name of the library's migration it holds. The
// CLI writes it (cmd/outboxgen, fileTag); its golden files are what the
// tests of WithMigrations read.
const outboxFileTag = "-- outboxgen: "

// outboxFile is a migration `outboxgen migrations` wrote.
type outboxFile struct {
	path          string // in the directory
	schema, table string // the outbox it was rendered for
	migration     string // the library's migration, NNNNN_name.sql
}

// mapOutboxFiles returns fsys with the outbox migrations `outboxgen
// migrations` wrote into it, which name their schema and table, made to
// act on schema, the test's, instead: those of the fixture's table
// become empty migrations (the fixture's outbox, migrated to the latest
// version, stands in for them), and those of the service's other outboxes
// are rendered for schema. goose records every version, as it does in
// the service. Files it cannot map so are refused with the fix.
func mapOutboxFiles(fsys fs.FS, schema, table string) (fs.FS, error) {
	files, err := findOutboxFiles(fsys)
	if err != nil || len(files) == 0 {
		return fsys, err
	}
	schemaOf := map[string]string{} // table -> schema
	for _, f := range files {
		if s, ok := schemaOf[f.table]; ok && s != f.schema {
			return nil, fmt.Errorf("it holds the migrations `outboxgen migrations` wrote for both %s.%s and %s.%s, "+
				"which would be one table in the test's schema: test each with a fixture of its own, "+
				"giving WithMigrations a directory without the other's files",
				s, f.table, f.schema, f.table)
		}
		schemaOf[f.table] = f.schema
	}
	if _, ok := schemaOf[table]; !ok {
		if len(schemaOf) == 1 {
			f := files[0]
			return nil, fmt.Errorf("it holds the migrations `outboxgen migrations` wrote for the outbox %s.%s (%s), "+
				"not for the fixture's table %q: pass New a cfg with Table: %q", f.schema, f.table, f.path, table, f.table)
		}
		var names []string
		for t, s := range schemaOf {
			names = append(names, s+"."+t)
		}
		slices.Sort(names)
		return nil, fmt.Errorf("it holds the migrations `outboxgen migrations` wrote for the outboxes %s, "+
			"none for the fixture's table %q: pass New a cfg whose Table is the one the test uses",
			strings.Join(names, ", "), table)
	}
	rendered := map[string]fs.FS{}
	for t := range schemaOf {
		m, err := outbox.Migrations(&outbox.Config{Schema: schema, Table: t})
		if err != nil {
			return nil, fmt.Errorf("the outbox %s.%s: %w", schemaOf[t], t, err)
		}
		rendered[t] = m
	}
	over := fstest.MapFS{}
	for _, f := range files {
		text, err := fs.ReadFile(rendered[f.table], f.migration)
		if err != nil {
			return nil, fmt.Errorf("%s holds the outbox's migration %s, which this release of outboxgen does not have: "+
				"upgrade github.com/outboxgen/outboxgen to the release that wrote it", f.path, f.migration)
		}
		if f.table == table {
			text = []byte("-- +goose Up\n-- outboxtest: the fixture's outbox " + schema + "." + table +
				", migrated to the latest version, stands in for " + f.migration + ".\n")
		}
		over[f.path] = &fstest.MapFile{Data: text, Mode: 0o444}
	}
	return overlayFS{fsys, over}, nil
}

// findOutboxFiles returns the migrations at the root of fsys whose first
// line is outboxFileTag's, in name order.
func findOutboxFiles(fsys fs.FS) ([]outboxFile, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	var out []outboxFile
	for _, name := range names {
		first, err := firstLine(fsys, name)
		if err != nil {
			return nil, err
		}
		rest, ok := strings.CutPrefix(first, outboxFileTag)
		if !ok {
			continue
		}
		qualified, migration, ok1 := strings.Cut(rest, " ")
		s, t, ok2 := strings.Cut(qualified, ".")
		if !ok1 || !ok2 || s == "" || t == "" || !strings.HasSuffix(migration, ".sql") {
			return nil, fmt.Errorf("%s: first line %q is not %q<schema>.<table> <migration>: "+
				"restore the line `outboxgen migrations` wrote", name, first, outboxFileTag)
		}
		out = append(out, outboxFile{path: name, schema: s, table: t, migration: migration})
	}
	return out, nil
}

// firstLine returns the first line of the file name of fsys.
func firstLine(fsys fs.FS, name string) (string, error) {
	f, err := fsys.Open(name)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	if sc.Scan() {
		return strings.TrimRight(sc.Text(), "\r"), nil
	}
	return "", sc.Err()
}

// overlayFS is an fs.FS whose files in over replace those of the same
// names in FS; it lists what FS lists.
type overlayFS struct {
	fs.FS
	over fstest.MapFS
}

// Open opens name in over if it is there, else in FS.
func (o overlayFS) Open(name string) (fs.File, error) {
	if _, ok := o.over[name]; ok {
		return o.over.Open(name)
	}
	return o.FS.Open(name)
}
