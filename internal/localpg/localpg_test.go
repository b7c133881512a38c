package localpg

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
)

// A throwaway cluster starts with the machine's server binaries (as root
// too), answers, has autovacuum on, and is gone after Stop.
func TestThrowawayCluster(t *testing.T) {
	if _, err := lookBin("initdb"); err != nil {
		t.Skipf("no PostgreSQL server binaries here: %v", err)
	}
	s, err := startCluster(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(t.Context(), s.URL)
	if err != nil {
		s.Stop()
		t.Fatal(err)
	}
	var autovacuum string
	err = conn.QueryRow(t.Context(), "SHOW autovacuum").Scan(&autovacuum)
	_ = conn.Close(context.Background())
	if err != nil || autovacuum != "on" {
		t.Errorf("autovacuum %q (%v)", autovacuum, err)
	}
	s.Stop()
	if _, err := pgx.Connect(t.Context(), s.URL); err == nil {
		t.Errorf("%s still answers after Stop", s.URL)
	}
	if _, err := os.Stat(s.dir); !os.IsNotExist(err) {
		t.Errorf("%s left after Stop (%v)", s.dir, err)
	}
}

// Find takes what PostgreSQL's client defaults reach, as psql would.
func TestFindUsesTheClientDefaults(t *testing.T) {
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		t.Skip("TEST_DATABASE_URL is not set: no known server to point the client defaults at")
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PGHOST", cfg.Host)
	t.Setenv("PGPORT", strconv.Itoa(int(cfg.Port)))
	t.Setenv("PGUSER", cfg.User)
	t.Setenv("PGDATABASE", cfg.Database)
	s, err := Find(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if s.Source != ClientDefaults {
		t.Errorf("found %s", s.How)
	}
	conn, err := pgx.Connect(t.Context(), s.URL)
	if err != nil {
		t.Fatalf("%s: %v", s.URL, err)
	}
	_ = conn.Close(context.Background())
}
