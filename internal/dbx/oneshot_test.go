package dbx_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/internal/dbx"
	"github.com/outboxgen/outboxgen/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// OneShot sends each statement as the unnamed statement, which the server
// plans for its parameters at every execution: however often a statement
// ran through it, its connection holds no prepared statement of it
// (sent by name, as pgx does by default, a statement is prepared, and
// after five executions PostgreSQL may plan it once for any parameters).
func TestOneShotStatementsAreNeverPrepared(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	conn, err := d.Pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	const sql = "SELECT $1::int + 1"
	prepared := func() int {
		t.Helper()
		var n int
		if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM pg_prepared_statements WHERE statement = $1",
			pgx.QueryExecModeSimpleProtocol, sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var got []int
	for i := range 8 {
		var n int
		if err := (dbx.OneShot{Inner: conn}).QueryRow(t.Context(), sql, i).Scan(&n); err != nil {
			t.Fatal(err)
		}
		got = append(got, n)
	}
	if diff := cmp.Diff([]int{1, 2, 3, 4, 5, 6, 7, 8}, got); diff != "" {
		t.Errorf("results (-want +got):\n%s", diff)
	}
	if _, err := (dbx.OneShot{Inner: conn}).Exec(t.Context(), sql, 1); err != nil {
		t.Fatal(err)
	}
	if n := prepared(); n != 0 {
		t.Errorf("%d prepared statements of a statement sent through OneShot; want none", n)
	}
	// The check sees a statement pgx prepares.
	if _, err := conn.Exec(t.Context(), sql, pgx.QueryExecModeCacheStatement, 1); err != nil {
		t.Fatal(err)
	}
	if n := prepared(); n != 1 {
		t.Errorf("%d prepared statements after pgx's send by name; want 1", n)
	}
}
