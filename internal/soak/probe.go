package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// dbProbe reads what the database says about the outbox table.
type dbProbe struct {
	pool       *pgxpool.Pool
	table, dlq string // quoted, schema-qualified
	pending    string // the pending index, quoted, schema-qualified
	claimLike  string // LIKE pattern of the claims' text in pg_stat_statements
	server     string
	autovacuum string
	statements bool // pg_stat_statements is loaded and installed
	// unread counts the rows of the ring no lane has read past (-ring);
	// nil: the outbox has no ring.
	unread func(ctx context.Context) (int64, error)
}

// ringUnread counts the ring's rows no lane has read past: 0 without a
// ring.
func (p *dbProbe) ringUnread(ctx context.Context) (int64, error) {
	if p.unread == nil {
		return 0, nil
	}
	return p.unread(ctx)
}

func newDBProbe(ctx context.Context, pool *pgxpool.Pool, schema string) (*dbProbe, error) {
	p := &dbProbe{
		pool:    pool,
		table:   pgx.Identifier{schema, table}.Sanitize(),
		dlq:     pgx.Identifier{schema, table + "_dlq"}.Sanitize(),
		pending: pgx.Identifier{schema, table + "_pending_idx"}.Sanitize(),
		// The rendered claims name the table schema-qualified and quoted.
		claimLike: "-- name: Claim%" + pgx.Identifier{schema}.Sanitize() + ".%",
	}
	if err := pool.QueryRow(ctx, "SELECT current_setting('server_version'), current_setting('autovacuum')").Scan(&p.server, &p.autovacuum); err != nil {
		return nil, err
	}
	p.server = "PostgreSQL " + p.server
	// Only when an operator installed it: the soak changes no settings.
	var n int64
	p.statements = pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_statements").Scan(&n) == nil
	return p, nil
}

func (p *dbProbe) statementsNote() string {
	if p.statements {
		return "mean of the claims' execution in pg_stat_statements"
	}
	return "pg_stat_statements is not installed, so only the client's timing"
}

// tableStats is one reading of the outbox table and the database.
type tableStats struct {
	deadTuples, tableBytes, indexBytes int64
	pendingBytes                       int64 // the pending index, which claims scan
	vacuums                            int64 // autovacuum runs on the table so far
	xminAge                            int64 // oldest snapshot or transaction id of the database's backends, in transactions
	queued                             int64 // rows in the table
	claimCalls                         int64 // pg_stat_statements: claims executed so far
	claimMillis                        float64
}

func (p *dbProbe) read(ctx context.Context) (tableStats, error) {
	var s tableStats
	err := p.pool.QueryRow(ctx, `
		SELECT coalesce(st.n_dead_tup, 0), pg_relation_size(c.oid), pg_indexes_size(c.oid),
		       coalesce(pg_relation_size(to_regclass($2)), 0),
		       coalesce(st.autovacuum_count, 0),
		       (SELECT coalesce(max(greatest(age(a.backend_xmin), age(a.backend_xid))), 0)
		        FROM pg_stat_activity AS a WHERE a.datname = current_database()),
		       (SELECT count(*) FROM `+p.table+`)
		FROM pg_class AS c LEFT JOIN pg_stat_user_tables AS st ON st.relid = c.oid
		WHERE c.oid = $1::regclass`, p.table, p.pending).
		Scan(&s.deadTuples, &s.tableBytes, &s.indexBytes, &s.pendingBytes, &s.vacuums, &s.xminAge, &s.queued)
	if err != nil || !p.statements {
		return s, err
	}
	err = p.pool.QueryRow(ctx, `
		SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(total_exec_time), 0)
		FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query LIKE $1`, p.claimLike).
		Scan(&s.claimCalls, &s.claimMillis)
	return s, err
}

// waitDue waits, up to limit, until no row is due or leased: what is left
// is scheduled for later (reminders, retries). It returns how many rows
// are left, and how many of them are still due or leased.
func (p *dbProbe) waitDue(ctx context.Context, limit time.Duration) (all, due int64, err error) {
	deadline := time.Now().Add(limit)
	for {
		err := p.pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE next_attempt_at <= now() OR acquired_token IS NOT NULL), count(*) FROM "+p.table).
			Scan(&due, &all)
		if err == nil {
			// The ring's unread rows are all due: a row not yet due
			// moves into the table when its lane reads it.
			var unread int64
			unread, err = p.ringUnread(ctx)
			due, all = due+unread, all+unread
		}
		if err != nil || due == 0 || time.Now().After(deadline) {
			return all, due, err
		}
		if !sleepUntil(ctx, time.Now().Add(200*time.Millisecond)) {
			return all, due, ctx.Err()
		}
	}
}

// rss reads the process's resident set size from /proc/self/status, in
// bytes; 0 where there is no such file.
func rss() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("VmRSS:")); ok {
			f := bytes.Fields(v) // "12345", "kB"
			if len(f) == 2 {
				kb, err := strconv.ParseInt(string(f[0]), 10, 64)
				if err == nil {
					return kb << 10
				}
			}
		}
	}
	return 0
}

// loadAverage reads the machine's one-minute load average from
// /proc/loadavg; -1 where there is no such file. The soak shares the
// machine with whatever else runs, and this says how much else did.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := bytes.Fields(b)
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(string(f[0]), 64)
	if err != nil {
		return -1
	}
	return v
}

// mib formats bytes in MiB.
func mib(b int64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }
