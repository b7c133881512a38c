package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/outbox"
)

// options are the harness's flags.
type options struct {
	bin                      string
	primaryPort, standbyPort int
	backlog                  int           // bulk rows published before the subscribers start
	publishers               int           // publishing goroutines
	period                   time.Duration // between one publisher's transactions
	killAt                   float64       // share of the backlog delivered when the primary dies
	lag                      time.Duration // how long the standby receives nothing before the primary dies
	outage                   time.Duration // from the primary's stop to the promotion request
	burst                    int           // bulk rows published at once after the promotion
	after                    time.Duration // publishing after the promotion
	drainTimeout             time.Duration
	keep, verbose, trace     bool
}

// leg is one run of the failover in one replication mode.
type leg struct {
	opt     options
	sync    bool
	log     *slog.Logger
	logs    *logCounter
	root    string
	primary *cluster
	standby *cluster
	dsn     string
	version string

	pool       *pgxpool.Pool // publishers and the harness
	probe      *pgxpool.Pool // handlers' and the sampler's queries
	pubs       *publishers
	workers    []*publisher
	deliveries *deliveryLog
	services   []*service
	samples    *sampler

	// When the primary was stopped, and when the standby accepted writes.
	killed, promoted time.Time
	// drained is when no row published before the promotion was left.
	drainedMu sync.Mutex
	drained   time.Time
	// backlogLeft is how many of those rows were left, second by second.
	backlogLeft []string

	// swept is how long the subscribers took, after the drain, to sweep
	// the lock records and hand-overs left; negative if they did not.
	swept time.Duration

	snap   snapshot
	report report
}

func (l *leg) mode() string {
	if l.sync {
		return "synchronous"
	}
	return "asynchronous"
}

// fail records a failed check.
func (l *leg) fail(format string, args ...any) {
	l.report.failures = append(l.report.failures, fmt.Sprintf(format, args...))
}

// run sets up the pair, runs the failover, and checks the accounting. An
// error means the harness could not run the leg; failed checks are in
// l.report.failures.
func (l *leg) run(ctx context.Context) (err error) {
	if l.root, err = os.MkdirTemp("", "outboxgen-failover-"); err != nil {
		return err
	}
	if !l.opt.keep {
		defer func() { _ = os.RemoveAll(l.root) }()
	} else {
		defer fmt.Fprintf(os.Stderr, "failover: kept %s\n", l.root)
	}
	cred, err := serverCred()
	if err != nil {
		return err
	}
	if cred != nil {
		if err := os.Chown(l.root, int(cred.Uid), int(cred.Gid)); err != nil {
			return err
		}
	}
	common := []string{"fsync=off", "wal_level=replica", "max_wal_senders=4", "max_replication_slots=4",
		"hot_standby=on", "max_connections=100", "wal_sender_timeout=10s", "log_lock_waits=on", "log_min_duration_statement=1000"}
	l.primary = &cluster{name: "primary", bin: l.opt.bin, root: l.root, data: filepath.Join(l.root, "primary"),
		port: l.opt.primaryPort, settings: common, cred: cred}
	l.standby = &cluster{name: "standby", bin: l.opt.bin, root: l.root, data: filepath.Join(l.root, "standby"),
		port: l.opt.standbyPort, settings: common, cred: cred}
	defer l.primary.stop()
	defer l.standby.stop()
	if err := l.setUp(ctx); err != nil {
		return err
	}
	defer l.pool.Close()
	defer l.probe.Close()
	return l.failover(ctx)
}

