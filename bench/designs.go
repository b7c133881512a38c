package main

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/bench/internal/procstat"
	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/claim"
)

// A design is the outbox table as the migrations make it, changed by
// alter (statements run in its schema): a table design measured before it
// becomes a migration. sqlFor adapts the library's statements to it.
type design struct {
	name   string
	alter  string
	sqlFor func(string) string
	// peer measures watermill-sql's queue table instead, with the
	// statements its PostgreSQLQueueSchema and its offsets adapter with
	// DeleteOnAck build: the reference the designs are judged against.
	peer bool
}

// jsonHeaders stores the header document as json, kept as the text the
// publisher sent, where jsonb is parsed into its binary form on insert and
// printed back to text on every claim.
const jsonHeaders = `ALTER TABLE outbox DROP CONSTRAINT outbox_headers_chk,
	ALTER COLUMN headers TYPE json,
	ADD CONSTRAINT outbox_headers_chk CHECK (headers IS NULL OR json_typeof(headers) = 'object');`

// noDeleteTrigger drops the after-delete statement trigger that hands
// keys on: its transition table copies every deleted row, keyed or not.
const noDeleteTrigger = `DROP TRIGGER outbox_key_delete_trg ON outbox;`

// noInsertTriggers drops the triggers an unkeyed insert runs: the
// statement trigger that notifies sleeping subscribers, and the row
// trigger of keyed rows, whose WHEN condition every row is checked
// against.
const noInsertTriggers = `DROP TRIGGER outbox_notify_trg ON outbox;
DROP TRIGGER outbox_key_insert_trg ON outbox;`

// noChecks drops the table's four CHECK constraints. PostgreSQL compiles
// a table's CHECK constraints from their stored text for every statement
// that inserts or updates rows (and a trigger's WHEN condition likewise),
// which a one-row transaction pays in full. Those checks refuse bad rows
// of other writers (docs/reliability.md), so this is a reference, not a
// candidate.
const noChecks = `ALTER TABLE outbox DROP CONSTRAINT outbox_queue_chk,
	DROP CONSTRAINT outbox_headers_chk,
	DROP CONSTRAINT outbox_lease_state_chk,
	DROP CONSTRAINT outbox_blocked_chk;`

// domainChecks moves the queue's and the headers' checks onto domains,
// whose constraints PostgreSQL keeps compiled per connection: the same
// refusals, at the price of two column types. The triggers whose WHEN
// conditions name those columns are made again around the type change.
const domainChecks = `CREATE DOMAIN outbox_queue_name AS text COLLATE "C" CHECK (octet_length(VALUE) BETWEEN 1 AND 255);
CREATE DOMAIN outbox_header_doc AS jsonb CHECK (VALUE IS NULL OR jsonb_typeof(VALUE) = 'object');
DO $$
DECLARE
	defs text[] := '{}';
	t record;
	d text;
BEGIN
	FOR t IN SELECT g.tgname, pg_get_triggerdef(g.oid) AS def FROM pg_trigger AS g
	         WHERE g.tgrelid = 'outbox'::regclass AND NOT g.tgisinternal AND g.tgqual IS NOT NULL LOOP
		EXECUTE format('DROP TRIGGER %I ON outbox', t.tgname);
		defs := defs || t.def;
	END LOOP;
	ALTER TABLE outbox DROP CONSTRAINT outbox_queue_chk, DROP CONSTRAINT outbox_headers_chk,
		ALTER COLUMN queue TYPE outbox_queue_name, ALTER COLUMN headers TYPE outbox_header_doc;
	FOREACH d IN ARRAY defs LOOP
		EXECUTE d;
	END LOOP;
END
$$;`

