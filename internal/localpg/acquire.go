package localpg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
)

// ContainerImport is the package whose import (for its side effect, as a
// database/sql driver's) lets Acquire fall back to a PostgreSQL container
// through testcontainers. Nothing else links testcontainers.
const ContainerImport = "github.com/outboxgen/outboxgen/outbox/outboxtest/pgcontainer"

var (
	containerMu    sync.Mutex
	startContainer func(context.Context) (url string, stop func(), err error)
)

// RegisterContainer makes start Acquire's last resort: it starts a
// PostgreSQL (in a container) and returns its URL and how to stop it.
// ContainerImport calls it from its init.
func RegisterContainer(start func(ctx context.Context) (url string, stop func(), err error)) {
	containerMu.Lock()
	defer containerMu.Unlock()
	startContainer = start
}

// ErrNoContainer is what Acquire's error wraps when it found nothing and
// nothing registered a container fallback (ContainerImport).
var ErrNoContainer = errors.New("no container fallback: nothing imports " + ContainerImport)

// Acquire returns the PostgreSQL the tests or the demo should use, trying
// in order: the URL in the environment variable env; what PostgreSQL's
// client defaults reach; a throwaway cluster made with the machine's
// server binaries; a container, where Docker runs, when ContainerImport
// is linked in (RegisterContainer). Its error says what to install, set
// or import.
func Acquire(ctx context.Context, env string) (*Server, error) {
	if u := os.Getenv(env); u != "" {
		return &Server{URL: u, Source: FromEnv, How: "$" + env}, nil
	}
	return acquire(ctx, env, Find)
}

// acquire is Acquire after env, finding what is local with find.
func acquire(ctx context.Context, env string, find func(context.Context) (*Server, error)) (*Server, error) {
	s, err := find(ctx)
	if err == nil {
		return s, nil
	}
	containerMu.Lock()
	start := startContainer
	containerMu.Unlock()
	if start == nil {
		return nil, fmt.Errorf("no PostgreSQL: %s is not set; %w; %w.\n"+
			"Install PostgreSQL (its server package, which brings initdb and pg_ctl), "+
			"or set %s to a database you may create schemas in, e.g.\n"+
			"  %s='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'\n"+
			"or, to fall back to a PostgreSQL container where Docker runs, add to the tests (or the program)\n"+
			"  import _ %q", env, err, ErrNoContainer, env, env, ContainerImport)
	}
	url, stop, cerr := start(ctx)
	if cerr == nil {
		return &Server{URL: url, Source: Container, How: "a testcontainers container", stop: stop}, nil
	}
	return nil, fmt.Errorf("no PostgreSQL: %s is not set; %w; a container: %w.\n"+
		"Install PostgreSQL (its server package, which brings initdb and pg_ctl) or start Docker, "+
		"or set %s to a database you may create schemas in, e.g.\n"+
		"  %s='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'", env, err, cerr, env, env)
}

// RunTests is the body of a test binary's TestMain: it acquires a server
// (Acquire), sets env to its URL when it came from elsewhere, so that code
// under test that reads env finds it, and says so on stderr under the
// name who. It then calls run with the server, or with nil and the error
// saying what to install or set, and stops what it started when run
// returns run's exit code.
func RunTests(env, who string, run func(*Server, error) int) int {
	srv, err := Acquire(context.Background(), env)
	if err == nil && srv.Source != FromEnv {
		fmt.Fprintf(os.Stderr, "%s: %s is not set; testing on %s\n", who, env, srv.How)
		_ = os.Setenv(env, srv.URL)
	}
	if srv != nil {
		defer srv.Stop()
	}
	return run(srv, err)
}
