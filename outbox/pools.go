package outbox

import (
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
)

// pools is what the running subscribers need of each pool, whatever
// Outbox they were made on.
//
// It is the package's one piece of process-wide state, and it has to be:
// the connections are the pool's, and two Outboxes made with [New] on one
// *pgxpool.Pool (one per schema or table) share nothing but the pool, so a
// count kept on the Outbox lets their transactional handlers take every
// connection between them and leave none to the heartbeats. An entry
// lives only while a subscriber on its pool runs: the last Run on it to
// return deletes it, so the ledger holds no pool once its subscribers
// stop and never keeps a closed pool alive.
var pools = poolLedger{running: map[*pgxpool.Pool][]*poolClaim{}}

// poolLedger is the running subscribers' claims on pools, by pool.
type poolLedger struct {
	mu      sync.Mutex
	running map[*pgxpool.Pool][]*poolClaim
}

// poolClaim is what one running subscriber needs of its pool.
type poolClaim struct {
	// who names the subscriber in errors: its outbox table and queues.
	who string
	// txWorkers is the connections its transactional handlers hold.
	txWorkers int
	// peak is the connections it uses at its busiest: txWorkers, and its
	// claims, outcomes and heartbeats.
	peak int
}

// poolUse is what the running subscribers on one pool need of it.
type poolUse struct {
	subscribers int
	// txWorkers is the connections transactional handlers hold.
	txWorkers int
	// peak is the connections the subscribers use at their busiest:
	// txWorkers, and every subscriber's claims, outcomes and heartbeats.
	peak int
}

// take counts c on p unless its transactional handlers, with those
// already counted on p, would hold more than txRoom connections. It
// returns what p's subscribers need with c counted (whether or not it
// was), and when c is refused, the transactional subscribers that hold p.
func (l *poolLedger) take(p *pgxpool.Pool, c *poolClaim, txRoom int) (u poolUse, holders string, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	u = l.use(p)
	u.subscribers++
	u.txWorkers += c.txWorkers
	u.peak += c.peak
	if c.txWorkers > 0 && u.txWorkers > txRoom {
		return u, l.txHolders(p), false
	}
	l.running[p] = append(l.running[p], c)
	return u, "", true
}

// use sums the claims on p. The caller holds l.mu.
func (l *poolLedger) use(p *pgxpool.Pool) poolUse {
	var u poolUse
	for _, c := range l.running[p] {
		u.subscribers++
		u.txWorkers += c.txWorkers
		u.peak += c.peak
	}
	return u
}

// usage is use for callers that do not hold l.mu.
func (l *poolLedger) usage(p *pgxpool.Pool) poolUse {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.use(p)
}

// txHolders names the transactional subscribers running on p and their
// workers, for an error that says who holds the pool. The caller holds
// l.mu.
func (l *poolLedger) txHolders(p *pgxpool.Pool) string {
	var names []string
	for _, c := range l.running[p] {
		if c.txWorkers > 0 {
			names = append(names, fmt.Sprintf("%s, %d workers", c.who, c.txWorkers))
		}
	}
	return strings.Join(names, "; ")
}

// remove uncounts c from p, and forgets p when nothing runs on it.
func (l *poolLedger) remove(p *pgxpool.Pool, c *poolClaim) {
	l.mu.Lock()
	defer l.mu.Unlock()
	claims := l.running[p]
	for i, got := range claims {
		if got == c {
			claims = append(claims[:i:i], claims[i+1:]...)
			break
		}
	}
	if len(claims) == 0 {
		delete(l.running, p)
		return
	}
	l.running[p] = claims
}

// claimName names a subscriber of queues on the table qualified.
func claimName(queues []string, qualified string) string {
	q := make([]string, len(queues))
	for i, name := range queues {
		q[i] = strconv.Quote(name)
	}
	return "queues " + strings.Join(q, ", ") + " of " + qualified
}
