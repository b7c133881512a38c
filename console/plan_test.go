package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// statement is one statement a connection ran.
type statement struct {
	SQL  string
	Args []any
	// Settings are the set_config statements its transaction ran before
	// it, which its plan depends on.
	Settings []statement
	Err      error
}

// queryRecorder records every statement a pool's connections run, with
// the set_config statements of the transaction each ran in.
type queryRecorder struct {
	mu    sync.Mutex
	stmts []statement
	// tx is, per connection in a transaction, the set_config statements
	// it ran so far.
	tx map[*pgx.Conn][]statement
}

type recordedKey struct{}

func (r *queryRecorder) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tx == nil {
		r.tx = map[*pgx.Conn][]statement{}
	}
	s := statement{SQL: data.SQL, Args: append([]any(nil), data.Args...)}
	settings, inTx := r.tx[conn]
	switch kind := kindOf(s.SQL); {
	case kind == "begin":
		r.tx[conn] = []statement{}
	case kind == "commit" || kind == "rollback":
		delete(r.tx, conn)
	case kind == "set_config" && inTx:
		r.tx[conn] = append(settings, s)
	default:
		s.Settings = append([]statement(nil), settings...)
	}
	r.stmts = append(r.stmts, s)
	return context.WithValue(ctx, recordedKey{}, len(r.stmts)-1)
}

func (r *queryRecorder) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i, ok := ctx.Value(recordedKey{}).(int); ok && data.Err != nil {
		r.stmts[i].Err = data.Err
	}
}

func (r *queryRecorder) statements() []statement {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]statement(nil), r.stmts...)
}

var (
	leadingComments = regexp.MustCompile(`^(\s*(--[^\n]*\n|/\*.*?\*/))*\s*`)
	firstWord       = regexp.MustCompile(`^[A-Za-z_]+`)
	setConfigOnly   = regexp.MustCompile(`(?is)^select\s+set_config\(`)
	// quotedSchema is the first schema-qualified name's schema, quoted.
	quotedSchema = regexp.MustCompile(`"(?:[^"]|"")+"\.`)
)

// kindOf classifies a statement by its first word: begin, commit,
// rollback (transaction control), set_config (a SELECT of set_config
// calls), listen (a utility statement that has no plan), or the word
// itself, lowercased.
func kindOf(sql string) string {
	body := leadingComments.ReplaceAllString(sql, "")
	word := strings.ToLower(firstWord.FindString(body))
	switch {
	case word == "begin" || word == "start":
		return "begin"
	case word == "commit" || word == "end":
		return "commit"
	case word == "rollback" || word == "abort":
		return "rollback"
	case word == "select" && setConfigOnly.MatchString(body):
		return "set_config"
	case word == "listen" || word == "unlisten":
		return "listen"
	}
	return word
}

// outboxTables are the tables a plan must not read whole.
var outboxTables = map[string]bool{"outbox": true, "outbox_dlq": true}

// seqScans returns the relations of the plan's sequential scans of the
// outbox or its dead-letter table.
func seqScans(node any) []string {
	var out []string
	switch n := node.(type) {
	case map[string]any:
		if n["Node Type"] == "Seq Scan" {
			if rel, _ := n["Relation Name"].(string); outboxTables[rel] {
				out = append(out, rel)
			}
		}
		for _, v := range n {
			out = append(out, seqScans(v)...)
		}
	case []any:
		for _, v := range n {
			out = append(out, seqScans(v)...)
		}
	}
	return out
}

// scansOf lists the plan's scans of the outbox and dead-letter tables, as
// "Index Only Scan using outbox_pending_idx".
func scansOf(node any) []string {
	var out []string
	switch n := node.(type) {
	case map[string]any:
		if rel, _ := n["Relation Name"].(string); outboxTables[rel] {
			s := fmt.Sprint(n["Node Type"])
			if idx, ok := n["Index Name"].(string); ok {
				s += " using " + idx
			} else {
				s += " on " + rel
			}
			out = append(out, s)
		}
		for _, v := range n {
			out = append(out, scansOf(v)...)
		}
	case []any:
		for _, v := range n {
			out = append(out, scansOf(v)...)
		}
	}
	return out
}

