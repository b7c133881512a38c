package outbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgen/outboxgen/db"
)

// outsider is a login role of one test with no grant on the outbox: only
// USAGE on its schema (as every role has on public), TEMP on the
// database (PUBLIC's by default) and a schema of its own to put
// look-alike functions in. Its session is conn.
type outsider struct {
	e     *roleEnv
	name  string
	conn  *pgx.Conn
	owned string // the schema the outsider owns
	cols  string // the outbox's columns, as a table definition's
}

// newOutsider makes the test's outsider role (dropped when the test ends)
// and connects as it.
func (e *roleEnv) newOutsider() *outsider {
	t := e.t
	t.Helper()
	name, c := e.loginRole("outsider")
	ident := pgx.Identifier{name}.Sanitize()
	e.exec("CREATE SCHEMA " + ident + " AUTHORIZATION " + ident)
	// What any role can read of the outbox's columns in the catalog.
	var cols string
	if err := c.QueryRow(e.ctx, `SELECT string_agg(quote_ident(a.attname) || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
		FROM pg_attribute AS a WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped`,
		pgx.Identifier{e.db.Schema, "outbox"}.Sanitize()).Scan(&cols); err != nil {
		t.Fatal(err)
	}
	return &outsider{e: e, name: name, conn: c, owned: name, cols: cols}
}

// attachments says how each of the owner's trigger functions is attached
// to a table of the outsider's (%s), as its own trigger is to the outbox.
var attachments = map[string]string{
	"_key_insert":        "BEFORE INSERT ON %s FOR EACH ROW",
	"_key_update":        "BEFORE UPDATE ON %s FOR EACH ROW",
	"_notify":            "AFTER INSERT ON %s REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT",
	"_notify_release":    "AFTER UPDATE ON %s FOR EACH ROW",
	"_key_hand_on":       "AFTER DELETE ON %s REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT",
	"_set_sleep_horizon": "AFTER INSERT OR UPDATE OR DELETE ON %s FOR EACH STATEMENT",
	"_ring_key_insert":   "BEFORE INSERT ON %s FOR EACH ROW",
	"_ring_wake":         "AFTER INSERT ON %s FOR EACH ROW",
	"_ring_row_update":   "BEFORE UPDATE ON %s FOR EACH ROW",
}

// ownerFunctions returns the outbox's functions, as name(argument types),
// those that return trigger first.
func (e *roleEnv) ownerFunctions() (triggers, others []string) {
	e.t.Helper()
	rows, err := e.db.Pool.Query(e.ctx, `SELECT p.proname || '(' || oidvectortypes(p.proargtypes) || ')', p.prorettype = 'trigger'::regtype
		FROM pg_proc AS p WHERE p.pronamespace = $1::regnamespace ORDER BY 1`, e.db.Schema)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var fn string
		var trigger bool
		if err := rows.Scan(&fn, &trigger); err != nil {
			e.t.Fatal(err)
		}
		if trigger {
			triggers = append(triggers, fn)
		} else {
			others = append(others, fn)
		}
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return triggers, others
}

// outcome names how a step of an attack ended: "refused" when PostgreSQL
// denied it (insufficient_privilege), else what happened.
func outcome(err error) string {
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return "ran"
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		return "refused"
	case errors.As(err, &pgErr):
		return pgErr.Code + " " + pgErr.Message
	default:
		return err.Error()
	}
}

// step runs sql in a savepoint of tx, so that a refusal leaves tx usable,
// and says how it ended.
func step(ctx context.Context, tx pgx.Tx, sql string) string {
	if _, err := tx.Exec(ctx, "SAVEPOINT step"); err != nil {
		return err.Error()
	}
	_, err := tx.Exec(ctx, sql)
	if err != nil {
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT step"); rerr != nil {
			return rerr.Error()
		}
	} else if _, rerr := tx.Exec(ctx, "RELEASE SAVEPOINT step"); rerr != nil {
		return rerr.Error()
	}
	return outcome(err)
}

