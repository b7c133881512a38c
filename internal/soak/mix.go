package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/outbox"
)

// The soak's outbox table and queues.
const (
	table     = "outbox"
	orders    = "orders.created"   // keyed by customer
	emails    = "emails.send"      // plain
	webhooks  = "webhooks.deliver" // flaky: retries, some rejected
	reminders = "reminders.due"    // scheduled 1 to 30 s ahead
)

// The mix, by message sequence number: of every ten messages, four are
// orders, three emails, two webhooks and one a reminder. A transaction
// publishes consecutive sequence numbers, so one that publishes several
// messages mixes queues the way a service does (an order and its email).
func queueOf(seq int64) string {
	switch seq % 10 {
	case 0, 1, 2, 3:
		return orders
	case 4, 5, 6:
		return emails
	case 7, 8:
		return webhooks
	}
	return reminders
}

// roll is a number from 0 to 999 that decides a message's fate: a hash
// of its sequence number (Fibonacci hashing), so fates are spread evenly
// over the queues and neighbours do not share them.
func roll(seq int64) int64 { return int64((uint64(seq) * 0x9E3779B97F4A7C15 >> 32) % 1000) }

// customers is how many ordering keys the orders use, an order's customer
// drawn by hash. At 1,000 msgs/s a customer places 0.4 orders a second,
// so about one failed order in six holds up the customer's next order
// while it waits for its retry (0.5 s).
const customers = 1000

// Event is every queue's payload: the sequence number identifies the
// message to the latency accounting; Body gives it a realistic size.
type Event struct {
	Seq      int64  `json:"seq"`
	Customer string `json:"customer,omitempty"`
	Body     string `json:"body"`
}

// filler makes bodies of 100 to 400 bytes.
var filler = strings.Repeat("lorem ipsum dolor sit amet, consectetur adipiscing elit; ", 8)

// message returns the payload of seq and the options it is published with.
func message(seq int64) (Event, *outbox.PublishOpts) {
	e := Event{Seq: seq, Body: filler[:100+seq%301]}
	switch queueOf(seq) {
	case orders:
		e.Customer = fmt.Sprintf("customer-%d", int64(uint64(seq)*0x9E3779B97F4A7C15>>40)%customers)
		return e, &outbox.PublishOpts{OrderingKey: e.Customer}
	case reminders:
		return e, &outbox.PublishOpts{Delay: reminderDelay(seq)}
	}
	return e, nil
}

func reminderDelay(seq int64) time.Duration { return time.Duration(1+roll(seq)%30) * time.Second }

// What the handlers do, per queue. The orders fail 2 % of first attempts
// and 0.1 % for good (three attempts, then the dead-letter table, holding
// the customer's later orders meanwhile); emails are rate limited on 5 %
// of first attempts; webhooks fail twice for 10 % and are rejected for
// 0.2 %; reminders fail 1 % of first attempts. Handlers take 0.5 to 3 ms,
// and 1 % of webhooks 200 ms.
func behave(ctx context.Context, m *outbox.Message[Event]) error {
	r := roll(m.Payload.Seq)
	var work time.Duration
	var err error
	switch m.Queue {
	case orders:
		work = 500*time.Microsecond + time.Duration(r%5)*100*time.Microsecond
		switch {
		case r == 999:
			err = errors.New("payment provider says no")
		case r < 20 && m.Attempts == 0:
			err = errors.New("inventory service timed out")
		}
	case emails:
		work = time.Millisecond
		if r >= 100 && r < 150 && m.Attempts == 0 {
			err = outbox.RetryAfter(errors.New("mail relay rate limit"), time.Second)
		}
	case webhooks:
		work = 2 * time.Millisecond
		switch {
		case r >= 500 && r < 510:
			work = 200 * time.Millisecond
		case r >= 998:
			err = outbox.Reject(errors.New("endpoint answered 410 Gone"))
		case r >= 200 && r < 300 && m.Attempts < 2:
			err = errors.New("endpoint answered 503")
		}
	case reminders:
		work = time.Millisecond
		if r >= 300 && r < 310 && m.Attempts == 0 {
			err = errors.New("calendar service timed out")
		}
	}
	t := time.NewTimer(work)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	return err
}

