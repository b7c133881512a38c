// Command chaos breaks an outbox on purpose while it works, and counts
// every message.
//
// It migrates an outbox into a scratch schema, runs worker processes (this
// same program in worker mode, each with two subscribers of different
// lease TTLs), publishes messages with unique ids from transactions of its
// own (some rolled back, keyed and unkeyed, some scheduled), and records
// every handler call in the database. Meanwhile it kills workers with
// SIGKILL and restarts them, terminates their backends, cuts, stalls and
// leaves half-open one worker's connections through a fault proxy, and,
// with OUTBOX_CHAOS_RESTART_PG=1, restarts PostgreSQL once. Through a
// pooler, -server-dsn names the PostgreSQL behind it, so that backends
// are terminated on the server, and -listen-dsn gives the workers a
// direct LISTEN connection (SubscriberConfig.ListenDSN). Then it lets
// the outbox drain and checks the accounting: nothing lost, nothing rolled
// back delivered, per-key order kept, every duplicate explained by a
// fault, no two handlers of a row live at once, and every delivery's
// Message.Deliveries consistent with the recorded deliveries.
//
//	go run -race ./internal/chaos -duration 2m
//	DATABASE_URL=postgres://127.0.0.1:6432/app?default_query_exec_mode=exec \
//	  go run -race ./internal/chaos -server-dsn postgres://127.0.0.1:5432/app -listen-dsn postgres://127.0.0.1:5432/app
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	var (
		dsn      = flag.String("dsn", os.Getenv("DATABASE_URL"), "PostgreSQL URL (default $DATABASE_URL)")
		duration = flag.Duration("duration", 90*time.Second, "how long to publish and break things before draining")
		workers  = flag.Int("workers", 3, "worker processes")
		rate     = flag.Int("rate", 300, "messages published per second")
		keep     = flag.Bool("keep", false, "keep the scratch schema afterwards")
		worker   = flag.Int("worker", -1, "run as worker N (started by the coordinator)")
		schema   = flag.String("schema", "", "the outbox's schema (worker mode)")
		ends     = flag.String("ends", "", "the directory of the handlers' end records (worker mode)")
		roles    = flag.Bool("roles", false, "run as least-privileged roles: a migrator owns the outbox, publishers and workers connect as roles with only what outboxgen grants gives them")
		withRing = flag.Bool("ring", false, "write half of the messages into the log tier's ring (schema 13), unkeyed ones with plain SQL, keyed ones by a Publisher into the ring; the workers claim from both tiers")
		server   = flag.String("server-dsn", os.Getenv("OUTBOX_CHAOS_SERVER_URL"),
			"the PostgreSQL behind -dsn when that is a pooler; backends are terminated through it (default $OUTBOX_CHAOS_SERVER_URL, else -dsn)")
		listen = flag.String("listen-dsn", os.Getenv("OUTBOX_CHAOS_LISTEN_URL"),
			"the workers' LISTEN connection (SubscriberConfig.ListenDSN; default $OUTBOX_CHAOS_LISTEN_URL, else the pool's)")
	)
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if *dsn == "" {
		fmt.Fprintln(os.Stderr, "chaos: set DATABASE_URL or -dsn")
		os.Exit(2)
	}
	for name, v := range map[string]string{"-dsn": *dsn, "-server-dsn": *server, "-listen-dsn": *listen} {
		if _, err := url.Parse(v); err != nil {
			fmt.Fprintln(os.Stderr, "chaos: "+name+":", err)
			os.Exit(2)
		}
	}
	if *worker >= 0 {
		if err := runWorker(*dsn, *listen, *schema, *ends, *worker, log); err != nil {
			fmt.Fprintf(os.Stderr, "chaos worker %d: %v\n", *worker, err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := &coordinator{dsn: *dsn, serverDSN: *server, listenDSN: *listen, duration: *duration, workers: *workers, rate: *rate, keep: *keep,
		roles: *roles, ring: *withRing, log: log,
		restartPG: os.Getenv("OUTBOX_CHAOS_RESTART_PG") == "1"}
	ok, err := c.run(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos: FAIL:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}
