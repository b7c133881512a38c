package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/outbox"
)

// deliveryLog is a file of handler calls, one line per delivery:
// "msg-id start end deliveries claim subscriber", times in Unix
// nanoseconds. It lives on disk, not in the database, so the failover
// cannot lose it; a handler appends its line before it returns.
type deliveryLog struct {
	mu sync.Mutex
	f  *os.File
	// first is each message's first delivery, for the harness's progress.
	first map[int64]time.Time
	// bulk counts deliveries of the bulk queue.
	bulk atomic.Int64
}

func openDeliveryLog(path string) (*deliveryLog, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &deliveryLog{f: f, first: map[int64]time.Time{}}, nil
}

func (l *deliveryLog) write(id int64, start, end time.Time, deliveries int, claim, sub string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.first[id]; !ok {
		l.first[id] = start
	}
	_, err := fmt.Fprintf(l.f, "%d %d %d %d %s %s\n", id, start.UnixNano(), end.UnixNano(), deliveries, claim, sub)
	return err
}

// delivered reports whether every message of ids was delivered.
func (l *deliveryLog) delivered(ids []int64) (missing int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		if _, ok := l.first[id]; !ok {
			missing++
		}
	}
	return missing
}

func (l *deliveryLog) close() error { return l.f.Close() }

// delivery is one line of the delivery log.
type delivery struct {
	id         int64
	at, end    time.Time // the handler's start and return
	deliveries int
	claim      string // lock, lease, gone or unknown
	sub        string
}

// readDeliveries reads the delivery log back.
func readDeliveries(path string) ([]delivery, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var out []delivery
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 6 {
			return nil, fmt.Errorf("%s: malformed line %q", path, sc.Text())
		}
		id, err1 := strconv.ParseInt(fs[0], 10, 64)
		start, err2 := strconv.ParseInt(fs[1], 10, 64)
		end, err3 := strconv.ParseInt(fs[2], 10, 64)
		n, err4 := strconv.Atoi(fs[3])
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			return nil, fmt.Errorf("%s: %q: %w", path, sc.Text(), err)
		}
		out = append(out, delivery{id: id, at: time.Unix(0, start), end: time.Unix(0, end), deliveries: n, claim: fs[4], sub: fs[5]})
	}
	return out, sc.Err()
}

// service is one subscribing process's worth: a pool of its own and a
// subscriber of each queue, with the default configuration.
type service struct {
	name  string
	pool  *pgxpool.Pool
	subs  []*outbox.Subscriber[msg]
	log   *deliveryLog
	probe *pgxpool.Pool // the handlers' own queries
	// claims notes each subscriber's successful claims.
	claims map[string]*claimWatch
	// returned counts the Run calls that returned, and errs their errors.
	returned atomic.Int64
	errMu    sync.Mutex
	errs     []error
}

// servicePoolConns: two claims by lock in flight per subscriber, their
// records and the lease path's writes (docs/claims.md, "What it costs").
const servicePoolConns = 10

func newService(ctx context.Context, name, dsn string, probe *pgxpool.Pool, log *deliveryLog, logger *slog.Logger) (*service, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = servicePoolConns
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	ob, err := outbox.New(pool, nil)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s := &service{name: name, pool: pool, log: log, probe: probe, claims: map[string]*claimWatch{}}
	for _, q := range []string{queueBulk, queueKeyed} {
		// The default configuration but its name, logger and metrics,
		// which change nothing it does.
		w := &claimWatch{}
		s.claims[name+"/"+q] = w
		sub, err := outbox.NewSubscriber(ob, []string{q}, s.handler(name+"/"+q), &outbox.SubscriberConfig[msg]{
			Name: name + "/" + q, Logger: logger, Metrics: w,
		})
		if err != nil {
			pool.Close()
			return nil, err
		}
		s.subs = append(s.subs, sub)
	}
	return s, nil
}

// claimWatch is a subscriber's metrics recorder: it notes its first
// successful claim (one that found rows or not) after a time.
type claimWatch struct {
	after, first atomic.Int64 // Unix nanoseconds
}

// Record implements outbox.MetricsRecorder.
func (w *claimWatch) Record(ev outbox.MetricEvent) {
	if ev.Name != outbox.EventFetched {
		return
	}
	if after := w.after.Load(); after != 0 {
		if now := time.Now().UnixNano(); now > after {
			w.first.CompareAndSwap(0, now)
		}
	}
}

// since notes claims from t on.
func (w *claimWatch) since(t time.Time) { w.after.Store(t.UnixNano()) }

// firstSince returns when the first claim since t succeeded, or zero.
func (w *claimWatch) firstSince() time.Time {
	if n := w.first.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// claimSampleEvery: one bulk delivery in claimSampleEvery asks the
// database which kind of claim holds its row; every keyed one does.
const claimSampleEvery = 4

// handler records the delivery's start, with the kind of claim that
// holds its row (read as committed: a claim by lock wrote nothing to the
// row, a claim by lease its token), works, and returns.
func (s *service) handler(sub string) outbox.Handler[msg] {
	return func(ctx context.Context, m *outbox.Message[msg]) error {
		start := time.Now()
		claim := "-"
		if m.Queue == queueKeyed || rand.IntN(claimSampleEvery) == 0 {
			claim = "unknown"
			qctx, cancel := context.WithTimeout(ctx, time.Second)
			var byLock bool
			err := s.probe.QueryRow(qctx, `SELECT acquired_token IS NULL FROM outbox WHERE id = $1`, m.ID).Scan(&byLock)
			cancel()
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				claim = "gone"
			case err == nil && byLock:
				claim = "lock"
			case err == nil:
				claim = "lease"
			}
		}
		if m.Queue == queueBulk {
			s.log.bulk.Add(1)
		}
		var err error
		select {
		case <-time.After(time.Duration(m.Payload.WorkMS) * time.Millisecond):
		case <-ctx.Done():
			err = context.Cause(ctx)
		}
		if werr := s.log.write(m.Payload.ID, start, time.Now(), m.Deliveries, claim, sub); werr != nil {
			return werr
		}
		return err
	}
}

// run runs the service's subscribers until ctx ends.
func (s *service) run(ctx context.Context, wg *sync.WaitGroup) {
	for _, sub := range s.subs {
		wg.Go(func() {
			err := sub.Run(ctx)
			s.returned.Add(1)
			if err != nil {
				s.errMu.Lock()
				s.errs = append(s.errs, fmt.Errorf("%s: %w", sub.Config().Name, err))
				s.errMu.Unlock()
			}
		})
	}
}

// deliveryLogPath is the delivery log of a leg's run in dir.
func deliveryLogPath(dir string) string { return filepath.Join(dir, "deliveries.log") }
