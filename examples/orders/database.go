package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/postgres"
)

// database returns DATABASE_URL, or starts PostgreSQL in a container when
// it is unset and Docker is available.
func database(ctx context.Context) (string, func(), error) {
	if dsn := os.Getenv("DATABASE_URL"); dsn != "" {
		return dsn, func() {}, nil
	}
	fmt.Println("DATABASE_URL is not set; starting PostgreSQL with testcontainers...")
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	ctr, err := postgres.Run(cctx, "postgres:15-alpine",
		postgres.WithDatabase("demo"), postgres.WithUsername("postgres"), postgres.WithPassword("postgres"),
		postgres.BasicWaitStrategies())
	if err != nil {
		return "", nil, errors.New("no database: DATABASE_URL is not set and Docker is not available to start one.\n" +
			"Point the demo at a PostgreSQL you may create a schema in, e.g.\n" +
			"  DATABASE_URL='postgres://postgres@127.0.0.1:5432/test?sslmode=disable' make demo")
	}
	cleanup := func() { _ = testcontainers.TerminateContainer(ctr) }
	dsn, err := ctr.ConnectionString(cctx, "sslmode=disable")
	if err != nil {
		cleanup()
		return "", nil, err
	}
	return dsn, cleanup, nil
}
