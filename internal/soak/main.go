// Command soak runs outboxgen under steady load for a long time and prints
// what must stay flat: throughput, commit-to-handler latency, the time of
// the subscribers' claims, the process's memory and goroutines, and the
// outbox table's dead tuples and size. A phase in the middle holds a
// transaction open, idle, on a connection of its own, which pins vacuum's
// horizon; the figures show what that costs and how fast it heals.
//
//	DATABASE_URL='postgres://postgres@127.0.0.1:5434/soak?sslmode=disable' go run ./internal/soak -duration 10m
//
// The load is a mix of four queues (see mix.go): orders keyed by customer,
// emails, webhooks that fail and retry often and are sometimes rejected,
// and reminders scheduled seconds ahead. It publishes -rate messages per
// second from -writers concurrent transactions, well below what the
// library can take, so every figure measures steady state, not a backlog.
//
// It works in the schema -schema, which it recreates. docs/reliability.md
// ("Soak") gives the database setup (autovacuum on: the table is a queue)
// and the figures of a full run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/outbox"
)

// options are the command's flags.
type options struct {
	duration time.Duration // how long to publish
	rate     float64       // messages per second
	writers  int           // concurrent publishing transactions
	sample   time.Duration // interval of the fine lines
	report   time.Duration // interval of the table's rows
	holdAt   time.Duration // when the idle transaction opens
	holdFor  time.Duration // how long it stays open; 0: no hold phase
	holdKind string        // holdXID or holdSnapshot
	compare  bool          // run without the hold first, then with it, and compare
	cluster  bool          // start a private cluster instead of DATABASE_URL
	port     int           // the private cluster's port; 0: a free one
	drain    time.Duration // wait at the end for due rows
	schema   string
	ring     bool // write into the log tier's ring instead of Publish
}

