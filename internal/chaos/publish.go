package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/internal/ringwriter"
	"github.com/outboxgen/outboxgen/outbox"
)

// keysPerPublisher is how many ordering keys each publisher owns. A key
// is published by one publisher, one transaction after another, so its
// sequence numbers follow the commit order of its transactions.
const keysPerPublisher = 10

// publishers write messages with unique ids in transactions, recording
// each committed message in the published table in the same transaction.
type publishers struct {
	c      *coordinator
	n      int
	nextID atomic.Int64
	// attempted counts transactions; rolledBack those rolled back on
	// purpose; failed those that ended in an error (their fate is read
	// from the published table).
	attempted, rolledBack, failed atomic.Int64
}

func newPublishers(c *coordinator, n int) *publishers { return &publishers{c: c, n: n} }

func (p *publishers) run(ctx context.Context, wg *sync.WaitGroup) {
	for i := range p.n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.publisher(ctx, i)
		}()
	}
}

// publisher i publishes at its share of the rate until ctx ends.
func (p *publishers) publisher(ctx context.Context, i int) {
	c := p.c
	pubs := map[string]*outbox.Publisher[msg]{}
	for _, q := range queues {
		pub, err := outbox.NewPublisher[msg](c.ob, q, nil)
		if err != nil {
			c.log.Error("chaos: publisher", "error", err)
			return
		}
		pubs[q] = pub
	}
	// With the ring, half of the messages are written into it: unkeyed
	// ones at random, with plain SQL as any writer would, and the rows of
	// half of the keys, by a Publisher into the ring (TierRing). A key's
	// rows keep their order within the tier they are written into;
	// across tiers, only while its writer writes them into one.
	var (
		rw       *ringwriter.Writer
		ringPubs = map[string]*outbox.Publisher[msg]{}
	)
	if c.ring {
		var err error
		if rw, err = ringwriter.New[msg](c.names()); err != nil {
			c.log.Error("chaos: ring writer", "error", err)
			return
		}
		for _, q := range queues {
			if ringPubs[q], err = outbox.NewPublisher(c.ob, q, &outbox.PublisherConfig[msg]{Tier: outbox.TierRing}); err != nil {
				c.log.Error("chaos: publisher into the ring", "error", err)
				return
			}
		}
	}
	seq := map[string]int{}
	const (
		perTx = 3 // messages per ordinary transaction, on average
		// One transaction in burstEvery publishes a burst of burstMin to
		// 3*burstMin messages: a backlog, which the claims after it take
		// by row lock (a claim that found 32 rows or more is followed by
		// one by lock), where a trickle is taken by lease. A publisher
		// whose last burstEvery transactions committed no burst (the
		// dice, a fault) publishes one, and publisher i's first is its
		// (i+2)-th transaction, so that a short run on a loaded machine,
		// whose publishers commit a few dozen transactions each, has
		// bursts too. Bursts are never rolled back on purpose.
		burstEvery, burstMin = 100, 400
		average              = perTx + 2*burstMin/burstEvery
	)
	tick := time.NewTicker(time.Duration(float64(time.Second) * average * float64(p.n) / float64(c.rate)))
	defer tick.Stop()
	sinceBurst := burstEvery - 1 - i // transactions since the last committed burst
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		p.attempted.Add(1)
		burst := rand.IntN(burstEvery) == 0 || sinceBurst >= burstEvery
		rollback := !burst && rand.IntN(10) == 0
		var ids []int64
		n := 1 + rand.IntN(2*perTx-1)
		if burst {
			n = burstMin + rand.IntN(2*burstMin+1)
		}
		err := pgx.BeginFunc(ctx, c.pubPool, func(tx pgx.Tx) error {
			for range n {
				m := msg{ID: p.nextID.Add(1), Mode: mode()}
				opts := &outbox.PublishOpts{}
				q := queues[rand.IntN(len(queues))]
				intoRing := rw != nil && rand.IntN(2) == 0
				if rand.IntN(2) == 0 {
					// A key is (queue, ordering key): each key name
					// lives in one queue, so key names identify keys.
					k := rand.IntN(keysPerPublisher)
					intoRing = rw != nil && k%2 == 0
					m.Key, q = fmt.Sprintf("p%d-k%d", i, k), queues[k%len(queues)]
					seq[m.Key]++
					m.Seq = seq[m.Key]
					opts.OrderingKey = m.Key
				} else if rand.IntN(10) == 0 {
					opts.Delay = time.Duration(rand.IntN(2000)) * time.Millisecond
				}
				if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.published (msg_id, ordering_key, seq, mode) VALUES ($1, nullif($2, ''), $3, $4)`,
					pgx.Identifier{c.schema}.Sanitize()), m.ID, m.Key, m.Seq, m.Mode); err != nil {
					return err
				}
				switch {
				case intoRing && opts.OrderingKey == "":
					if err := rw.Write(ctx, tx, q, m, opts); err != nil {
						return err
					}
				case intoRing:
					if _, err := ringPubs[q].Publish(ctx, tx, m, opts); err != nil {
						return err
					}
				default:
					if _, err := pubs[q].Publish(ctx, tx, m, opts); err != nil {
						return err
					}
				}
				ids = append(ids, m.ID)
			}
			if rollback {
				return errRolledBack
			}
			return nil
		})
		if burst && err == nil {
			sinceBurst = 0
		} else {
			sinceBurst++
		}
		switch {
		case err == errRolledBack:
			p.rolledBack.Add(1)
			_, rerr := c.pool.Exec(context.WithoutCancel(ctx), fmt.Sprintf(`INSERT INTO %s.rolled_back SELECT unnest($1::bigint[])`,
				pgx.Identifier{c.schema}.Sanitize()), ids)
			if rerr != nil {
				c.log.Warn("chaos: record rollback", "error", rerr)
			}
		case err != nil && ctx.Err() == nil:
			p.failed.Add(1)
			sleep(ctx, 50*time.Millisecond)
		}
	}
}

// mode picks what a message's handler will do.
func mode() string {
	switch r := rand.IntN(100); {
	case r < 2:
		return modeReject
	case r < 3:
		return modeFail
	case r < 10:
		return modeRetry
	default:
		return modeOK
	}
}