// subscriberSpec describes one of the soak's subscribers.
type subscriberSpec struct {
	name    string
	queues  []string
	workers int
	retry   outbox.RetryStrategy
}

// subscribers: two processes' worth of order subscribers sharing the
// queue, one subscriber for emails and webhooks together (the claim
// shared across queues), one for reminders.
var subscribers = []subscriberSpec{
	{"orders-a", []string{orders}, 8, outbox.ConstantRetry{Delay: 500 * time.Millisecond, MaxAttempts: 3}},
	{"orders-b", []string{orders}, 8, outbox.ConstantRetry{Delay: 500 * time.Millisecond, MaxAttempts: 3}},
	{"notifications", []string{emails, webhooks}, 16,
		&outbox.ExponentialRetry{Initial: 200 * time.Millisecond, Multiplier: 2, MaxDelay: 5 * time.Second, Jitter: 0.2, MaxAttempts: 5}},
	{"reminders", []string{reminders}, 4, outbox.ConstantRetry{Delay: time.Second, MaxAttempts: 3}},
}

// soak is the load: publishers, handlers and the outcome counts.
type soak struct {
	ob   *outbox.Outbox
	pool *pgxpool.Pool
	pubs map[string]*outbox.Publisher[Event]
	// ring, when set, writes the messages into the ring instead (-ring).
	ring *ringWriter

	latency   *commitLatency // immediate messages: commit to first handler call
	lateness  *commitLatency // reminders: due time to first handler call
	published atomic.Int64
	pubErrors atomic.Int64
	outcomes  counters
}

// counters are the subscribers' outcome counts; soak implements
// outbox.MetricsRecorder with them.
type counters struct {
	acked, retried, deadLettered, terminal, leaseLost, refused atomic.Int64
}

func newSoak(ob *outbox.Outbox, pool *pgxpool.Pool) (*soak, error) {
	s := &soak{ob: ob, pool: pool, pubs: map[string]*outbox.Publisher[Event]{},
		latency: newCommitLatency(), lateness: newCommitLatency()}
	for _, q := range []string{orders, emails, webhooks, reminders} {
		p, err := outbox.NewPublisher[Event](ob, q, nil)
		if err != nil {
			return nil, err
		}
		s.pubs[q] = p
	}
	return s, nil
}

func (s *soak) subscriber(spec subscriberSpec, log *slog.Logger) (*outbox.Subscriber[Event], error) {
	return outbox.NewSubscriber(s.ob, spec.queues, s.handle, &outbox.SubscriberConfig[Event]{
		Name: spec.name, Workers: spec.workers, Retry: spec.retry, Metrics: s, Logger: log,
	})
}

// handle records the first delivery's latency, then behaves as the
// message's queue does.
func (s *soak) handle(ctx context.Context, m *outbox.Message[Event]) error {
	if m.Deliveries == 1 {
		if m.Queue == reminders {
			s.lateness.handledAt(m.Payload.Seq, time.Now())
		} else {
			s.latency.handledAt(m.Payload.Seq, time.Now())
		}
	}
	return behave(ctx, m)
}

// Record implements outbox.MetricsRecorder.
func (s *soak) Record(ev outbox.MetricEvent) {
	c := &s.outcomes
	switch ev.Name {
	case outbox.EventAcked:
		c.acked.Add(1)
	case outbox.EventRetried:
		c.retried.Add(1)
	case outbox.EventDeadLettered:
		c.deadLettered.Add(1)
	case outbox.EventTerminal:
		c.terminal.Add(1)
	case outbox.EventLeaseLost:
		c.leaseLost.Add(1)
	case outbox.EventWriteRefused:
		c.refused.Add(1)
	}
}

