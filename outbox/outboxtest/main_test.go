package outboxtest_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/outbox/outboxtest"
)

// mainChild, when set, makes this test binary's TestMain call
// outboxtest.Main, as a user's would.
const mainChild = "OUTBOXTEST_MAIN_CHILD"

// With nothing to reach (no TEST_DATABASE_URL, client defaults pointing at
// a closed port), Main starts a throwaway cluster with the machine's
// server binaries, the tests publish on it through Connect and New, and
// the cluster's files are gone when the test binary exits.
func TestMainStartsAClusterWhenNothingAnswers(t *testing.T) {
	// The child gets its environment through cmd.Env and its cluster on a
	// port of its own: nothing of this process changes, so it runs beside
	// the other tests.
	t.Parallel()
	if _, err := exec.LookPath("initdb"); err != nil {
		if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb"); len(m) == 0 {
			t.Skip("no PostgreSQL server binaries here")
		}
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestChildOfMain$", "-test.v")
	cmd.Env = append(os.Environ(), mainChild+"=1", outboxtest.EnvURL+"=",
		"PGHOST=127.0.0.1", "PGPORT=1", "PGCONNECT_TIMEOUT=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	m := regexp.MustCompile(`outboxtest: TEST_DATABASE_URL is not set; testing on a throwaway cluster in (\S+)`).FindSubmatch(out)
	if m == nil || !regexp.MustCompile(`(?m)^--- PASS: TestChildOfMain`).Match(out) {
		t.Fatalf("the child did not run on a throwaway cluster:\n%s", out)
	}
	if _, err := os.Stat(string(m[1])); !os.IsNotExist(err) {
		t.Errorf("the cluster's directory %s is left after the tests (%v)", m[1], err)
	}
}

// TestChildOfMain runs only as TestMainStartsAClusterWhenNothingAnswers's
// child.
//
// Not parallel: it is the only test its process runs.
func TestChildOfMain(t *testing.T) {
	if os.Getenv(mainChild) == "" {
		t.Skip("runs as the child of TestMainStartsAClusterWhenNothingAnswers")
	}
	f := outboxtest.New(t, outboxtest.Connect(t), nil)
	if err := pgx.BeginFunc(t.Context(), f.Pool, func(tx pgx.Tx) error {
		return placeOrder(t.Context(), f.Outbox, tx, OrderPlaced{OrderID: "o-1"})
	}); err != nil {
		t.Fatal(err)
	}
	outboxtest.RequirePublished(t, f.Outbox, "orders", OrderPlaced{OrderID: "o-1"})
}