func main() {
	var o options
	flag.DurationVar(&o.duration, "duration", 10*time.Minute, "how long to publish")
	flag.Float64Var(&o.rate, "rate", 1000, "messages published per second, across the queues")
	flag.IntVar(&o.writers, "writers", 4, "concurrent publishing transactions")
	flag.DurationVar(&o.sample, "sample", 10*time.Second, "interval of the fine lines (and of the hold phase's timeline)")
	flag.DurationVar(&o.report, "report", time.Minute, "interval of the table's rows; a multiple of -sample")
	flag.DurationVar(&o.holdAt, "hold-at", 4*time.Minute, "when to open the idle transaction that pins vacuum's horizon")
	flag.DurationVar(&o.holdFor, "hold-for", 2*time.Minute, "how long to keep it open; 0 runs without the phase")
	flag.StringVar(&o.holdKind, "hold-kind", holdXID, "the idle transaction: xid (BEGIN; SELECT txid_current()) or snapshot (BEGIN ISOLATION LEVEL REPEATABLE READ and a first query)")
	flag.BoolVar(&o.compare, "compare", false, "run twice, without the idle transaction and then with it, and compare them minute by minute")
	flag.BoolVar(&o.cluster, "cluster", false, "start a private PostgreSQL cluster (fsync on, aggressive autovacuum, pg_stat_statements) instead of using DATABASE_URL")
	flag.IntVar(&o.port, "port", 0, "the private cluster's port (-cluster); 0 takes a free one")
	flag.DurationVar(&o.drain, "drain", time.Minute, "how long to wait at the end for due rows to be handled")
	flag.StringVar(&o.schema, "schema", "outboxgen_soak", "schema of the soak's outbox; dropped and recreated")
	flag.BoolVar(&o.ring, "ring", false, "add the log tier's ring (internal/ring) beside the outbox table and write every message into it with a plain SQL INSERT instead of Publish")
	flag.Parse()
	if err := o.check(); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := start(ctx, &o); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func (o *options) check() error {
	switch {
	case o.duration <= 0:
		return errors.New("-duration must be positive")
	case !(o.rate > 0):
		return errors.New("-rate must be positive")
	case o.writers < 1:
		return errors.New("-writers must be at least 1")
	case o.sample <= 0:
		return errors.New("-sample must be positive")
	case o.report < o.sample || o.report%o.sample != 0:
		return fmt.Errorf("-report (%v) must be a multiple of -sample (%v)", o.report, o.sample)
	case o.holdFor < 0 || o.holdAt < 0:
		return errors.New("-hold-at and -hold-for must not be negative")
	case o.drain < 0:
		return errors.New("-drain must not be negative")
	case o.holdKind != holdXID && o.holdKind != holdSnapshot:
		return fmt.Errorf("-hold-kind is %s or %s, not %q", holdXID, holdSnapshot, o.holdKind)
	case o.compare && !o.holds():
		return errors.New("-compare needs a hold phase within -duration")
	case o.port < 0 || o.port > 65535:
		return errors.New("-port must be a TCP port")
	}
	return nil
}

// holds reports whether the run has a hold phase: it is asked for and
// fits in the run.
func (o *options) holds() bool { return o.holdFor > 0 && o.holdAt+o.holdFor <= o.duration }

// start finds the database, runs the soak once, or twice with -compare,
// and reports.
func start(ctx context.Context, o *options) error {
	dsn := os.Getenv("DATABASE_URL")
	if o.cluster {
		srv, err := privateCluster(ctx, o.port)
		if err != nil {
			return err
		}
		defer srv.Stop()
		dsn = srv.URL
	}
	if dsn == "" {
		return errors.New("DATABASE_URL is not set; point it at a PostgreSQL you may create a schema in, e.g.\n" +
			"  DATABASE_URL='postgres://postgres@127.0.0.1:5434/soak?sslmode=disable' make soak\n" +
			"docs/reliability.md (\"Soak\") starts a private cluster with autovacuum on; -cluster starts one itself")
	}
	if !o.compare {
		res, err := run(ctx, o, dsn)
		if err != nil {
			return err
		}
		return res.check()
	}
	unheld := *o
	unheld.holdFor = 0
	fmt.Printf("soak: run 1 of 2: without the idle transaction\n")
	base, err := run(ctx, &unheld, dsn)
	if err != nil {
		return fmt.Errorf("the run without the idle transaction: %w", err)
	}
	fmt.Printf("soak: run 2 of 2: with the idle transaction (%s) from %v to %v\n", o.holdKind, o.holdAt, o.holdAt+o.holdFor)
	held, err := run(ctx, o, dsn)
	if err != nil {
		return fmt.Errorf("the run with the idle transaction: %w", err)
	}
	compare(os.Stdout, o, base, held)
	return errors.Join(base.check(), held.check())
}

// result is what one run measured.
type result struct {
	rows      []row // the table's rows (-report)
	held      holdResult
	acct      accounting
	left, due int64 // rows left at the end, and of those still due
	published time.Duration
	server    string
}

// check fails a run that lost a message or did not drain: rows still due
// after -drain mean the subscribers fell behind for good.
func (r *result) check() error {
	var errs []error
	if r.acct.lost != 0 {
		errs = append(errs, fmt.Errorf("%d messages unaccounted for", r.acct.lost))
	}
	if r.due != 0 {
		errs = append(errs, fmt.Errorf("%d rows still due or leased after the wait for due rows: the drain did not finish", r.due))
	}
	return errors.Join(errs...)
}

func run(ctx context.Context, o *options, dsn string) (*result, error) {
	claims := &claimTimer{}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	// Writers, four subscribers (claims, acknowledgements, heartbeats,
	// hand-overs) and the sampler: a pool that never makes them queue.
	cfg.MaxConns = int32(o.writers + 24)
	cfg.ConnConfig.Tracer = claims
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{o.schema}.Sanitize()+" CASCADE"); err != nil {
		return nil, fmt.Errorf("reset the soak's schema: %w", err)
	}
	ob, err := outbox.New(pool, &outbox.Config{Schema: o.schema, Table: table})
	if err != nil {
		return nil, err
	}
	if err := ob.Migrate(ctx); err != nil {
		return nil, err
	}
	s, err := newSoak(ob, pool)
	if err != nil {
		return nil, err
	}
	probe, err := newDBProbe(ctx, pool, o.schema)
	if err != nil {
		return nil, err
	}
	if o.ring {
		if s.ring, err = newRingWriter(ctx, pool, o.schema); err != nil {
			return nil, err
		}
		probe.unread = s.ring.unread
		fmt.Printf("soak: writing into the ring beside the outbox table (-ring)\n")
	}
	fmt.Printf("soak: %v at %.0f msgs/s from %d writers on %s\n", o.duration, o.rate, o.writers, probe.server)
	fmt.Printf("soak: autovacuum %s; claim server time: %s\n", probe.autovacuum, probe.statementsNote())
	if o.holdFor > 0 && !o.holds() {
		fmt.Printf("soak: no hold phase: -hold-at %v plus -hold-for %v is past -duration %v\n", o.holdAt, o.holdFor, o.duration)
	}

	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	subs := make([]*outbox.Subscriber[Event], len(subscribers))
	for i, spec := range subscribers {
		if subs[i], err = s.subscriber(spec, quiet); err != nil {
			return nil, err
		}
	}
	// The subscribers stop after the wait for due rows, not at an
	// interrupt, so their last outcomes are written and counted.
	subCtx, stopSubs := context.WithCancel(context.WithoutCancel(ctx))
	defer stopSubs()
	var running sync.WaitGroup
	subErrs := make(chan error, len(subs))
	for i, sub := range subs {
		running.Go(func() {
			if err := sub.Run(subCtx); err != nil {
				subErrs <- fmt.Errorf("subscriber %s: %w", subscribers[i].name, err)
			}
		})
	}

	start := time.Now()
	sm := newSampler(o, start, s, claims, probe)
	pubCtx, stopPub := context.WithDeadline(ctx, start.Add(o.duration))
	defer stopPub()
	var bg sync.WaitGroup
	var held holdResult
	if o.holds() {
		bg.Go(func() { held = hold(pubCtx, cfg.ConnConfig, start, o.holdAt, o.holdFor, o.holdKind, sm) })
	}
	bg.Go(func() { sm.loop(pubCtx) })
	s.publish(pubCtx, start, o.rate, o.writers)
	stopPub()
	bg.Wait()
	published := time.Since(start)

	fmt.Printf("soak: publishing ended after %v; waiting up to %v for due rows\n", published.Round(time.Millisecond), o.drain)
	left, due, err := probe.waitDue(ctx, o.drain)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak: waiting for due rows:", err)
	}
	stopSubs()
	running.Wait()
	close(subErrs)
	var errs []error
	for err := range subErrs {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	acct, err := s.account(context.WithoutCancel(ctx), probe)
	if err != nil {
		return nil, err
	}
	report(os.Stdout, o, sm, held, acct, left, published)
	_, rows := sm.snapshot()
	return &result{rows: rows, held: held, acct: acct, left: left, due: due, published: published, server: probe.server}, nil
}