// setUp starts the primary, makes the standby, migrates the outbox and
// publishes the backlog.
func (l *leg) setUp(ctx context.Context) error {
	if err := l.primary.initdb(ctx); err != nil {
		return err
	}
	if err := l.primary.start(ctx); err != nil {
		return err
	}
	l.version = l.primary.version(ctx)
	if err := l.primary.exec1(ctx, "postgres", "CREATE DATABASE test"); err != nil {
		return err
	}
	if err := l.standby.basebackup(ctx, l.primary); err != nil {
		return err
	}
	if err := l.standby.start(ctx); err != nil {
		return err
	}
	if l.sync {
		// Set once the standby has its copy, which must not wait for a
		// standby of its own when promoted.
		if err := l.primary.exec1(ctx, "postgres", `ALTER SYSTEM SET synchronous_standby_names = '*'`); err != nil {
			return err
		}
		if err := l.primary.exec1(ctx, "postgres", `ALTER SYSTEM SET synchronous_commit = on`); err != nil {
			return err
		}
		if err := l.primary.exec1(ctx, "postgres", `SELECT pg_reload_conf()`); err != nil {
			return err
		}
	}
	if err := l.waitStreaming(ctx); err != nil {
		return err
	}
	// The DSN every client uses: both hosts, and only a server that
	// accepts writes will do.
	l.dsn = fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/test?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		l.primary.port, l.standby.port)
	cfg, err := pgxpool.ParseConfig(l.dsn)
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(l.opt.publishers + 2)
	if l.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return err
	}
	pcfg, err := pgxpool.ParseConfig(l.dsn)
	if err != nil {
		return err
	}
	pcfg.MaxConns = 6
	if l.probe, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return err
	}
	ob, err := outbox.New(l.pool, nil)
	if err != nil {
		return err
	}
	if err := ob.Migrate(ctx); err != nil {
		return err
	}
	if _, err := l.pool.Exec(ctx, ledgerDDL); err != nil {
		return err
	}
	if l.pubs, err = newPublishers(l.pool, ob); err != nil {
		return err
	}
	// The backlog: bulk rows in transactions of 500, and ten rows of each
	// key, so both claim paths have work when the subscribers start.
	for left := l.opt.backlog; left > 0; left -= 500 {
		if err := l.pubs.publish(ctx, queueBulk, "", l.pubs.bulkMsgs(min(left, 500))); err != nil {
			return fmt.Errorf("publishing the backlog: %w", err)
		}
	}
	for i := range l.opt.publishers {
		w := l.pubs.publisher(i)
		l.workers = append(l.workers, w)
		for range 10 {
			for k := range keysPerPublisher {
				if err := w.keyed(ctx, k); err != nil {
					return fmt.Errorf("publishing the backlog: %w", err)
				}
			}
		}
	}
	return nil
}

// waitStreaming waits until the standby streams from the primary (and,
// with synchronous replication, is its synchronous standby).
func (l *leg) waitStreaming(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, l.primary.url("postgres"))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	want := "async"
	if l.sync {
		want = "sync"
	}
	var state, syncState string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		err := conn.QueryRow(ctx, `SELECT state, sync_state FROM pg_stat_replication`).Scan(&state, &syncState)
		if err == nil && state == "streaming" && syncState == want {
			return nil
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
	}
	return fmt.Errorf("the standby did not stream (%s) within 30s: state %q, sync_state %q", want, state, syncState)
}

