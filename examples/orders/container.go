//go:build container

package main

// Built with -tags container, the demo falls back to a PostgreSQL
// container where Docker runs (go run -tags container ./examples/orders);
// without the tag it does not link testcontainers.
import _ "github.com/outboxgen/outboxgen/outbox/outboxtest/pgcontainer"
