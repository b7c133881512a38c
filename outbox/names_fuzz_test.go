package outbox

import (
	"errors"
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"io/fs"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen"
	"github.com/outboxgen/outboxgen/internal/naming"
)

// sqlSource is one SQL text the library renders: an embedded migration or
// a query sqlc generated.
type sqlSource struct{ name, text string }

// renderedSQL returns every text naming.render sees: the embedded
// migrations and the query constants of package db, read from its source
// (sqlc keeps them unexported).
func renderedSQL(tb testing.TB) []sqlSource {
	tb.Helper()
	var out []sqlSource
	files, err := fs.Glob(outboxgen.Migrations, path.Join(outboxgen.MigrationsDir, "*.sql"))
	if err != nil || len(files) == 0 {
		tb.Fatalf("embedded migrations: %v, %d files", err, len(files))
	}
	for _, f := range files {
		b, err := fs.ReadFile(outboxgen.Migrations, f)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, sqlSource{f, string(b)})
	}
	gofiles, err := filepath.Glob(filepath.Join("..", "db", "*.sql.go"))
	if err != nil || len(gofiles) == 0 {
		tb.Fatalf("db sources: %v, %d files", err, len(gofiles))
	}
	fset := gotoken.NewFileSet()
	queries := 0
	for _, f := range gofiles {
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			tb.Fatal(err)
		}
		for _, d := range file.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != gotoken.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, v := range vs.Values {
					lit, ok := v.(*ast.BasicLit)
					if !ok || lit.Kind != gotoken.STRING {
						continue
					}
					text, err := strconv.Unquote(lit.Value)
					if err != nil {
						tb.Fatal(err)
					}
					out = append(out, sqlSource{filepath.Base(f) + ":" + vs.Names[i].Name, text})
					queries++
				}
			}
		}
	}
	if queries == 0 {
		tb.Fatal("found no queries in package db")
	}
	return out
}

// validNameRE is the documented rule for Config.Schema and Config.Table.
var validNameRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// FuzzConfigNames checks the identifier rules and the SQL rendered for
// every name they accept: a name is either rejected with a *ConfigError
// naming its field and value, or every embedded migration and query
// renders with each marker replaced by a quoted identifier or literal for
// exactly that outbox, no marker left and no identifier over 63 bytes.
func FuzzConfigNames(f *testing.F) {
	for _, s := range [][2]string{
		{"", ""}, {"public", "outbox"}, {"billing", "events"}, {"_", "_"}, {"a1", "b_2"},
		{"select", "t"}, {"s", "select"}, {"pg_catalog", "t"}, {"s", "pg_t"}, {"1s", "t"}, {"s", "1t"},
		{"Billing", "t"}, {"a.b", "t"}, {"s", "t-1"}, {"s", `outbox"; drop table x; --`}, {"s", "t\x00"},
		{"s", "é"}, {"s", "\xff"}, {"s", " t"}, {strings.Repeat("s", 63), "t"}, {strings.Repeat("s", 64), "t"},
		{"public", strings.Repeat("t", 49)}, {"public", strings.Repeat("t", 50)},
		{strings.Repeat("s", 25), strings.Repeat("t", 25)}, {"s", "outbox_dlq"},
	} {
		f.Add(s[0], s[1])
	}
	sources := renderedSQL(f)
	f.Fuzz(func(t *testing.T, schema, table string) {
		cfg := (&Config{Schema: schema, Table: table}).withDefaults()
		_, err := Migrations(&Config{Schema: schema, Table: table})
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("Migrations(%q, %q) = %v (%T); want a *ConfigError", schema, table, err, err)
			}
			switch {
			case ce.Field == "Config.Schema" && ce.Value == cfg.Schema, ce.Field == "Config.Table" && ce.Value == cfg.Table:
			default:
				t.Fatalf("Migrations(%q, %q): %#v does not name the field and value", schema, table, ce)
			}
			if ce.Rule == "" || !strings.Contains(err.Error(), ce.Field) {
				t.Fatalf("Migrations(%q, %q): %q does not say the field and rule", schema, table, err)
			}
			return
		}
		for _, v := range []string{cfg.Schema, cfg.Table} {
			if !validNameRE.MatchString(v) || strings.HasPrefix(v, "pg_") {
				t.Fatalf("Migrations(%q, %q) accepted %q, which breaks the documented rule", schema, table, v)
			}
		}
		n := naming.Names{Schema: cfg.Schema, Table: cfg.Table}
		for _, src := range sources {
			out, idents, err := n.Render(src.text)
			if err != nil {
				t.Fatalf("render %s for %s.%s: %v", src.name, n.Schema, n.Table, err)
			}
			for _, id := range idents {
				if len(id) > naming.MaxIdentifierBytes {
					t.Errorf("%s for %s.%s derives %q, %d bytes, which Migrations accepted", src.name, n.Schema, n.Table, id, len(id))
				}
			}
			if err := checkRendered(n, src.text, out); err != nil {
				t.Fatalf("%s for %s.%s: %v", src.name, n.Schema, n.Table, err)
			}
		}
	})
}

