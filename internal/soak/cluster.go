package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/internal/localpg"
)

// clusterSettings are the private cluster's settings on top of
// localpg's: a server as production runs one (every commit flushed),
// with autovacuum tuned for busy queue tables (a visit every second, no
// cost pauses), pg_stat_statements for the claims' server time, and
// memory for the soak's connections.
var clusterSettings = []string{
	"fsync=on",
	"synchronous_commit=on",
	"full_page_writes=on",
	"shared_buffers=256MB",
	"autovacuum=on",
	"autovacuum_naptime=1s",
	"autovacuum_vacuum_scale_factor=0.01",
	"autovacuum_vacuum_insert_scale_factor=0.01",
	"autovacuum_vacuum_cost_limit=10000",
	"autovacuum_vacuum_cost_delay=0",
	"shared_preload_libraries=pg_stat_statements",
}

// privateCluster starts a throwaway cluster with clusterSettings, on port
// (0: a free one), and installs pg_stat_statements in its database. The
// caller stops it, which removes its files.
func privateCluster(ctx context.Context, port int) (*localpg.Server, error) {
	settings := clusterSettings
	if port != 0 {
		settings = append(settings[:len(settings):len(settings)], "port="+strconv.Itoa(port))
	}
	srv, err := localpg.StartCluster(ctx, settings...)
	if err != nil {
		return nil, fmt.Errorf("start a private cluster: %w", err)
	}
	if port != 0 {
		u := srv.URL
		srv.URL, err = withPort(u, port)
		if err != nil {
			srv.Stop()
			return nil, err
		}
	}
	conn, err := pgx.Connect(ctx, srv.URL)
	if err != nil {
		srv.Stop()
		return nil, fmt.Errorf("connect to the private cluster: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		srv.Stop()
		return nil, err
	}
	fmt.Printf("soak: a private cluster (%s) at %s\n", srv.How, srv.URL)
	return srv, nil
}

// withPort returns the URL u with its port replaced.
func withPort(u string, port int) (string, error) {
	p, err := url.Parse(u)
	if err != nil {
		return "", err
	}
	p.Host = net.JoinHostPort(p.Hostname(), strconv.Itoa(port))
	return p.String(), nil
}