// lightestWhens gives the insert triggers the cheapest conditions they
// could have: the keyed rows' trigger runs for every keyed row (PublishBatch's
// rows behind their key's first would run it too), and the notifying
// statement trigger runs only while a subscriber may sleep (a condition on
// the sleep horizon, which every writing role would then need to read).
// Neither keeps today's behaviour whole: a lower bound of what the triggers
// could cost an unkeyed publish.
var lightestWhens = `DROP TRIGGER outbox_key_insert_trg ON outbox;
CREATE TRIGGER outbox_key_insert_trg BEFORE INSERT ON outbox FOR EACH ROW
	WHEN (NEW.ordering_key IS NOT NULL) EXECUTE FUNCTION outbox_key_insert();
` + notifyTriggerWhen(horizonAhead)

// horizonAhead holds while a subscriber may sleep: the test the notifying
// trigger's function makes first.
const horizonAhead = `pg_sequence_last_value('outbox_sleep_horizon') > date_part('epoch', now()) * 1000`

// notifyTriggerWhen makes the notifying statement trigger again, run only
// when cond holds.
func notifyTriggerWhen(cond string) string {
	return `DROP TRIGGER outbox_notify_trg ON outbox;
CREATE TRIGGER outbox_notify_trg AFTER INSERT ON outbox REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
	WHEN (` + cond + `)
	EXECUTE FUNCTION outbox_notify();`
}

// notifyWhen puts the notifying statement trigger behind the test its
// function makes first: it runs only while the sleep horizon lies ahead
// (a subscriber may sleep) or a keyed PublishBatch's marker needs
// clearing. A WHEN condition runs as the writing role, so every writer
// must be allowed to read the horizon.
var notifyWhen = `GRANT SELECT ON SEQUENCE outbox_sleep_horizon TO PUBLIC;
` + notifyTriggerWhen(horizonAhead+`
		OR coalesce(current_setting('outboxgen.insert_key', true), '') <> ''`)

// bareTable is the table of the bare INSERT that Publish is measured
// against (the concurrent suite): the outbox's columns with only its
// primary key and pending index, no check and no trigger. A reference.
const bareTable = noChecks + noInsertTriggers + noDeleteTrigger + `
DROP INDEX outbox_lease_expiry_idx, outbox_ordering_idx, outbox_timer_uidx;`

// headsByLookup keeps no row blocked: a claim finds a key's head by
// looking for an earlier row of its key (headsClaim), so a delete hands
// nothing on and writes no next row. The triggers that block and unblock
// rows go. Publishers of a key would still have to take turns (today's
// insert trigger does, with the key's lock), or a row of a transaction
// that commits late could be claimed after a later one: this measures
// the claims and deletes of such a table, not a whole design.
const headsByLookup = `DROP TRIGGER outbox_key_insert_trg ON outbox;
DROP TRIGGER outbox_key_delete_trg ON outbox;
DROP TRIGGER outbox_key_update_trg ON outbox;`

// headsDesign names the design whose claims find a key's head by lookup.
const headsDesign = "keys' heads found by lookup, no row blocked"

// keepsKeyOrder reports whether design name keeps per-key order, which
// the keyed drain measures: the first design (the migrations' table) and
// the one that finds heads by lookup.
func keepsKeyOrder(name string) bool { return name == designs[0].name || name == headsDesign }

// headsClaim adds to the library's claim by lock the condition that a
// keyed row is its key's head: no earlier row of its key exists.
func headsClaim(sql string) string {
	const order = "ORDER BY o.next_attempt_at, o.id"
	if !strings.Contains(sql, "FOR UPDATE OF o SKIP LOCKED") {
		return sql
	}
	table := claimedTable.FindStringSubmatch(sql)
	if table == nil {
		return sql
	}
	return strings.Replace(sql, order, `AND (o.ordering_key IS NULL OR NOT EXISTS (
    SELECT 1 FROM `+table[1]+` AS e
    WHERE e.queue = o.queue AND e.ordering_key = o.ordering_key AND e.id < o.id))
`+order, 1)
}

// claimedTable finds the table a rendered claim reads, as it names it.
var claimedTable = regexp.MustCompile(`FROM (\S+) AS o\b`)

// headersAsJSON makes the library's statements write json headers.
func headersAsJSON(sql string) string {
	return strings.ReplaceAll(sql, "'UTF8')::jsonb", "'UTF8')::json")
}

