package main

import (
	"context"
	"fmt"

	"github.com/outboxgen/outboxgen/internal/localpg"
)

// database returns DATABASE_URL; when it is unset, what PostgreSQL's
// client defaults reach (as psql with no arguments), else a throwaway
// cluster made with the machine's server binaries, else a testcontainers
// container. The func stops what it started.
func database(ctx context.Context) (string, func(), error) {
	s, err := localpg.Acquire(ctx, "DATABASE_URL")
	if err != nil {
		return "", nil, err
	}
	if s.Source != localpg.FromEnv {
		fmt.Printf("DATABASE_URL is not set; using %s\n", s.How)
	}
	return s.URL, s.Stop, nil
}
