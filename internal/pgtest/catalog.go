package pgtest

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// catalogDeadRows is how many dead rows a system catalog of the test
// database may hold before [Main] vacuums it after a package's tests.
//
// Every schema a test creates and drops leaves dead rows in pg_class,
// pg_attribute, pg_type, pg_depend and their like: a run of the suite
// leaves about fifty thousand in pg_attribute alone. A server with
// autovacuum on clears them in time; on one without (a test server set
// for speed) they pile up run after run, and each run's DDL and catalog
// reads grow slower.
const catalogDeadRows = 5000

// vacuumCatalogs vacuums the system catalogs of the database at url that
// hold more than catalogDeadRows dead rows and that its role may vacuum
// (a superuser's, or the catalog owner's), and tells log what it did.
func vacuumCatalogs(ctx context.Context, url string, log io.Writer) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `
		SELECT s.relname, s.n_dead_tup
		FROM pg_catalog.pg_stat_sys_tables s
		JOIN pg_catalog.pg_class c ON c.oid = s.relid
		WHERE s.schemaname = 'pg_catalog' AND s.n_dead_tup > $1
		  AND pg_catalog.pg_has_role(c.relowner, 'USAGE')
		ORDER BY s.relname`, catalogDeadRows)
	if err != nil {
		return err
	}
	type bloated struct {
		Name string
		Dead int64
	}
	found, err := pgx.CollectRows(rows, pgx.RowToStructByPos[bloated])
	if err != nil || len(found) == 0 {
		return err
	}
	rels := make([]string, len(found))
	said := make([]string, len(found))
	for i, b := range found {
		rels[i] = "pg_catalog." + pgx.Identifier{b.Name}.Sanitize()
		said[i] = fmt.Sprintf("%s (%d dead rows)", b.Name, b.Dead)
	}
	start := time.Now()
	if _, err := conn.Exec(ctx, "VACUUM "+strings.Join(rels, ", ")); err != nil {
		return err
	}
	fmt.Fprintf(log, "pgtest: vacuumed %s in %v\n", strings.Join(said, ", "), time.Since(start).Round(time.Millisecond))
	return nil
}