// publish publishes rate messages per second from writers goroutines
// until ctx is done. Each writer keeps its share of the pace, and every
// fourth transaction of a writer publishes three messages, the others
// one. A writer that falls behind (the machine is busy) catches up for at
// most a second's worth, then takes the pace up from where it is, so a
// stall never turns into a burst.
func (s *soak) publish(ctx context.Context, start time.Time, rate float64, writers int) {
	var seqs atomic.Int64
	var wg sync.WaitGroup
	perMessage := time.Duration(float64(writers) / rate * float64(time.Second)) // one writer's pace
	for w := range writers {
		wg.Go(func() {
			next := start.Add(time.Duration(w) * perMessage / time.Duration(writers))
			for n := 0; ; n++ {
				k := int64(1)
				if n%4 == 3 {
					k = 3
				}
				if !sleepUntil(ctx, next) {
					return
				}
				first := seqs.Add(k) - k
				if err := s.publishTx(ctx, first, k); err != nil {
					if s.pubErrors.Add(1) <= 10 {
						fmt.Printf("soak: publish failed: %v\n", err)
					}
				}
				next = next.Add(time.Duration(k) * perMessage)
				if now := time.Now(); now.Sub(next) > time.Second {
					next = now
				}
			}
		})
	}
	wg.Wait()
}

// publishTx publishes messages first to first+k-1 in one transaction. The
// transaction runs to its end even when ctx is done meanwhile, so a
// commit is never left in doubt.
func (s *soak) publishTx(ctx context.Context, first, k int64) error {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	begun := time.Now()
	tx, err := s.pool.Begin(tctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(tctx) }()
	// A transaction holds the keys it publishes until it ends: publish
	// them in one order (by key), so concurrent transactions never wait
	// for each other in a cycle.
	type msg struct {
		e    Event
		opts *outbox.PublishOpts
	}
	msgs := make([]msg, 0, k)
	for seq := first; seq < first+k; seq++ {
		e, opts := message(seq)
		msgs = append(msgs, msg{e, opts})
	}
	slices.SortStableFunc(msgs, func(a, b msg) int { return strings.Compare(a.e.Customer, b.e.Customer) })
	for _, m := range msgs {
		if s.ring != nil {
			if err := s.ring.write(tctx, tx, m.e, m.opts); err != nil {
				return err
			}
			continue
		}
		if _, err := s.pubs[queueOf(m.e.Seq)].Publish(tctx, tx, m.e, m.opts); err != nil {
			return err
		}
	}
	if err := tx.Commit(tctx); err != nil {
		return err
	}
	committed := time.Now()
	for seq := first; seq < first+k; seq++ {
		if queueOf(seq) == reminders {
			// Delay counts from the statement's now(), the
			// transaction's start on the server: begun is just before.
			s.lateness.committed(seq, begun.Add(reminderDelay(seq)))
		} else {
			s.latency.committed(seq, committed)
		}
	}
	s.published.Add(k)
	return nil
}

// sleepUntil waits for t; false when ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// accounting is the end of the run's bookkeeping: every published message
// was acknowledged, is in the dead-letter table, or is still queued.
type accounting struct {
	published, acked, retried, leaseLost, refused, terminal, pubErrors int64
	deadLettered                                                       map[string]int64 // by failure reason
	dlq, queued, lost                                                  int64
}

func (s *soak) account(ctx context.Context, p *dbProbe) (accounting, error) {
	a := accounting{
		published: s.published.Load(), acked: s.outcomes.acked.Load(), retried: s.outcomes.retried.Load(),
		leaseLost: s.outcomes.leaseLost.Load(), refused: s.outcomes.refused.Load(), terminal: s.outcomes.terminal.Load(),
		pubErrors: s.pubErrors.Load(), deadLettered: map[string]int64{},
	}
	rows, err := s.pool.Query(ctx, "SELECT failure_reason, count(*) FROM "+p.dlq+" GROUP BY failure_reason")
	if err != nil {
		return a, err
	}
	for rows.Next() {
		var reason string
		var n int64
		if err := rows.Scan(&reason, &n); err != nil {
			return a, err
		}
		a.deadLettered[reason] = n
		a.dlq += n
	}
	if err := rows.Err(); err != nil {
		return a, err
	}
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM "+p.table).Scan(&a.queued); err != nil {
		return a, err
	}
	unread, err := p.ringUnread(ctx)
	if err != nil {
		return a, err
	}
	a.queued += unread
	a.lost = a.published - a.acked - a.terminal - a.dlq - a.queued
	return a, nil
}