func sameSQL(sql string) string { return sql }

var designs = []design{
	{"schema 10", "", sameSQL, false},
	{"headers json", jsonHeaders, headersAsJSON, false},
	{"no delete trigger", noDeleteTrigger, sameSQL, false},
	{"headers json, no delete trigger", jsonHeaders + noDeleteTrigger, headersAsJSON, false},
	{"no triggers on insert", noInsertTriggers, sameSQL, false},
	{"no CHECK constraints (reference)", noChecks, sameSQL, false},
	{"queue and headers checked by domains", domainChecks, sameSQL, false},
	{"notifying trigger behind the sleep horizon", notifyWhen, sameSQL, false},
	{"insert triggers' lightest WHENs (lower bound)", lightestWhens, sameSQL, false},
	{"domains and lightest WHENs (lower bound)", domainChecks + lightestWhens, sameSQL, false},
	{"the bare INSERT's table (reference)", bareTable, sameSQL, false},
	{headsDesign, headsByLookup, headsClaim, false},
	{name: "watermill-sql's queue table (reference)", peer: true},
}

// designBatch is the rows a drain claims at once: the default
// subscriber's claims of a backlog hold about this many.
const designBatch = 2500

// runDesigns measures what a message costs the database server in each
// design: the CPU time of the one backend that runs, in turn, the
// library's single-row Publish (each its own transaction), its
// PublishBatch (1,000 rows a call), and a drain as the default
// subscriber claims: LockQueue of designBatch rows, then DeleteLocked of
// their ranges and the commit, until the table is empty. watermill-sql's
// row runs its own statements for the same work: a one-row insert, an
// insert of 1,000 rows, and its select of designBatch rows FOR UPDATE
// with its delete on acknowledgement. It reads that backend's CPU time
// from /proc, so it needs a server on this machine whose processes it may
// read; it says so and skips otherwise. Rows are unkeyed and due now;
// each phase starts from an empty table.
func runDesigns(ctx context.Context, env *benchEnv, o options) error {
	n := max(int(100000*o.scale)/drainBatch, 1) * drainBatch
	singles := max(n/10, 100)
	conn, err := env.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return err
	}
	statPath := "/proc/" + strconv.Itoa(pid) + "/stat"
	if _, ok := procstat.Read(statPath); !ok {
		fmt.Fprintf(o.out, "skipped: the server's backend %d is not readable in /proc (a server on another machine, or another user's)\n", pid)
		return nil
	}
	backendCPU := func() time.Duration {
		t, _ := procstat.Read(statPath)
		return procstat.Duration(t.User + t.System)
	}
	var ds []*designRun
	for i, d := range designs {
		// -contenders picks designs by name; the first, which the others
		// are judged against, always runs.
		if i > 0 && o.contenders != nil && !o.contenders.MatchString(d.name) {
			continue
		}
		r, err := newDesignRun(ctx, env, d, fmt.Sprintf("outboxbench_design%d", i))
		if err != nil {
			return fmt.Errorf("%s: %w", d.name, err)
		}
		defer r.drop(context.WithoutCancel(ctx), env)
		ds = append(ds, r)
	}
	// A phase that drains first publishes its backlog, which is not part
	// of its measure.
	unkeyed := fmt.Sprintf("drain, %d rows a claim", designBatch)
	keyed := fmt.Sprintf("keyed drain, %d keys", designKeys)
	phases := []struct {
		name string
		msgs int
		run  func(*designRun, *pgx.Conn, int) error
		// backlog, when set, writes the rows the phase drains first.
		backlog func(*designRun, *pgx.Conn, int) error
		// keyed phases run for the designs that keep per-key order.
		keyed bool
	}{
		{"Publish, 1 row a transaction", singles, (*designRun).publish, nil, false},
		{"PublishBatch, 1,000 rows a call", n, (*designRun).publishBatch, nil, false},
		{unkeyed, n, (*designRun).drain, (*designRun).publishBatch, false},
		{keyed, n, (*designRun).drain, (*designRun).keyedBacklog, true},
	}
	cpu := map[string]map[string][]time.Duration{}
	// Round -1 warms every design up (its relations' files, the plans of
	// its statements, the server's caches) and is not recorded: a design's
	// first round ran up to 1.7 times slower than its later ones.
	for round := -1; round < o.rounds; round++ {
		for i := range ds {
			r := ds[(i+max(round, 0))%len(ds)]
			for _, p := range phases {
				if p.keyed && !keepsKeyOrder(r.name) {
					continue
				}
				if err := r.empty(ctx, conn.Conn()); err != nil {
					return err
				}
				if p.backlog != nil {
					if err := p.backlog(r, conn.Conn(), p.msgs); err != nil {
						return fmt.Errorf("%s: %w", r.name, err)
					}
				}
				before := backendCPU()
				if err := p.run(r, conn.Conn(), p.msgs); err != nil {
					return fmt.Errorf("%s, %s: %w", r.name, p.name, err)
				}
				if round < 0 {
					continue
				}
				if cpu[p.name] == nil {
					cpu[p.name] = map[string][]time.Duration{}
				}
				cpu[p.name][r.name] = append(cpu[p.name][r.name], backendCPU()-before)
			}
		}
	}
	fmt.Fprintf(o.out, "server CPU per message, one backend, medians of %d rounds (CPU clock ticks of %v; %d messages a phase, %d single publishes)\n",
		o.rounds, procstat.Duration(1), n, singles)
	tw := tabwriter.NewWriter(o.out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "design\t")
	for _, p := range phases {
		fmt.Fprintf(tw, "%s\tvs schema 10\t", p.name)
	}
	fmt.Fprintln(tw)
	for _, r := range ds {
		fmt.Fprintf(tw, "%s\t", r.name)
		for _, p := range phases {
			if len(cpu[p.name][r.name]) == 0 {
				fmt.Fprint(tw, "–\t\t")
				continue
			}
			m := median(cpu[p.name][r.name]) / time.Duration(p.msgs)
			base := median(cpu[p.name][designs[0].name]) / time.Duration(p.msgs)
			fmt.Fprintf(tw, "%v\t%.2fx\t", m.Round(time.Microsecond/100), float64(m)/float64(base))
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// The keyed drain against the same design's unkeyed one: what per-key
	// order costs in that design (below 1: the keyed drain costs more).
	for _, r := range ds {
		if k := cpu[keyed][r.name]; len(k) > 0 {
			fmt.Fprintf(o.out, "%s: unkeyed drain / keyed drain = %.2fx\n", r.name,
				float64(median(cpu[unkeyed][r.name]))/float64(median(k)))
		}
	}
	if showSamples {
		for _, p := range phases {
			for _, r := range ds {
				if len(cpu[p.name][r.name]) == 0 {
					continue
				}
				fmt.Fprintf(o.out, "  %s, %s, per message by round:", r.name, p.name)
				for _, d := range cpu[p.name][r.name] {
					fmt.Fprintf(o.out, " %v", (d / time.Duration(p.msgs)).Round(time.Microsecond/100))
				}
				fmt.Fprintln(o.out)
			}
		}
	}
	return nil
}

// designRun is one design's outbox, in a schema of its own, and the
// library's statements rendered for it.
type designRun struct {
	design
	schema                          string
	publishSQL, batchSQL            string
	lockSQL, deleteSQL, truncateSQL string
	headers                         []byte
	payloads                        [][]byte
	peerSchema                      wsql.PostgreSQLQueueSchema
	peerOffsets                     wsql.PostgreSQLQueueOffsetsAdapter
}

func newDesignRun(ctx context.Context, env *benchEnv, d design, schema string) (*designRun, error) {
	id := pgx.Identifier{schema}.Sanitize()
	if _, err := env.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+id+" CASCADE; CREATE SCHEMA "+id); err != nil {
		return nil, err
	}
	if d.peer {
		return newPeerRun(ctx, env, d, schema)
	}
	if _, err := migratedOutbox(ctx, env.pool, schema); err != nil {
		return nil, err
	}
	if d.alter != "" {
		tx, err := env.pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, "SET LOCAL search_path = "+id+"; "+d.alter); err != nil {
			return nil, err
		}
		if err := tx.Commit(ctx); err != nil {
			return nil, err
		}
	}
	r, err := newRun(d, schema, "outbox")
	if err != nil {
		return nil, err
	}
	calls := []struct {
		sql  *string
		call func(q *db.Queries)
	}{
		{&r.publishSQL, func(q *db.Queries) { _, _ = q.Publish(ctx, db.PublishParams{}) }},
		{&r.batchSQL, func(q *db.Queries) { _, _ = q.PublishBatch(ctx, db.PublishBatchParams{}) }},
		{&r.lockSQL, func(q *db.Queries) { _, _ = q.LockQueue(ctx, db.LockQueueParams{}) }},
		{&r.deleteSQL, func(q *db.Queries) { _, _ = q.DeleteLocked(ctx, db.DeleteLockedParams{}) }},
	}
	for _, c := range calls {
		sql, err := librarySQL(schema, c.call)
		if err != nil {
			return nil, err
		}
		*c.sql = d.sqlFor(sql)
	}
	return r, nil
}