// attachAll attaches every trigger function of the outbox to a TEMP table
// of the outbox's columns, one table each, and fires it with a keyed row
// of queue q and key k: inserted, updated, deleted. It returns how each
// function's attachment and firing ended ("refused" when refused at
// either).
func (o *outsider) attachAll(ctx context.Context, tx pgx.Tx, fns []string) map[string]string {
	t := o.e.t
	t.Helper()
	got := make(map[string]string)
	for i, fn := range fns {
		name := strings.TrimSuffix(fn, "()")
		how, ok := attachments[strings.TrimPrefix(name, "outbox")]
		if !ok {
			t.Errorf("trigger function %s: no attachment in the attack; add one to attachments", fn)
			continue
		}
		table := fmt.Sprintf("pg_temp.lookalike_%d", i)
		if r := step(ctx, tx, "CREATE TEMP TABLE "+strings.TrimPrefix(table, "pg_temp.")+" ("+o.cols+") ON COMMIT DROP"); r != "ran" {
			t.Fatalf("a TEMP table of the outbox's columns: %s", r)
		}
		r := step(ctx, tx, "CREATE TRIGGER lookalike "+fmt.Sprintf(how, table)+" EXECUTE FUNCTION "+
			pgx.Identifier{o.e.db.Schema, name}.Sanitize()+"()")
		if r == "ran" {
			r = "attached"
			for _, sql := range []string{
				"INSERT INTO " + table + " (id, queue, payload, ordering_key, blocked) SELECT g, 'q', 'junk', 'k', false FROM generate_series(1, 100) AS g",
				"UPDATE " + table + " SET next_attempt_at = now(), acquired_token = NULL",
				"DELETE FROM " + table,
			} {
				if f := step(ctx, tx, sql); f != "ran" {
					r = f
					break
				}
			}
		}
		got[fn] = r
	}
	return got
}

// callAll calls every other function of the outbox with NULL arguments,
// and returns how each call ended.
func (o *outsider) callAll(ctx context.Context, tx pgx.Tx, fns []string) map[string]string {
	got := make(map[string]string)
	for _, fn := range fns {
		name, args, _ := strings.Cut(strings.TrimSuffix(fn, ")"), "(")
		var nulls []string
		for a := range strings.SplitSeq(args, ", ") {
			if a != "" {
				nulls = append(nulls, "NULL::"+a)
			}
		}
		got[fn] = step(ctx, tx, "SELECT "+pgx.Identifier{o.e.db.Schema, name}.Sanitize()+"("+strings.Join(nulls, ", ")+")")
	}
	return got
}

