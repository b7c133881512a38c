package localpg

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/postgres"
)

// Acquire returns the PostgreSQL the tests or the demo should use, trying
// in order: the URL in the environment variable env; what PostgreSQL's
// client defaults reach; a throwaway cluster made with the machine's
// server binaries; a testcontainers container, where Docker runs. Its
// error says what to install or set.
func Acquire(ctx context.Context, env string) (*Server, error) {
	if u := os.Getenv(env); u != "" {
		return &Server{URL: u, Source: FromEnv, How: "$" + env}, nil
	}
	s, err := Find(ctx)
	if err == nil {
		return s, nil
	}
	s, cerr := startContainer(ctx)
	if cerr == nil {
		return s, nil
	}
	return nil, fmt.Errorf("no PostgreSQL: %s is not set; %w; testcontainers: %w.\n"+
		"Install PostgreSQL (its server package, which brings initdb and pg_ctl) or Docker, "+
		"or set %s to a database you may create schemas in, e.g.\n"+
		"  %s='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'", env, err, cerr, env, env)
}

// startContainer starts PostgreSQL 15 in a container.
func startContainer(ctx context.Context) (*Server, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	ctr, err := postgres.Run(cctx, "postgres:15-alpine",
		postgres.WithDatabase("test"), postgres.WithUsername("postgres"), postgres.WithPassword("postgres"),
		postgres.BasicWaitStrategies())
	if err != nil {
		if ctr != nil {
			_ = testcontainers.TerminateContainer(ctr)
		}
		return nil, fmt.Errorf("start a PostgreSQL container (is Docker running?): %w", err)
	}
	stop := func() { _ = testcontainers.TerminateContainer(ctr) }
	dsn, err := ctr.ConnectionString(cctx, "sslmode=disable")
	if err != nil {
		stop()
		return nil, err
	}
	return &Server{URL: dsn, Source: Container, How: "a testcontainers container", stop: stop}, nil
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