// newRun returns the run of design d on table in schema, with its
// payloads and header document.
func newRun(d design, schema, table string) (*designRun, error) {
	r := &designRun{design: d, schema: schema,
		truncateSQL: "TRUNCATE " + pgx.Identifier{schema, table}.Sanitize(),
		headers:     []byte(`{"content-type":"application/json","message-type":"bench.order"}`)}
	for i := range drainBatch {
		b, err := jsonOrder(i)
		if err != nil {
			return nil, err
		}
		r.payloads = append(r.payloads, b)
	}
	return r, nil
}

// newPeerRun makes watermill-sql's queue table for the bench's topic in
// schema, as its PostgreSQLQueueSchema does.
func newPeerRun(ctx context.Context, env *benchEnv, d design, schema string) (*designRun, error) {
	name := func(topic string) string { return pgx.Identifier{schema, "watermill_" + topic}.Sanitize() }
	r, err := newRun(d, schema, "watermill_"+topic)
	if err != nil {
		return nil, err
	}
	r.peerSchema = wsql.PostgreSQLQueueSchema{GenerateMessagesTableName: name, SubscribeBatchSize: designBatch}
	r.peerOffsets = wsql.PostgreSQLQueueOffsetsAdapter{GenerateMessagesTableName: name, DeleteOnAck: true}
	qs, err := r.peerSchema.SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams{Topic: topic})
	if err != nil {
		return nil, err
	}
	for _, q := range qs {
		if _, err := env.pool.Exec(ctx, q.Query, q.Args...); err != nil {
			return nil, err
		}
	}
	sel, err := r.peerSchema.SelectQuery(wsql.SelectQueryParams{Topic: topic, OffsetsAdapter: r.peerOffsets})
	if err != nil {
		return nil, err
	}
	r.lockSQL = sel.Query
	return r, nil
}

