package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/outbox"
)

// msg is the payload of every message.
type msg struct {
	ID  int64  `json:"id"`
	Key string `json:"key,omitempty"`
	Seq int    `json:"seq,omitempty"`
	// WorkMS is how long its handler works.
	WorkMS int `json:"work_ms"`
}

// The queues: unkeyed rows published in bulk, which subscribers take by
// row lock while a backlog lasts (a claim that found 32 rows or more is
// followed by one by lock), and keyed rows on a few keys, whose claims
// find only the keys' heads, fewer than 32, and so lease them.
const (
	queueBulk  = "failover.bulk"
	queueKeyed = "failover.keyed"
)

// ledgerDDL is the business table: one row per message, written in the
// message's transaction.
const ledgerDDL = `CREATE TABLE ledger (
    msg_id       bigint PRIMARY KEY,
    row_id       bigint NOT NULL,
    queue        text NOT NULL,
    ordering_key text,
    seq          int)`

// publishers write each message and its ledger row in one transaction,
// and remember which transactions' commits they saw acknowledged.
type publishers struct {
	pool        *pgxpool.Pool
	bulk, keyed *outbox.Publisher[msg]
	nextID      atomic.Int64

	mu sync.Mutex
	// acked is when each message's commit was acknowledged; tx the
	// transaction (a number) each acknowledged message belongs to.
	acked map[int64]time.Time
	tx    map[int64]int64
	// unknown are the messages of transactions whose commit failed:
	// their fate is read from the new primary's ledger.
	unknown map[int64]bool
	txs     int64

	okTx, failedTx atomic.Int64
}

func newPublishers(pool *pgxpool.Pool, ob *outbox.Outbox) (*publishers, error) {
	bulk, err := outbox.NewPublisher[msg](ob, queueBulk, nil)
	if err != nil {
		return nil, err
	}
	keyed, err := outbox.NewPublisher[msg](ob, queueKeyed, nil)
	if err != nil {
		return nil, err
	}
	return &publishers{pool: pool, bulk: bulk, keyed: keyed,
		acked: map[int64]time.Time{}, tx: map[int64]int64{}, unknown: map[int64]bool{}}, nil
}

// slowEvery: one bulk message in slowEvery has a handler slower than
// LockWindow, so claims by lock lease some of their rows at their end.
const slowEvery = 150

// bulkMsgs returns n new unkeyed messages.
func (p *publishers) bulkMsgs(n int) []msg {
	ms := make([]msg, n)
	for i := range ms {
		ms[i] = msg{ID: p.nextID.Add(1), WorkMS: 2}
		if rand.IntN(slowEvery) == 0 {
			ms[i].WorkMS = 1500
		}
	}
	return ms
}

// publish writes ms to queue (with key when not empty) and their ledger
// rows in one transaction, and records the outcome.
func (p *publishers) publish(ctx context.Context, queue, key string, ms []msg) error {
	pub, opts := p.bulk, (*outbox.PublishOpts)(nil)
	if key != "" {
		pub, opts = p.keyed, &outbox.PublishOpts{OrderingKey: key}
	}
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		rows, err := pub.PublishBatch(ctx, tx, ms, opts)
		if err != nil {
			return err
		}
		ids, keys, seqs := make([]int64, len(ms)), make([]*string, len(ms)), make([]*int32, len(ms))
		for i, m := range ms {
			ids[i] = m.ID
			if m.Key != "" {
				k, s := m.Key, int32(m.Seq)
				keys[i], seqs[i] = &k, &s
			}
		}
		_, err = tx.Exec(ctx, `INSERT INTO ledger (msg_id, row_id, queue, ordering_key, seq)
			SELECT unnest($1::bigint[]), unnest($2::bigint[]), $3, unnest($4::text[]), unnest($5::int[])`,
			ids, rows, queue, keys, seqs)
		return err
	})
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.txs++
	for _, m := range ms {
		if err == nil {
			p.acked[m.ID], p.tx[m.ID] = now, p.txs
		} else {
			p.unknown[m.ID] = true
		}
	}
	if err == nil {
		p.okTx.Add(1)
	} else {
		p.failedTx.Add(1)
	}
	return err
}

// keysPerPublisher is how many ordering keys each publisher owns: a key's
// messages are published one transaction after another, so their
// sequence numbers follow their commit order.
const keysPerPublisher = 5

// publisher is one publishing goroutine's state.
type publisher struct {
	p   *publishers
	n   int
	seq map[string]int
}

func (p *publishers) publisher(n int) *publisher {
	return &publisher{p: p, n: n, seq: map[string]int{}}
}

// keyed publishes the next message of the publisher's key k.
func (w *publisher) keyed(ctx context.Context, k int) error {
	key := fmt.Sprintf("p%d-k%d", w.n, k)
	w.seq[key]++
	m := msg{ID: w.p.nextID.Add(1), Key: key, Seq: w.seq[key], WorkMS: 5}
	return w.p.publish(ctx, queueKeyed, key, []msg{m})
}

// run publishes until ctx ends, one transaction every period: mostly a
// few unkeyed messages, sometimes one keyed message. A failed transaction
// (the primary is gone, or not yet replaced) is followed by a short pause.
func (w *publisher) run(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var err error
		if rand.IntN(3) == 0 {
			err = w.keyed(ctx, rand.IntN(keysPerPublisher))
		} else {
			err = w.p.publish(ctx, queueBulk, "", w.p.bulkMsgs(1+rand.IntN(4)))
		}
		if err != nil && ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
}