// failover runs publishers and subscribers, stops the primary mid-drain,
// promotes the standby, keeps publishing, drains and checks.
func (l *leg) failover(ctx context.Context) error {
	var err error
	if l.deliveries, err = openDeliveryLog(deliveryLogPath(l.root)); err != nil {
		return err
	}
	defer func() { _ = l.deliveries.close() }()
	for i := range 2 {
		s, err := newService(ctx, fmt.Sprintf("service-%d", i), l.dsn, l.probe, l.deliveries, l.log)
		if err != nil {
			return err
		}
		defer s.pool.Close()
		l.services = append(l.services, s)
	}
	runCtx, stopSubscribers := context.WithCancel(ctx)
	defer stopSubscribers()
	var subscribers sync.WaitGroup
	for _, s := range l.services {
		s.run(runCtx, &subscribers)
	}
	sampleCtx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	l.samples = newSampler(l.probe)
	var sampling sync.WaitGroup
	sampling.Go(func() { l.samples.run(sampleCtx) })

	pubCtx, stopPublishers := context.WithCancel(ctx)
	defer stopPublishers()
	var pubs sync.WaitGroup
	for _, w := range l.workers {
		pubs.Go(func() { w.run(pubCtx, l.opt.period) })
	}

	// Mid-drain: once part of the backlog was delivered.
	want := int64(l.opt.killAt * float64(l.opt.backlog))
	waited := time.Now()
	for l.deliveries.bulk.Load() < want && time.Since(waited) < 30*time.Second {
		time.Sleep(10 * time.Millisecond)
	}
	if got := l.deliveries.bulk.Load(); got < want {
		l.fail("only %d of the backlog's %d rows delivered in 30s before the failover", got, l.opt.backlog)
	}
	if err := l.kill(ctx); err != nil {
		return err
	}
	l.samples.mark(phaseOutage)
	if l.snap, err = takeSnapshot(ctx, l.standby); err != nil {
		return fmt.Errorf("reading the standby before its promotion: %w", err)
	}
	if d := l.opt.outage - time.Since(l.killed); d > 0 {
		time.Sleep(d)
	}
	if err := l.standby.promote(ctx); err != nil {
		return err
	}
	l.promoted = time.Now()
	l.samples.mark(phaseAfter)
	for _, s := range l.services {
		for _, w := range s.claims {
			w.since(l.promoted)
		}
	}
	// A backlog on the new primary too, more than two claims by lease
	// take at once, so claims by lock run there while the old primary's
	// records still hold their rows.
	var burst sync.WaitGroup
	burst.Go(func() {
		for left := l.opt.burst; left > 0 && ctx.Err() == nil; {
			if l.pubs.publish(ctx, queueBulk, "", l.pubs.bulkMsgs(min(left, 500))) == nil {
				left -= 500
			}
		}
	})
	var watch sync.WaitGroup
	watchCtx, stopWatching := context.WithCancel(ctx)
	defer stopWatching()
	watch.Go(func() { l.watchBacklog(watchCtx) })

	time.Sleep(l.opt.after)
	burst.Wait()
	stopPublishers()
	pubs.Wait()
	drainErr := l.waitDrained(ctx)
	stopWatching()
	watch.Wait()
	stopSampling()
	sampling.Wait()
	if drainErr != nil {
		l.fail("%v", drainErr)
	} else {
		l.swept = l.waitSwept(ctx)
	}
	for _, s := range l.services {
		if n := s.returned.Load(); n > 0 {
			l.fail("%s: %d subscriber Run call(s) returned before the stop: %v", s.name, n, s.errs)
		}
	}
	stopSubscribers()
	stopped := make(chan struct{})
	go func() { subscribers.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(outbox.GracefulTimeoutDefault + outbox.StopSlack + 5*time.Second):
		l.fail("subscribers did not stop within GracefulTimeout + StopSlack")
	}
	for _, s := range l.services {
		for _, err := range s.errs {
			l.fail("Run returned an error after the stop: %v", err)
		}
	}
	return l.check(ctx)
}

// kill makes the standby fall behind for opt.lag (its WAL sender is
// stopped, as a slow network would hold it back) while publishers and
// subscribers work, then stops the primary as a crash would.
func (l *leg) kill(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, l.primary.url("postgres"))
	if err != nil {
		return err
	}
	var walsender int
	err = conn.QueryRow(ctx, `SELECT pid FROM pg_stat_replication`).Scan(&walsender)
	_ = conn.Close(context.Background())
	if err != nil {
		return fmt.Errorf("finding the WAL sender: %w", err)
	}
	l.samples.mark(phaseLag)
	if l.opt.lag > 0 {
		if err := syscall.Kill(walsender, syscall.SIGSTOP); err != nil {
			return fmt.Errorf("holding the WAL sender back: %w", err)
		}
		time.Sleep(l.opt.lag)
	}
	l.killed = time.Now()
	return l.primary.stopImmediate(walsender)
}