// peerInsert is watermill-sql's insert of payloads, each with metadata
// of the outbox's header document's size.
func (r *designRun) peerInsert(conn *pgx.Conn, payloads [][]byte) error {
	msgs := make(message.Messages, len(payloads))
	for i, p := range payloads {
		msgs[i] = message.NewMessage(watermill.NewUUID(), p)
		msgs[i].Metadata.Set("content-type", "application/json")
		msgs[i].Metadata.Set("message-type", "bench.order")
	}
	q, err := r.peerSchema.InsertQuery(wsql.InsertQueryParams{Topic: topic, Msgs: msgs})
	if err != nil {
		return err
	}
	_, err = conn.Exec(context.Background(), q.Query, q.Args...)
	return err
}

func (r *designRun) drop(ctx context.Context, env *benchEnv) {
	_, _ = env.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{r.schema}.Sanitize()+" CASCADE")
}

func (r *designRun) empty(ctx context.Context, conn *pgx.Conn) error {
	_, err := conn.Exec(ctx, r.truncateSQL)
	return err
}

// publish inserts n rows one statement and transaction each, committing
// without waiting for the WAL flush: the CPU is measured, not the disk.
func (r *designRun) publish(conn *pgx.Conn, n int) error {
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		return err
	}
	defer func() { _, _ = conn.Exec(ctx, "RESET synchronous_commit") }()
	if r.peer {
		for i := range n {
			if err := r.peerInsert(conn, r.payloads[i%len(r.payloads):i%len(r.payloads)+1]); err != nil {
				return err
			}
		}
		return nil
	}
	for i := range n {
		// The arguments of PublishParams, in the statement's order.
		var id int64
		if err := conn.QueryRow(ctx, r.publishSQL, "orders", r.payloads[i%len(r.payloads)], r.headers, nil, nil, 0.0, nil).Scan(&id); err != nil {
			return err
		}
	}
	return nil
}

