package main

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// statementStats profiles contenders with pg_stat_statements (the
// -statements flag): the server's execution and planning time per
// statement, summed over each contender's rounds. The statements run
// inside triggers are listed too when pg_stat_statements.track is all;
// their time is also counted in the statement that fired them.
type statementStats struct {
	pool *pgxpool.Pool
	by   map[string]map[string]*stmtStat // contender -> query -> stats
}

type stmtStat struct {
	query    string
	toplevel bool
	calls    int64
	rows     int64
	ms       float64 // execution and planning
	planMs   float64 // planning (pg_stat_statements.track_planning)
}

// newStatementStats returns nil when pg_stat_statements cannot be read
// and reset in this database.
func newStatementStats(ctx context.Context, pool *pgxpool.Pool, out io.Writer) *statementStats {
	if _, err := pool.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
		fmt.Fprintf(out, "-statements: pg_stat_statements is not available: %v\n", err)
		return nil
	}
	return &statementStats{pool: pool, by: map[string]map[string]*stmtStat{}}
}

// wrap makes each contender's rounds reset the statistics before they
// start and collect them after they end. The reset comes before the
// round's untimed setup, so setup statements are collected too: they show
// as their own statements.
func (s *statementStats) wrap(ctx context.Context, cs []contender) []contender {
	if s == nil {
		return cs
	}
	out := make([]contender, len(cs))
	for i, c := range cs {
		out[i] = contender{c.name, func(n int) (time.Duration, error) {
			if err := s.reset(ctx); err != nil {
				return 0, err
			}
			d, err := c.round(n)
			if err != nil {
				return d, err
			}
			return d, s.collect(ctx, c.name)
		}}
	}
	return out
}

// reset clears the statistics.
func (s *statementStats) reset(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, "SELECT pg_stat_statements_reset()")
	return err
}

func (s *statementStats) collect(ctx context.Context, name string) error {
	rows, err := s.pool.Query(ctx, `SELECT query, toplevel, calls, rows, total_exec_time, total_plan_time
		FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND query NOT LIKE '%pg_stat_statements%'`)
	if err != nil {
		return err
	}
	m := s.by[name]
	if m == nil {
		m = map[string]*stmtStat{}
		s.by[name] = m
	}
	var (
		q            string
		top          bool
		calls, nrows int64
		ms, planMs   float64
	)
	_, err = pgx.ForEachRow(rows, []any{&q, &top, &calls, &nrows, &ms, &planMs}, func() error {
		key := fmt.Sprintf("%t %s", top, q)
		st := m[key]
		if st == nil {
			st = &stmtStat{query: q, toplevel: top}
			m[key] = st
		}
		st.calls += calls
		st.rows += nrows
		st.ms += ms + planMs
		st.planMs += planMs
		return nil
	})
	return err
}

var spaceRE = regexp.MustCompile(`\s+`)

// report prints, per contender, the statements that took at least 1% of
// its server time, with time per message (perRound messages per round).
func (s *statementStats) report(w io.Writer, order []string, rounds, perRound int) {
	if s == nil {
		return
	}
	for _, name := range order {
		var sts []*stmtStat
		total := 0.0
		for _, st := range s.by[name] {
			sts = append(sts, st)
			if st.toplevel {
				total += st.ms
			}
		}
		sort.Slice(sts, func(i, j int) bool { return sts[i].ms > sts[j].ms })
		msgs := float64(rounds * perRound)
		fmt.Fprintf(w, "\nserver time, %s: %.1f µs per message in top-level statements\n", name, total*1000/msgs)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  statement\tlevel\tcalls\trows\tmean\tper message\tof which planning\t")
		for _, st := range sts {
			if st.ms < total/100 {
				continue
			}
			level := "top"
			if !st.toplevel {
				level = "nested"
			}
			q := strings.TrimSpace(spaceRE.ReplaceAllString(strings.TrimPrefix(st.query, "-- "), " "))
			if len(q) > 70 {
				q = q[:70] + "..."
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%.1f µs\t%.1f µs\t%.2f µs\t\n", q, level, st.calls, st.rows,
				st.ms*1000/float64(max(st.calls, 1)), st.ms*1000/msgs, st.planMs*1000/msgs)
		}
		_ = tw.Flush()
	}
}

// measureStatements measures cs as measure does, each round after a
// reset of env, with the statements profiled (-statements) while each
// clock runs; it returns the samples and the profiler (nil without
// -statements) for the report.
func (o options) measureStatements(ctx context.Context, env *benchEnv, n int, cs []contender) (samples, *statementStats, error) {
	stats := o.statementStats(ctx, env)
	clockStatements = stats
	defer func() { clockStatements = nil }()
	s, err := measure(o.rounds, n, func() error { return env.reset(ctx) }, stats.wrap(ctx, cs))
	return s, stats, err
}

// statementStats returns the profiler when -statements asks for one.
func (o options) statementStats(ctx context.Context, env *benchEnv) *statementStats {
	if !o.statements {
		return nil
	}
	return newStatementStats(ctx, env.pool, o.out)
}