// settingsOf returns the outboxgen.* settings the outbox's migrations
// read.
func settingsOf(ob *Outbox) []string {
	re := regexp.MustCompile(`outboxgen\.[a-z_]+`)
	var out []string
	for _, f := range ob.migrations {
		out = append(out, re.FindAllString(string(f.Data), -1)...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// forgedValue is what an attack sets setting to: what the outbox's own
// functions would set for key k of queue q, or a value they never set.
func forgedValue(setting, q, k string) string {
	switch setting {
	case "outboxgen.insert_key":
		return fmt.Sprintf("%d\x1f%s\x1f%s", len(q), q, k)
	case "outboxgen.key_locks":
		return "-1000000"
	case "outboxgen.notify":
		return "off"
	}
	return "forged"
}

// forge sets every outboxgen.* setting the migrations read, for the
// session of c, to a forged value for key k of queue q.
func forge(ctx context.Context, t *testing.T, c *pgx.Conn, ob *Outbox, q, k string) {
	t.Helper()
	for _, s := range settingsOf(ob) {
		if _, err := c.Exec(ctx, "SELECT set_config($1, $2, false)", s, forgedValue(s, q, k)); err != nil {
			t.Fatalf("forge %s: %v", s, err)
		}
	}
}

// lookalikes creates, in the outsider's own schema, a function of the
// same name and arguments as every function of pg_catalog the
// migrations call that a plain function can stand in for, each raising
// when it runs as another role than the session's (as it would inside
// the owner's functions), and puts that schema first on the session's
// search_path.
func (o *outsider) lookalikes(ctx context.Context) {
	t := o.e.t
	t.Helper()
	words := map[string]bool{}
	re := regexp.MustCompile(`\b([a-z_][a-z0-9_]*)\s*\(`)
	for _, f := range o.e.ob.migrations {
		for _, m := range re.FindAllStringSubmatch(string(f.Data), -1) {
			words[m[1]] = true
		}
	}
	var names []string
	for w := range words {
		names = append(names, w)
	}
	rows, err := o.conn.Query(ctx, `SELECT p.proname, oidvectortypes(p.proargtypes), format_type(p.prorettype, NULL)
		FROM pg_proc AS p
		WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proname = ANY($1) AND p.prokind = 'f' AND NOT p.proretset
		  AND NOT EXISTS (SELECT 1 FROM unnest(p.proargtypes::oid[] || p.prorettype) AS a(t)
		                  WHERE a.t IN (SELECT oid FROM pg_type WHERE typtype = 'p' AND typname <> 'void'))`, names)
	if err != nil {
		t.Fatal(err)
	}
	type fn struct{ name, args, ret string }
	fns, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (fn, error) {
		var f fn
		err := r.Scan(&f.name, &f.args, &f.ret)
		return f, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(fns) < 10 {
		t.Fatalf("only %d look-alikes: %v", len(fns), fns)
	}
	schema := pgx.Identifier{o.owned}.Sanitize()
	for _, f := range fns {
		ret := "RETURN NULL;"
		if f.ret == "void" {
			ret = "RETURN;"
		}
		sql := fmt.Sprintf(`CREATE FUNCTION %s.%s(%s) RETURNS %s LANGUAGE plpgsql AS $f$
			BEGIN
				IF current_user <> session_user THEN
					RAISE EXCEPTION 'look-alike %s ran as %%', current_user;
				END IF;
				%s
			END $f$`, schema, pgx.Identifier{f.name}.Sanitize(), f.args, f.ret, f.name, ret)
		if _, err := o.conn.Exec(ctx, sql); err != nil {
			t.Fatalf("look-alike %s(%s): %v", f.name, f.args, err)
		}
	}
	if _, err := o.conn.Exec(ctx, "SELECT set_config('search_path', $1, false)",
		schema+", "+pgx.Identifier{o.e.db.Schema}.Sanitize()+", pg_catalog"); err != nil {
		t.Fatal(err)
	}
}

// ownerState describes what the owner's objects hold: rows of each
// table, and the sequences' values, as the test's own role reads them.
func (e *roleEnv) ownerState() []string {
	e.t.Helper()
	var out []string
	for _, table := range []string{"outbox", "outbox_dlq", "outbox_handoff", "outbox_sleepers", "outbox_locks", "outbox_sleepers_turn"} {
		out = append(out, fmt.Sprintf("%s: %d rows", table, e.count(table)))
	}
	rows, err := e.db.Pool.Query(e.ctx, `SELECT s.sequencename || ': ' || coalesce(s.last_value::text, 'unused')
		FROM pg_sequences AS s WHERE s.schemaname = $1 ORDER BY 1`, e.db.Schema)
	if err != nil {
		e.t.Fatal(err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.t.Fatal(err)
	}
	return append(out, seqs...)
}

// noWait runs op on a connection of its own as role and fails the test
// if that connection ever waits for another backend's lock while op runs
// (it then cancels op).
func (e *roleEnv) noWait(what, role string, op func(ctx context.Context, c *pgx.Conn) error) {
	t := e.t
	t.Helper()
	c, err := pgx.Connect(e.ctx, e.db.URLAs(t, role))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close(context.Background()) }()
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- op(ctx, c) }()
	pid := c.PgConn().PID()
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v", what, err)
			}
			return
		case <-time.After(5 * time.Millisecond):
		}
		var blockers []int32
		if err := e.db.Pool.QueryRow(e.ctx, "SELECT pg_blocking_pids($1)", pid).Scan(&blockers); err != nil {
			t.Fatal(err)
		}
		if len(blockers) > 0 {
			t.Errorf("%s waits for the lock of backend %v", what, blockers)
			cancel()
			<-done
			return
		}
	}
}

// A role with no grant on the outbox (only USAGE on its schema, as every
// role has on public) attacks it in one transaction: it attaches every
// trigger function of the outbox to a TEMP table of the outbox's columns
// and fires it, calls every other function, takes every advisory lock it
// can compute that the library takes (schema 8's keys, Migrate's), forges
// every outboxgen.* setting and puts look-alikes of the functions the
// outbox's functions call first on its search_path. PostgreSQL refuses
// every step but the call of <table>_schema_version(); once it commits
// nothing of the outbox changed, and while it stays open a keyed publish
// and a sleep record wait for nothing and a subscriber handles the key's
// rows in order.
func TestARoleWithoutGrantsCanNeitherStallNorStrandNorWrite(t *testing.T) {
	t.Parallel()
	e := setupRoles(t)
	ctx := e.ctx
	o := e.newOutsider()
	triggerFns, otherFns := e.ownerFunctions()
	// Settings and locks first: the look-alikes stand in for set_config
	// and the hash functions in the outsider's own statements too.
	forge(ctx, t, o.conn, e.ob, "q", "k")
	if _, err := o.conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended(q || E'\x1f' || k, hashtext($1)))
		FROM (VALUES ('q', 'k'), ('', '')) AS v(q, k)`, pgx.Identifier{e.db.Schema, "outbox"}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if _, err := o.conn.Exec(ctx, "SELECT pg_advisory_lock($1)", e.ob.naming.LockID()); err != nil {
		t.Fatal(err)
	}
	o.lookalikes(ctx)

	attack := func() (pgx.Tx, map[string]string) {
		t.Helper()
		tx, err := o.conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := o.attachAll(ctx, tx, triggerFns)
		for fn, r := range o.callAll(ctx, tx, otherFns) {
			got[fn] = r
		}
		return tx, got
	}
	want := make(map[string]string)
	for _, fn := range append(slices.Clone(triggerFns), otherFns...) {
		want[fn] = "refused"
	}
	want["outbox_schema_version()"] = "ran"

	before := e.ownerState()
	tx, got := attack()
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the attack's steps (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(before, e.ownerState()); diff != "" {
		t.Errorf("the outbox after the attack committed (-before +after):\n%s", diff)
	}

	tx, _ = attack()
	defer func() { _ = tx.Rollback(context.Background()) }()
	pub, err := NewPublisher[string](e.pub, "q", nil)
	if err != nil {
		t.Fatal(err)
	}
	e.noWait("a keyed publish while the attack's transaction is open", e.roles[1], func(ctx context.Context, c *pgx.Conn) error {
		_, err := pub.PublishBatch(ctx, c, []string{"k1", "k2"}, &PublishOpts{OrderingKey: "k"})
		return err
	})
	e.noWait("a sleep record while the attack's transaction is open", e.roles[2], func(ctx context.Context, c *pgx.Conn) error {
		return e.sub.queries(c).Sleep(ctx, db.SleepParams{ID: newSleepID(), Queues: []string{"q"}, ForSeconds: 60})
	})
	if t.Failed() {
		return
	}
	var (
		mu      sync.Mutex
		handled []string
	)
	s := startSub(t, e.sub, []string{"q"}, func(_ context.Context, m *Message[string]) error {
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, m.Payload)
		return nil
	}, fastConfig[string](nil))
	eventually(t, "the key's rows handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(handled) >= 2 })
	if err := s.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	if diff := cmp.Diff([]string{"k1", "k2"}, handled); diff != "" {
		t.Errorf("handled while the attack's transaction is open (-want +got):\n%s", diff)
	}
}

// The owner's trigger functions run only as the outbox's own triggers:
// even a role the owner mistakenly let execute them, attaching each to a
// TEMP table of the outbox's columns, is refused when it fires, and
// nothing of the outbox changes.
func TestTheOwnersTriggerFunctionsRunOnlyAsTheOutboxsTriggers(t *testing.T) {
	t.Parallel()
	e := setupRoles(t)
	ctx := e.ctx
	o := e.newOutsider()
	triggerFns, _ := e.ownerFunctions()
	migrator := e.db.PoolAs(t, e.roles[0])
	for _, fn := range triggerFns {
		if _, err := migrator.Exec(ctx, "GRANT EXECUTE ON FUNCTION "+pgx.Identifier{e.db.Schema, strings.TrimSuffix(fn, "()")}.Sanitize()+
			"() TO "+pgx.Identifier{o.name}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	}
	before := e.ownerState()
	tx, err := o.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := o.attachAll(ctx, tx, triggerFns)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	want := make(map[string]string)
	for _, fn := range triggerFns {
		want[fn] = "refused"
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the owner's trigger functions on another table (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(before, e.ownerState()); diff != "" {
		t.Errorf("the outbox after (-before +after):\n%s", diff)
	}
}

// A publisher with exactly the documented grants that forges every
// outboxgen.* setting the outbox's functions read (among them the one
// schema 10 let a statement's later rows of a key skip the key's trigger
// by) and inserts a row of a key without rows, already blocked, at READ
// COMMITTED and REPEATABLE READ, strands no key: each such row is its
// key's head, and a subscriber handles it.
func TestAPublisherThatForgesTheOutboxsSettingsStrandsNoKey(t *testing.T) {
	t.Parallel()
	e := setupRoles(t)
	ctx := e.ctx
	c, err := pgx.Connect(ctx, e.db.URLAs(t, e.roles[1]))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close(context.Background()) }()
	var want []string
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead} {
		key := "lonely " + strings.ToLower(string(iso))
		forge(ctx, t, c, e.ob, "q", key)
		if err := pgx.BeginTxFunc(ctx, c, pgx.TxOptions{IsoLevel: iso}, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO outbox (queue, payload, ordering_key, blocked) VALUES ('q', convert_to($1::text, 'UTF8'), $1::text, true)", key)
			return err
		}); err != nil {
			t.Fatalf("%s: %v", iso, err)
		}
		want = append(want, key)
	}
	// A key is handed on when its row is its head, or when a hand-over
	// of it is recorded for the subscribers to complete.
	rows, err := e.db.Pool.Query(ctx, `SELECT o.ordering_key || CASE WHEN NOT o.blocked THEN ': head'
			WHEN EXISTS (SELECT 1 FROM outbox_handoff AS h WHERE h.queue = o.queue AND h.ordering_key = o.ordering_key) THEN ': hand-over recorded'
			ELSE ': stranded' END
		FROM outbox AS o ORDER BY o.id`)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{want[0] + ": head", want[1] + ": hand-over recorded"}, keys); diff != "" {
		t.Fatalf("the forged rows' keys (-want +got):\n%s", diff)
	}
	var (
		mu      sync.Mutex
		handled []string
	)
	s := startSub(t, e.sub, []string{"q"}, func(_ context.Context, m *Message[[]byte]) error {
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, string(m.Payload))
		return nil
	}, fastConfig[[]byte](nil))
	eventually(t, "both keys' rows handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) >= len(want)
	})
	if err := s.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	sort.Strings(handled)
	if diff := cmp.Diff(want, handled); diff != "" {
		t.Errorf("handled (-want +got):\n%s", diff)
	}
}

// declaredObject is a row of the declared table of who may do what
// (docs/operations.md, "Who may do what").
type declaredObject struct {
	kind, runsAs string
	// grants are each role's privileges ("publisher", "subscriber",
	// "PUBLIC"), sorted.
	grants map[string][]string
}

// declaredPrivileges reads the declared table of docs/operations.md, for
// the outbox's default table name.
func declaredPrivileges(t *testing.T) (objects map[string]declaredObject, roles []string) {
	t.Helper()
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(doc), "\n")
	start := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "| object | kind | runs as |") })
	if start < 0 {
		t.Fatal("docs/operations.md: no declared table (a header | object | kind | runs as | ...)")
	}
	cells := func(l string) []string {
		c := strings.Split(strings.Trim(strings.TrimSpace(l), "|"), "|")
		for i := range c {
			c[i] = strings.TrimSpace(c[i])
		}
		return c
	}
	roles = cells(lines[start])[3:]
	code := regexp.MustCompile("`([^`]*)`")
	objects = make(map[string]declaredObject)
	for _, l := range lines[start+2:] {
		if !strings.HasPrefix(l, "|") {
			break
		}
		l = strings.ReplaceAll(l, "<table>", TableDefault)
		c := cells(l)
		if len(c) != 3+len(roles) {
			t.Fatalf("docs/operations.md: declared row with %d cells, want %d: %s", len(c), 3+len(roles), l)
		}
		name := strings.Trim(c[0], "`")
		d := declaredObject{kind: strings.ReplaceAll(c[1], "`", ""), runsAs: c[2], grants: make(map[string][]string)}
		for i, role := range roles {
			for _, m := range code.FindAllStringSubmatch(c[3+i], -1) {
				d.grants[role] = append(d.grants[role], m[1])
			}
			slices.Sort(d.grants[role])
		}
		if _, dup := objects[name]; dup {
			t.Fatalf("docs/operations.md: %s declared twice", name)
		}
		objects[name] = d
	}
	return objects, roles
}

// After Migrate and Grant, every table, sequence, function and trigger
// in the outbox's schema is the migrator's and grants exactly what the
// declared table of docs/operations.md says, read from the ACLs
// (aclexplode) and asked of each role (has_*_privilege); no object is
// missing from it. Functions that run as the migrator pin their
// search_path and are not PUBLIC's.
func TestPrivilegesInTheCatalogAreTheDeclaredOnes(t *testing.T) {
	t.Parallel()
	e := setupRoles(t)
	ctx := e.ctx
	declared, roles := declaredPrivileges(t)
	roleOfName := map[string]string{e.roles[1]: "publisher", e.roles[2]: "subscriber", "-": "PUBLIC"}
	nameOfRole := map[string]string{"publisher": e.roles[1], "subscriber": e.roles[2], "PUBLIC": "public"}
	for _, r := range roles {
		if nameOfRole[r] == "" {
			t.Fatalf("docs/operations.md: declared table names role %q, which the test does not know", r)
		}
	}

	// Every object as the catalog has it: kind, whose privileges it runs
	// with, owner, and its grants to roles other than the owner.
	rows, err := e.db.Pool.Query(ctx, `
		WITH objs AS (
			SELECT c.relname AS name, CASE c.relkind WHEN 'S' THEN 'sequence' ELSE 'table' END AS kind, '' AS runs_as,
			       c.relowner AS owner, c.oid AS oid,
			       coalesce(c.relacl, acldefault((CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END)::"char", c.relowner)) AS acl, NULL::text[] AS config
			FROM pg_class AS c WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'p', 'S', 'v', 'm', 'f')
			UNION ALL
			SELECT p.proname || '(' || oidvectortypes(p.proargtypes) || ')', 'function',
			       CASE WHEN p.prosecdef THEN 'migrator' ELSE 'caller' END,
			       p.proowner, p.oid, coalesce(p.proacl, acldefault('f'::"char", p.proowner)), p.proconfig
			FROM pg_proc AS p WHERE p.pronamespace = $1::regnamespace
			UNION ALL
			SELECT tg.tgname, 'trigger on ' || c.relname, CASE WHEN p.prosecdef THEN 'migrator' ELSE 'caller' END,
			       c.relowner, tg.oid, NULL, p.proconfig
			FROM pg_trigger AS tg JOIN pg_class AS c ON c.oid = tg.tgrelid JOIN pg_proc AS p ON p.oid = tg.tgfoid
			WHERE c.relnamespace = $1::regnamespace AND NOT tg.tgisinternal AND tg.tgparentid = 0
		)
		SELECT o.name, o.kind, o.runs_as, pg_get_userbyid(o.owner), coalesce(o.config, '{}'),
		       coalesce((SELECT array_agg(CASE a.grantee WHEN 0 THEN '-' ELSE pg_get_userbyid(a.grantee) END || ' ' || a.privilege_type)
		                 FROM aclexplode(o.acl) AS a WHERE a.grantee <> o.owner), '{}')
		       || coalesce((SELECT array_agg(g.grantee || ' ' || g.privilege_type || ' (' || g.cols || ')')
		                    FROM (SELECT CASE a.grantee WHEN 0 THEN '-' ELSE pg_get_userbyid(a.grantee) END AS grantee, a.privilege_type,
		                                 string_agg(att.attname, ', ' ORDER BY att.attnum) AS cols
		                          FROM pg_attribute AS att, aclexplode(att.attacl) AS a
		                          WHERE o.kind = 'table' AND att.attrelid = o.oid AND att.attacl IS NOT NULL AND a.grantee <> o.owner
		                          GROUP BY 1, 2) AS g), '{}')
		FROM objs AS o`, e.db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	type catalogObject struct {
		kind, runsAs, owner string
		config, grants      []string
	}
	catalog := make(map[string]catalogObject)
	for rows.Next() {
		var name string
		var o catalogObject
		if err := rows.Scan(&name, &o.kind, &o.runsAs, &o.owner, &o.config, &o.grants); err != nil {
			t.Fatal(err)
		}
		catalog[name] = o
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	var missing, extra []string
	for name := range catalog {
		if _, ok := declared[name]; !ok {
			missing = append(missing, name)
		}
	}
	for name := range declared {
		if _, ok := catalog[name]; !ok {
			extra = append(extra, name)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	if len(missing) > 0 {
		t.Errorf("objects of a migrated outbox without a row in docs/operations.md's declared table: %v", missing)
	}
	if len(extra) > 0 {
		t.Errorf("objects declared in docs/operations.md that a migrated outbox does not have: %v", extra)
	}

	for _, name := range slices.Sorted(maps.Keys(catalog)) {
		c := catalog[name]
		d, ok := declared[name]
		if !ok {
			continue
		}
		if c.owner != e.roles[0] {
			t.Errorf("%s is owned by %s, want the migrator %s", name, c.owner, e.roles[0])
		}
		if c.kind != d.kind || (c.runsAs != d.runsAs && !(c.runsAs == "" && d.runsAs == "")) {
			t.Errorf("%s is a %s that runs as %q; declared a %s that runs as %q", name, c.kind, c.runsAs, d.kind, d.runsAs)
		}
		if c.runsAs == "migrator" {
			// The search path pinned; the key triggers also plan without
			// bitmap scans (schema 12), and the ring's truncate with
			// custom plans and no JIT (schema 13).
			config := slices.DeleteFunc(slices.Clone(c.config), func(s string) bool {
				return s == "enable_bitmapscan=off" || s == "plan_cache_mode=force_custom_plan" || s == "jit=off"
			})
			if diff := cmp.Diff([]string{"search_path=pg_catalog, pg_temp"}, config); diff != "" {
				t.Errorf("%s runs as the migrator with settings (-want +got):\n%s", name, diff)
			}
			if len(d.grants["PUBLIC"]) > 0 {
				t.Errorf("%s runs as the migrator, and the declared table lets PUBLIC %v", name, d.grants["PUBLIC"])
			}
		}
		got := make(map[string][]string)
		for _, g := range c.grants {
			grantee, priv, _ := strings.Cut(g, " ")
			role := roleOfName[grantee]
			if role == "" {
				role = grantee
			}
			got[role] = append(got[role], priv)
		}
		want := make(map[string][]string)
		for role, privs := range d.grants {
			if len(privs) > 0 {
				want[role] = privs
			}
		}
		for role := range got {
			slices.Sort(got[role])
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: grants in the catalog (aclexplode) differ from the declared table (-declared +catalog):\n%s", name, diff)
		}
	}

	// What each role may do, asked of PostgreSQL: a role's declared
	// privileges and PUBLIC's, nothing more.
	privileges := map[string][]string{
		"table":    {"SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"},
		"sequence": {"USAGE", "SELECT", "UPDATE"},
		"function": {"EXECUTE"},
	}
	check := map[string]string{
		"table":    "has_table_privilege($1, $2::regclass, $3)",
		"sequence": "has_sequence_privilege($1, $2::regclass, $3)",
		"function": "has_function_privilege($1, $2::regprocedure, $3)",
	}
	for _, name := range slices.Sorted(maps.Keys(declared)) {
		d := declared[name]
		if _, ok := catalog[name]; !ok || privileges[d.kind] == nil {
			continue
		}
		qualified := pgx.Identifier{e.db.Schema}.Sanitize() + "." + name
		if d.kind != "function" {
			qualified = pgx.Identifier{e.db.Schema, name}.Sanitize()
		}
		for _, role := range roles {
			may := map[string]bool{}
			for _, p := range append(slices.Clone(d.grants[role]), d.grants["PUBLIC"]...) {
				may[p] = true
			}
			for _, priv := range privileges[d.kind] {
				var has bool
				if err := e.db.Pool.QueryRow(ctx, "SELECT "+check[d.kind], nameOfRole[role], qualified, priv).Scan(&has); err != nil {
					t.Fatalf("%s of %s on %s: %v", priv, role, name, err)
				}
				if has != may[priv] {
					t.Errorf("%s: %s may %s: %v, declared %v", name, role, priv, has, may[priv])
				}
			}
			for p := range may {
				table, cols, ok := strings.Cut(p, " (")
				if !ok {
					continue
				}
				for col := range strings.SplitSeq(strings.TrimSuffix(cols, ")"), ", ") {
					var has bool
					if err := e.db.Pool.QueryRow(ctx, "SELECT has_column_privilege($1, $2::regclass, $3, $4)",
						nameOfRole[role], qualified, col, table).Scan(&has); err != nil {
						t.Fatal(err)
					}
					if !has {
						t.Errorf("%s: %s may not %s of column %s, declared it may", name, role, table, col)
					}
				}
			}
		}
	}
}

// A publisher that sets outboxgen.insert_key to a key it does not hold
// inserts rows of that key that arrive blocked, and so skip the key's
// trigger and its lock; while its statement runs, another publisher of
// the key commits a row. The forging statement is refused when it ends
// (its rows drew their ids outside the key's lock), and the key is left
// with the other publisher's row alone, its head.
func TestRowsThatSkipTheKeysTriggerOutsideItsLockAreRefused(t *testing.T) {
	t.Parallel()
	e := setupRoles(t)
	ctx := e.ctx
	const key = "contested"
	// pause is held by the test until the forging statement has written
	// its first row.
	var pause int64
	if err := e.db.Pool.QueryRow(ctx, "SELECT hashtext($1)", e.db.Schema).Scan(&pause); err != nil {
		t.Fatal(err)
	}
	hold, err := e.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hold.Rollback(context.Background()) }()
	if _, err := hold.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", pause); err != nil {
		t.Fatal(err)
	}

	forger, err := pgx.Connect(ctx, e.db.URLAs(t, e.roles[1]))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = forger.Close(context.Background()) }()
	forge(ctx, t, forger, e.ob, "q", key)
	done := make(chan error, 1)
	go func() {
		_, err := forger.Exec(ctx, `INSERT INTO outbox (queue, payload, ordering_key, blocked)
			SELECT 'q', convert_to('forged ' || g || CASE WHEN g = 2 THEN pg_advisory_xact_lock($2)::text ELSE '' END, 'UTF8'), $1, true
			FROM generate_series(1, 2) AS g`, key, pause)
		done <- err
	}()
	eventually(t, "the forging statement paused after its first row", func() bool {
		var blockers []int32
		if err := e.db.Pool.QueryRow(ctx, "SELECT pg_blocking_pids($1)", forger.PgConn().PID()).Scan(&blockers); err != nil {
			t.Fatal(err)
		}
		return len(blockers) > 0
	})
	pub, err := NewPublisher[string](e.pub, "q", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(ctx, e.pub.pool, "published", &PublishOpts{OrderingKey: key}); err != nil {
		t.Fatalf("Publish while the forging statement runs: %v", err)
	}
	if err := hold.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := outcome(<-done); got != "refused" {
		t.Errorf("the forging statement: %s, want refused", got)
	}
	rows, err := e.db.Pool.Query(ctx, "SELECT convert_from(payload, 'UTF8') || CASE WHEN blocked THEN ' blocked' ELSE ' head' END FROM outbox WHERE ordering_key = $1 ORDER BY id", key)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"published head"}, got); diff != "" {
		t.Errorf("the key's rows (-want +got):\n%s", diff)
	}
}