// publishBatch inserts n rows drainBatch a statement.
func (r *designRun) publishBatch(conn *pgx.Conn, n int) error {
	ctx := context.Background()
	for first := 0; first < n; first += drainBatch {
		if r.peer {
			if err := r.peerInsert(conn, r.payloads[:min(drainBatch, n-first)]); err != nil {
				return err
			}
			continue
		}
		// The arguments of PublishBatchParams, in the statement's order.
		rows, err := conn.Query(ctx, r.batchSQL, "orders", r.headers, nil, 0.0, nil, r.payloads[:min(drainBatch, n-first)])
		if err != nil {
			return err
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	return nil
}

// designKeys is the keys the keyed drain's backlog spreads its rows over,
// as the keyed suite's does: row i has key i mod designKeys.
const designKeys = 10000

// keyedBacklog writes n keyed rows in plain SQL, as the explain suite
// does: the insert trigger, where the design keeps it, blocks every row
// of a key but its first.
func (r *designRun) keyedBacklog(conn *pgx.Conn, n int) error {
	return writeKeyedRows(context.Background(), conn, pgx.Identifier{r.schema, "outbox"}.Sanitize(), r.headers, designKeys, n)
}

// drain claims and deletes every row as the default subscriber's claims
// by lock do, one claim at a time.
func (r *designRun) drain(conn *pgx.Conn, n int) error {
	ctx := context.Background()
	drained := 0
	for {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		// The arguments of LockQueueParams, in the statement's order.
		args := []any{int64(60000), "orders", nil, nil, int32(designBatch)}
		if r.peer {
			args = nil
		}
		rows, err := tx.Query(ctx, r.lockSQL, args...)
		if err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		var ids []int64
		for rows.Next() {
			var id int64
			cols := make([]any, len(rows.FieldDescriptions()))
			cols[0] = &id
			if err := rows.Scan(cols...); err != nil {
				rows.Close()
				_ = tx.Rollback(ctx)
				return err
			}
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		if len(ids) == 0 {
			_ = tx.Rollback(ctx)
			break
		}
		if err := r.deleteDrained(tx, ids); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		drained += len(ids)
	}
	if drained != n {
		return fmt.Errorf("drained %d rows of %d", drained, n)
	}
	return nil
}

// deleteDrained deletes the claimed rows ids: by their ranges with
// DeleteLocked, or with watermill-sql's acknowledgement.
func (r *designRun) deleteDrained(tx pgx.Tx, ids []int64) error {
	ctx := context.Background()
	if !r.peer {
		lower, upper := claim.Runs(ids)
		_, err := tx.Exec(ctx, r.deleteSQL, lower, upper)
		return err
	}
	rows := make([]wsql.Row, len(ids))
	for i, id := range ids {
		rows[i].Offset = id
	}
	q, err := r.peerOffsets.AckMessageQuery(wsql.AckMessageQueryParams{Topic: topic, Rows: rows, LastRow: rows[len(rows)-1]})
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, q.Query, q.Args...)
	return err
}
