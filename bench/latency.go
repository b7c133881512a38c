package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/outboxgen/outboxgen/outbox"
)

// latencyRate is the publishing rate of the latency suite; ours is also
// measured at latencyFastRate.
const (
	latencyRate     = 200
	latencyFastRate = 1000
)

// runLatency publishes one message per transaction at about 200/s to an
// idle subscriber at its default configuration and measures from the
// publisher's commit to the handler.
// Each round runs ours (at 200/s and at 1,000/s), then River at 200/s with
// its default fetch settings and with its benchmarks' faster ones.
func runLatency(ctx context.Context, env *benchEnv, o options) error {
	n := max(int(1000*o.scale), 20)
	lat := map[string][]time.Duration{}
	for range o.rounds {
		if err := env.reset(ctx); err != nil {
			return err
		}
		l, err := latencyOutbox(ctx, env, n, latencyRate)
		if err != nil {
			return err
		}
		lat["outbox Subscriber"] = append(lat["outbox Subscriber"], l...)
		if l, err = latencyOutbox(ctx, env, n, latencyFastRate); err != nil {
			return err
		}
		lat["outbox Subscriber, 1000/s"] = append(lat["outbox Subscriber, 1000/s"], l...)
		if l, err = latencyRiver(ctx, env, n, false); err != nil {
			return err
		}
		lat["river (defaults)"] = append(lat["river (defaults)"], l...)
		if l, err = latencyRiver(ctx, env, n, true); err != nil {
			return err
		}
		lat["river (2ms cooldown)"] = append(lat["river (2ms cooldown)"], l...)
	}
	fmt.Fprintf(o.out, "%d messages per round at %d/s (ours also at %d/s), commit to handler\n", n, latencyRate, latencyFastRate)
	tw := tabwriter.NewWriter(o.out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "contender\tp50\tp90\tp99\tmax\t")
	for _, name := range []string{"outbox Subscriber", "outbox Subscriber, 1000/s", "river (defaults)", "river (2ms cooldown)"} {
		l := lat[name]
		slices.Sort(l)
		q := func(f float64) time.Duration { return l[int(f*float64(len(l)-1))].Round(10 * time.Microsecond) }
		fmt.Fprintf(tw, "%s\t%v\t%v\t%v\t%v\t\n", name, q(0.5), q(0.9), q(0.99), q(1))
	}
	return tw.Flush()
}

// commits pairs each message's commit with its handling. A handler can
// run before the publisher hears its COMMIT succeed (the row is visible as
// soon as the server commits); such a message counts as latency 0.
type commits struct {
	mu        sync.Mutex
	committed map[int]time.Time
	handledAt map[int]time.Time
	lat       []time.Duration
	done      chan struct{}
	n         int
}

func newCommits(n int) *commits {
	return &commits{committed: make(map[int]time.Time, n), handledAt: map[int]time.Time{}, done: make(chan struct{}), n: n}
}

func (c *commits) commit(i int) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if at, ok := c.handledAt[i]; ok {
		c.record(max(at.Sub(now), 0))
		return
	}
	c.committed[i] = now
}

func (c *commits) handled(i int) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if at, ok := c.committed[i]; ok {
		c.record(now.Sub(at))
		return
	}
	c.handledAt[i] = now
}

// record keeps one latency; c.mu is held.
func (c *commits) record(d time.Duration) {
	c.lat = append(c.lat, d)
	if len(c.lat) == c.n {
		close(c.done)
	}
}

// publishPaced runs publish for i in [0, n) at rate per second, each in
// its own transaction, and records commit times.
func publishPaced(ctx context.Context, env *benchEnv, c *commits, rate int, publish func(tx pgx.Tx, i int) error) error {
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range c.n {
		<-tick.C
		tx, err := env.pool.Begin(ctx)
		if err != nil {
			return err
		}
		if err := publish(tx, i); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		c.commit(i)
	}
	select {
	case <-c.done:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("only %d of %d messages measured", len(c.lat), c.n)
	}
}

func latencyOutbox(ctx context.Context, env *benchEnv, n, rate int) ([]time.Duration, error) {
	c := newCommits(n)
	sub, err := outbox.NewSubscriber(env.ob, []string{topic}, func(_ context.Context, m *outbox.Message[order]) error {
		c.handled(m.Payload.Total)
		return nil
	}, defaultConfig[order]())
	if err != nil {
		return nil, err
	}
	pub, err := outbox.NewPublisher[order](env.ob, topic, nil)
	if err != nil {
		return nil, err
	}
	rctx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- sub.Run(rctx) }()
	time.Sleep(200 * time.Millisecond) // let it go idle
	err = publishPaced(ctx, env, c, rate, func(tx pgx.Tx, i int) error {
		_, err := pub.Publish(ctx, tx, order{ID: "latency", Total: i}, nil)
		return err
	})
	stop()
	if rerr := <-errc; err == nil {
		err = rerr
	}
	return c.lat, err
}

// latencyRiver measures River with its default fetch settings, or with
// the 2 ms fetch cooldown and 20 ms poll interval of its own benchmarks.
func latencyRiver(ctx context.Context, env *benchEnv, n int, fast bool) ([]time.Duration, error) {
	c := newCommits(n)
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(_ context.Context, j *river.Job[order]) error {
		c.handled(j.Args.Total)
		return nil
	}))
	cfg := &river.Config{
		Schema: schemaRiver, Workers: workers, Logger: discardLogger(),
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 100}},
	}
	if fast {
		cfg.FetchCooldown, cfg.FetchPollInterval = 2*time.Millisecond, 20*time.Millisecond
	}
	client, err := river.NewClient(riverpgxv5.New(env.pool), cfg)
	if err != nil {
		return nil, err
	}
	if err := client.Start(ctx); err != nil {
		return nil, err
	}
	time.Sleep(200 * time.Millisecond)
	err = publishPaced(ctx, env, c, latencyRate, func(tx pgx.Tx, i int) error {
		_, err := client.InsertTx(ctx, tx, order{ID: "latency", Total: i}, nil)
		return err
	})
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if serr := client.Stop(sctx); err == nil {
		err = serr
	}
	return c.lat, err
}