// explain returns stmt's plan as format gives it (JSON or TEXT), planned
// with its arguments under the settings of its transaction, in a
// transaction that is rolled back.
func explain(ctx context.Context, pool *pgxpool.Pool, stmt statement, format string) (string, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, s := range stmt.Settings {
		if _, err := tx.Exec(ctx, s.SQL, s.Args...); err != nil {
			return "", fmt.Errorf("replay %q: %w", s.SQL, err)
		}
	}
	rows, err := tx.Query(ctx, "EXPLAIN (FORMAT "+format+") "+stmt.SQL, stmt.Args...)
	if err != nil {
		return "", err
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return strings.Join(lines, "\n"), err
}

// decode parses a plan in JSON.
func decode(t *testing.T, plan string) any {
	t.Helper()
	var tree any
	if err := json.Unmarshal([]byte(plan), &tree); err != nil {
		t.Fatalf("the plan is not JSON: %v\n%s", err, plan)
	}
	return tree
}

// nameOf names a statement by its sqlc name, or its first line.
func nameOf(sql string) string {
	if m := regexp.MustCompile(`-- name: (\w+)`).FindStringSubmatch(sql); m != nil {
		return m[1]
	}
	line, _, _ := strings.Cut(strings.TrimSpace(sql), "\n")
	return line
}

// Every query the console runs is index-bounded: on an outbox of
// 1,000,000 rows and 100,000 dead letters, the plan of every statement
// that loading each page (with realistic parameters) runs reads neither
// table sequentially. Each statement is planned with the arguments it ran
// with, and one that ran in a transaction after set_config calls under
// the same settings.
func TestConsoleQueriesAreIndexBounded(t *testing.T) {
	t.Parallel()
	start := time.Now()
	ctx := context.Background()
	fx := newFixture(t)

	rec := &queryRecorder{}
	cfg, err := pgxpool.ParseConfig(fx.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	h, err := New(Config{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	pages := fx.pages(t, h)
	for _, p := range pages {
		get(t, h, p.URL, p.Want)
	}
	// The check sees a sequential scan where there is one: a count
	// that reads every payload, which no index holds (PostgreSQL 17
	// drops "IS NOT NULL" of a NOT NULL column, and then counts with
	// any index, all-visible pages needing no heap read).
	whole := statement{SQL: "SELECT count(*) FROM outbox WHERE octet_length(payload) > 1"}
	if plan, err := explain(ctx, fx.db.Pool, whole, "JSON"); err != nil {
		t.Fatal(err)
	} else if rels := seqScans(decode(t, plan)); len(rels) == 0 {
		t.Fatalf("no sequential scan found in the plan of %s:\n%s", whole.SQL, plan)
	}

	stmts := rec.statements()
	if len(stmts) < len(pages) {
		t.Fatalf("recorded %d statements for %d pages: the tracer does not capture them", len(stmts), len(pages))
	}

	// Each distinct statement is explained once, with its arguments and
	// settings. The overview reads every outbox of the database, other
	// tests' small ones included: a statement it ran on another outbox is
	// the same statement as the one it ran on the fixture's, with the
	// other schema's name in place of the fixture's, and only the
	// fixture's tables have the rows that make a sequential scan costly.
	// Such a statement is explained only when the fixture's outbox ran
	// none of its shape.
	type key struct{ sql, args, settings string }
	keyOf := func(s statement) key {
		args, _ := json.Marshal(s.Args)
		settings, _ := json.Marshal(s.Settings)
		return key{s.SQL, string(args), string(settings)}
	}
	own := pgx.Identifier{fx.db.Schema}.Sanitize()
	// schemaOf is the quoted schema, with its dot, of the first
	// schema-qualified name in a statement or else in its arguments.
	schemaOf := func(k key) string {
		if m := quotedSchema.FindString(k.sql); m != "" {
			return m
		}
		return quotedSchema.FindString(strings.ReplaceAll(k.args, `\"`, `"`))
	}
	seen := map[key]bool{}
	var explained, skipped, elsewhere int
	var others []statement
	check := func(s statement, k key) {
		plan, err := explain(ctx, fx.db.Pool, s, "JSON")
		if err != nil {
			// Another outbox may be gone by now.
			if !strings.Contains(s.SQL+k.args, fx.db.Schema) {
				t.Logf("%s (another outbox): EXPLAIN: %v", nameOf(s.SQL), err)
				return
			}
			t.Errorf("EXPLAIN %s %s: %v", nameOf(s.SQL), k.args, err)
			return
		}
		explained++
		tree := decode(t, plan)
		t.Logf("%s %s: %s", nameOf(s.SQL), k.args, strings.Join(scansOf(tree), ", "))
		if rels := seqScans(tree); len(rels) > 0 {
			text, _ := explain(ctx, fx.db.Pool, s, "TEXT")
			t.Errorf("%s reads %s sequentially\nsettings: %s\nargs: %s\n%s\n%s",
				nameOf(s.SQL), strings.Join(rels, ", "), k.settings, k.args, s.SQL, text)
		}
	}
	for _, s := range stmts {
		if s.Err != nil {
			if k := keyOf(s); !strings.Contains(s.SQL+k.args, fx.db.Schema) && isGone(s.Err) {
				// The pages list every outbox of the database, and
				// another test may drop its outbox, or migrate it down
				// and up again, meanwhile.
				t.Logf("%s (another outbox, gone): %v", nameOf(s.SQL), s.Err)
			} else {
				t.Errorf("%s failed: %v", nameOf(s.SQL), s.Err)
			}
		}
		switch kindOf(s.SQL) {
		case "begin", "commit", "rollback", "set_config", "listen":
			skipped++
			continue
		}
		k := keyOf(s)
		if seen[k] {
			continue
		}
		seen[k] = true
		if schema := schemaOf(k); schema != "" && schema != own+"." {
			others = append(others, s)
			continue
		}
		check(s, k)
	}
	for _, s := range others {
		k := keyOf(s)
		other := schemaOf(k)
		same := key{
			strings.ReplaceAll(k.sql, other, own+"."),
			strings.ReplaceAll(k.args, strings.ReplaceAll(other, `"`, `\"`), strings.ReplaceAll(own+".", `"`, `\"`)),
			k.settings,
		}
		if seen[same] {
			elsewhere++
			continue
		}
		check(s, k)
	}
	t.Logf("%d pages ran %d statements: %d distinct ones explained, %d on other outboxes like ones explained, "+
		"%d skipped (transaction control, set_config, LISTEN); fixture %v, whole test %v", len(pages), len(stmts), explained, elsewhere, skipped,
		fx.Took.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	if explained == 0 {
		t.Error("no statement was explained")
	}
}

// isGone reports whether err is PostgreSQL's error for a statement that
// named an object that is gone: a schema (invalid_schema_name), a table,
// a function, a column or another object (undefined_*), or one dropped
// while the statement was planned (an internal "cache lookup failed").
func isGone(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "3F000", "42P01", "42883", "42703", "42704":
		return true
	case "XX000":
		return strings.HasPrefix(pgErr.Message, "cache lookup failed")
	}
	return false
}
