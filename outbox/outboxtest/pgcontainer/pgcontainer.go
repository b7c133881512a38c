// Package pgcontainer lets tests fall back to a PostgreSQL container,
// started through testcontainers where Docker runs, when there is no
// other database: imported for its side effect, as a database/sql driver
// is,
//
//	import _ "github.com/outboxgen/outboxgen/outbox/outboxtest/pgcontainer"
//
// it makes a container the last resort of
// [github.com/outboxgen/outboxgen/outbox/outboxtest.Main], after
// $TEST_DATABASE_URL, what PostgreSQL's client defaults reach and a
// throwaway cluster made with the machine's server binaries. Main removes
// the container when the tests end.
//
// Only test binaries (or programs) that import this package link
// testcontainers and the Docker client; outboxtest and outbox do not.
package pgcontainer

import (
	"context"
	"fmt"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/outboxgen/outboxgen/internal/localpg"
)

func init() { localpg.RegisterContainer(Start) }

// Image is the PostgreSQL image [Start] runs.
const Image = "postgres:15-alpine"

// Start starts PostgreSQL ([Image]) in a container and returns a URL of
// its database and a func that removes the container. Its error says when
// Docker does not answer.
func Start(ctx context.Context) (url string, stop func(), err error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	ctr, err := postgres.Run(cctx, Image,
		postgres.WithDatabase("test"), postgres.WithUsername("postgres"), postgres.WithPassword("postgres"),
		postgres.BasicWaitStrategies())
	if err != nil {
		if ctr != nil {
			_ = testcontainers.TerminateContainer(ctr)
		}
		return "", nil, fmt.Errorf("start a PostgreSQL container (is Docker running?): %w", err)
	}
	stop = func() { _ = testcontainers.TerminateContainer(ctr) }
	url, err = ctr.ConnectionString(cctx, "sslmode=disable")
	if err != nil {
		stop()
		return "", nil, err
	}
	return url, stop, nil
}
