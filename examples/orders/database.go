package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/outboxgen/outboxgen/internal/localpg"
)

// database returns DATABASE_URL; when it is unset, what PostgreSQL's
// client defaults reach (as psql with no arguments), else a throwaway
// cluster made with the machine's server binaries, else, built with
// -tags container (container.go), a testcontainers container. The func
// stops what it started.
func database(ctx context.Context) (string, func(), error) {
	s, err := localpg.Acquire(ctx, "DATABASE_URL")
	if errors.Is(err, localpg.ErrNoContainer) {
		return "", nil, fmt.Errorf("%w\nwhich the demo does when built with -tags container:\n"+
			"  go run -tags container ./examples/orders", err)
	}
	if err != nil {
		return "", nil, err
	}
	if s.Source != localpg.FromEnv {
		fmt.Printf("DATABASE_URL is not set; using %s\n", s.How)
	}
	return s.URL, s.Stop, nil
}
