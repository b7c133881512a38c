package pgtest

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

// Tables created and dropped leave dead rows in pg_attribute; once they
// pass the threshold, vacuumCatalogs vacuums it and says so.
func TestCatalogsBloatedByDroppedTablesAreVacuumed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := New(t)
	var super bool
	if err := db.Pool.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super); err != nil {
		t.Fatal(err)
	}
	if !super {
		t.Skip("the test database's role cannot vacuum the catalogs")
	}
	lastVacuum := func() (time.Time, int64) {
		var at *time.Time
		var dead int64
		if err := db.Pool.QueryRow(ctx, `SELECT last_vacuum, n_dead_tup FROM pg_stat_sys_tables
			WHERE schemaname = 'pg_catalog' AND relname = 'pg_attribute'`).Scan(&at, &dead); err != nil {
			t.Fatal(err)
		}
		if at == nil {
			return time.Time{}, dead
		}
		return *at, dead
	}
	before, _ := lastVacuum()

	// 1,600 columns, the most a table may have: each table created and
	// dropped leaves 1,606 dead rows in pg_attribute.
	cols := make([]string, 1600)
	for i := range cols {
		cols[i] = fmt.Sprintf("c%d int", i)
	}
	for i := range 4 {
		name := pgx.Identifier{fmt.Sprintf("wide%d", i)}.Sanitize()
		if _, err := db.Pool.Exec(ctx, "CREATE TABLE "+name+" ("+strings.Join(cols, ", ")+"); DROP TABLE "+name); err != nil {
			t.Fatal(err)
		}
	}
	// The server publishes its statistics at most once a second.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, dead := lastVacuum(); dead > catalogDeadRows {
			break
		}
		if time.Now().After(deadline) {
			_, dead := lastVacuum()
			t.Fatalf("pg_attribute shows %d dead rows 30s after 6,424 were made", dead)
		}
		time.Sleep(100 * time.Millisecond)
	}

	var log bytes.Buffer
	if err := vacuumCatalogs(ctx, URL(t), &log); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log.String(), "pg_attribute (") {
		t.Errorf("vacuumCatalogs said %q; want it to name pg_attribute", log.String())
	}
	if after, _ := lastVacuum(); !after.After(before) {
		t.Errorf("pg_attribute's last vacuum is %v, as before the call (%v)", after, before)
	}
}