// watchBacklog notes when the new primary holds no row published before
// the promotion, and how many it held each second until then.
func (l *leg) watchBacklog(ctx context.Context) {
	next := time.Duration(0)
	for ctx.Err() == nil {
		var n int64
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		err := l.probe.QueryRow(qctx, `SELECT count(*) FROM outbox WHERE created_at < $1`, l.promoted).Scan(&n)
		cancel()
		if since := time.Since(l.promoted); err == nil && since >= next && l.opt.trace {
			l.trace(ctx, since)
		}
		if since := time.Since(l.promoted); err == nil && since >= next {
			l.drainedMu.Lock()
			l.backlogLeft = append(l.backlogLeft, fmt.Sprintf("%ds %d", int(since.Seconds()), n))
			l.drainedMu.Unlock()
			next = since.Truncate(time.Second) + time.Second
		}
		if err == nil && n == 0 {
			l.drainedMu.Lock()
			l.drained = time.Now()
			l.drainedMu.Unlock()
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitDrained waits until every message of the new primary's ledger was
// delivered and the outbox is empty.
func (l *leg) waitDrained(ctx context.Context) error {
	var ids []int64
	if err := l.pool.QueryRow(ctx, `SELECT coalesce(array_agg(msg_id), '{}') FROM ledger`).Scan(&ids); err != nil {
		return fmt.Errorf("reading the ledger: %w", err)
	}
	var missing int
	var left int64
	for deadline := time.Now().Add(l.opt.drainTimeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		missing = l.deliveries.delivered(ids)
		if err := l.pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&left); err != nil {
			return err
		}
		if missing == 0 && left == 0 {
			l.drainedMu.Lock()
			if l.drained.IsZero() {
				l.drained = time.Now()
			}
			l.drainedMu.Unlock()
			return nil
		}
	}
	var held string
	_ = l.pool.QueryRow(ctx, `SELECT format('%s leased, %s blocked, %s named by lock records still holding, %s hand-overs recorded',
		(SELECT count(*) FROM outbox WHERE acquired_token IS NOT NULL), (SELECT count(*) FROM outbox WHERE blocked),
		(SELECT count(*) FROM outbox o WHERE EXISTS (SELECT FROM outbox_locks l WHERE o.id <@ l.ids AND l.until > now())),
		(SELECT count(*) FROM outbox_handoff))`).Scan(&held)
	return fmt.Errorf("not drained %v after the promotion: %d ledger messages never delivered, %d rows left in the outbox (%s)",
		time.Since(l.promoted).Round(time.Second), missing, left, held)
}

// trace prints where the rows published before the promotion are.
func (l *leg) trace(ctx context.Context, since time.Duration) {
	var line string
	err := l.probe.QueryRow(ctx, `SELECT format('free %s, leased %s (expired %s), held by a record %s, by an ended record %s; records: %s',
		count(*) FILTER (WHERE o.acquired_token IS NULL AND NOT h.holds AND NOT h.ended),
		count(*) FILTER (WHERE o.acquired_token IS NOT NULL),
		count(*) FILTER (WHERE o.lease_expires_at < now()),
		count(*) FILTER (WHERE h.holds), count(*) FILTER (WHERE h.ended AND NOT h.holds),
		(SELECT string_agg(format('%s:%s+%s', r.xid, to_char(r.claimed_at, 'MI:SS.MS'), round(extract(epoch FROM r.until - r.claimed_at))), ' ')
		 FROM outbox_locks r))
		FROM outbox o
		CROSS JOIN LATERAL (SELECT coalesce(bool_or(r.until > now()), false) AS holds, coalesce(bool_or(r.until <= now()), false) AS ended
		                    FROM outbox_locks r WHERE o.id <@ r.ids) h
		WHERE o.created_at < $1`, l.promoted).Scan(&line)
	if err != nil {
		line = err.Error()
	}
	fmt.Fprintf(os.Stderr, "trace +%v %s: %s\n", since.Round(100*time.Millisecond), time.Now().Format("04:05.000"), line)
}

// waitSwept waits, for up to three MaxFetchIntervals, until no lock record
// and no hand-over is left (the subscribers sweep records no claim needs
// every MaxFetchInterval), and returns how long that took, or -1.
func (l *leg) waitSwept(ctx context.Context) time.Duration {
	began := time.Now()
	for time.Since(began) < 3*outbox.MaxFetchIntervalDefault {
		var n int64
		err := l.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_locks) + (SELECT count(*) FROM outbox_handoff)`).Scan(&n)
		if err == nil && n == 0 {
			return time.Since(began)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return -1
}
