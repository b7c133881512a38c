package localpg

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
)

// A throwaway cluster starts with the machine's server binaries (as root
// too), runs the version of the initdb it found (the first on PATH, when
// there is one), answers, has autovacuum on, and is gone after Stop.
func TestThrowawayCluster(t *testing.T) {
	t.Parallel()
	initdb, err := LookBin("initdb")
	if err != nil {
		t.Skipf("no PostgreSQL server binaries here: %v", err)
	}
	out, err := exec.Command(initdb, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", initdb, err)
	}
	m := regexp.MustCompile(`\(PostgreSQL\) (\S+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("%s --version says %q", initdb, out)
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
	var autovacuum, version string
	err = conn.QueryRow(t.Context(), "SELECT current_setting('autovacuum'), current_setting('server_version')").Scan(&autovacuum, &version)
	_ = conn.Close(context.Background())
	if err != nil || autovacuum != "on" {
		t.Errorf("autovacuum %q (%v)", autovacuum, err)
	}
	if got := strings.Fields(version + " ?")[0]; got != string(m[1]) {
		t.Errorf("the cluster runs PostgreSQL %q; %s is of %s", version, initdb, m[1])
	}
	t.Logf("the cluster runs PostgreSQL %s from %s", version, filepath.Dir(initdb))
	s.Stop()
	if _, err := pgx.Connect(t.Context(), s.URL); err == nil {
		t.Errorf("%s still answers after Stop", s.URL)
	}
	if _, err := os.Stat(s.dir); !os.IsNotExist(err) {
		t.Errorf("%s left after Stop (%v)", s.dir, err)
	}
}

// Find takes what PostgreSQL's client defaults reach, as psql would.
//
// Not parallel: it sets the PG* variables of the process (t.Setenv).
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

// Where nothing local answers, Acquire's last resort is the container
// fallback registered (by pgcontainer's import); with none registered its
// error says which import registers it, and with one that fails it says
// why.
//
// Not parallel: it replaces the process-wide registered container starter.
func TestAcquireFallsBackToARegisteredContainer(t *testing.T) {
	nothing := func(context.Context) (*Server, error) { return nil, errors.New("nothing local answers") }
	t.Cleanup(func() { RegisterContainer(nil) })

	RegisterContainer(nil)
	_, err := acquire(t.Context(), "SOME_URL", nothing)
	if !errors.Is(err, ErrNoContainer) || !strings.Contains(err.Error(), `import _ "`+ContainerImport+`"`) {
		t.Errorf("with no container fallback: %v; want ErrNoContainer and the import that adds one", err)
	}

	stopped := 0
	RegisterContainer(func(context.Context) (string, func(), error) {
		return "postgres://postgres@127.0.0.1:1/test", func() { stopped++ }, nil
	})
	s, err := acquire(t.Context(), "SOME_URL", nothing)
	if err != nil {
		t.Fatal(err)
	}
	type found struct {
		URL    string
		Source Source
	}
	if diff := cmp.Diff(found{"postgres://postgres@127.0.0.1:1/test", Container}, found{s.URL, s.Source}); diff != "" {
		t.Errorf("with a container fallback (-want +got):\n%s", diff)
	}
	s.Stop()
	if stopped != 1 {
		t.Errorf("Stop stopped the container %d times, want 1", stopped)
	}

	RegisterContainer(func(context.Context) (string, func(), error) { return "", nil, errors.New("docker is down") })
	_, err = acquire(t.Context(), "SOME_URL", nothing)
	if err == nil || errors.Is(err, ErrNoContainer) || !strings.Contains(err.Error(), "docker is down") ||
		!strings.Contains(err.Error(), "nothing local answers") {
		t.Errorf("with a failing container fallback: %v; want what each step said", err)
	}
}