// checkRendered compares out, src rendered for n, with what each marker
// must become, worked out independently of render: the text between
// markers is unchanged, and each marker and its token became the quoted
// identifier or literal of n's object.
func checkRendered(n naming.Names, src, out string) error {
	if i := strings.Index(out, "/*outbox:"); i >= 0 {
		return errors.New("marker left at " + strconv.Quote(excerpt(out, i)))
	}
	qi := func(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
	ql := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	channel := "outbox_" + n.Schema + "." + n.Table
	if n.Schema == "public" {
		channel = "outbox_" + n.Table
	}
	var want strings.Builder
	last := 0
	for _, m := range naming.Marker.FindAllStringSubmatchIndex(src, -1) {
		want.WriteString(src[last:m[0]])
		last = m[1]
		kind, tok := src[m[2]:m[3]], src[m[4]:m[5]]
		bare := strings.Trim(tok, `'"`)
		suffix, _ := strings.CutPrefix(bare, "outbox")
		switch kind {
		case "schema":
			want.WriteString(qi(n.Schema))
		case "table":
			want.WriteString(qi(n.Schema) + "." + qi(n.Table+suffix))
		case "name":
			want.WriteString(qi(n.Table + suffix))
		case "literal":
			want.WriteString(ql(qi(n.Schema) + "." + qi(n.Table+suffix)))
		case "channel":
			want.WriteString(ql(channel + strings.TrimPrefix(bare, "outbox_outbox")))
		case "listen":
			want.WriteString(qi(channel + strings.TrimPrefix(bare, "outbox_outbox")))
		default:
			return errors.New("unknown marker " + src[m[0]:m[1]])
		}
	}
	want.WriteString(src[last:])
	if w := want.String(); w != out {
		i := 0
		for i < len(w) && i < len(out) && w[i] == out[i] {
			i++
		}
		return errors.New("rendered " + strconv.Quote(excerpt(out, i)) + ", want " + strconv.Quote(excerpt(w, i)))
	}
	return nil
}

func excerpt(s string, i int) string {
	lo, hi := max(0, i-40), min(len(s), i+40)
	return s[lo:hi]
}

// TestSQLNamesOutboxObjectsOnlyThroughMarkers checks the SQL the library
// renders: outside comments and string literals, no identifier of the
// default outbox (outbox, outbox_dlq, ...) is written without a marker,
// where rendering could not reach it.
func TestSQLNamesOutboxObjectsOnlyThroughMarkers(t *testing.T) {
	t.Parallel()
	for _, src := range renderedSQL(t) {
		text := naming.Marker.ReplaceAllString(src.text, " ")
		for _, w := range sqlWords(text) {
			if w == "outbox" || strings.HasPrefix(w, "outbox_") {
				t.Errorf("%s names %q without a marker", src.name, w)
			}
		}
	}
}

// sqlWords returns the unquoted words of SQL text, skipping comments,
// string literals and quoted identifiers; dollar quotes are skipped as
// delimiters, so function bodies count as SQL.
func sqlWords(s string) []string {
	var words []string
	for i := 0; i < len(s); {
		switch c := s[i]; {
		case strings.HasPrefix(s[i:], "--"):
			j := strings.IndexByte(s[i:], '\n')
			if j < 0 {
				return words
			}
			i += j
		case strings.HasPrefix(s[i:], "/*"):
			depth := 0
			for i < len(s) {
				if strings.HasPrefix(s[i:], "/*") {
					depth++
					i += 2
				} else if strings.HasPrefix(s[i:], "*/") {
					depth--
					i += 2
					if depth == 0 {
						break
					}
				} else {
					i++
				}
			}
		case c == '\'' || c == '"':
			i++
			for i < len(s) {
				if s[i] == c {
					if i+1 < len(s) && s[i+1] == c {
						i += 2
						continue
					}
					break
				}
				i++
			}
			i++
		case c == '$':
			j := i + 1
			for j < len(s) && (s[j] == '_' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= 'A' && s[j] <= 'Z') {
				j++
			}
			if j < len(s) && s[j] == '$' {
				j++
			}
			i = j
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			j := i
			for j < len(s) && (s[j] == '_' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= 'A' && s[j] <= 'Z' || s[j] >= '0' && s[j] <= '9') {
				j++
			}
			words = append(words, strings.ToLower(s[i:j]))
			i = j
		default:
			i++
		}
	}
	return words
}
