package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// report is what a leg measured and found.
type report struct {
	failures []string
	lines    []string

	// Recovery, from the promotion: to the first delivery of a message
	// committed on the new primary, to every subscriber claiming again,
	// and to the new primary holding no row published before it.
	firstNew, allSubscribers, backlog time.Duration
	// Acknowledged commits the new primary does not hold.
	lostTx, lostMsgs int
	// Deliveries of messages the new primary does not hold.
	ghosts int
}

func (r *report) printf(format string, args ...any) {
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
}

// ledgerRow is one business row on the new primary.
type ledgerRow struct {
	id    int64
	queue string
	key   *string
	seq   *int32
}

// check reads the delivery log and the new primary, and checks the
// accounting.
func (l *leg) check(ctx context.Context) error {
	r := &l.report
	ds, err := readDeliveries(deliveryLogPath(l.root))
	if err != nil {
		return err
	}
	rows, err := l.pool.Query(ctx, `SELECT msg_id, queue, ordering_key, seq FROM ledger`)
	if err != nil {
		return err
	}
	ledger := map[int64]ledgerRow{}
	for rows.Next() {
		var lr ledgerRow
		if err := rows.Scan(&lr.id, &lr.queue, &lr.key, &lr.seq); err != nil {
			rows.Close()
			return err
		}
		ledger[lr.id] = lr
	}
	if err := rows.Err(); err != nil {
		return err
	}
	p := l.pubs
	p.mu.Lock()
	defer p.mu.Unlock()

	r.printf("outage: primary stopped %v after the standby was held back, standby accepting writes %v after the stop",
		l.opt.lag, l.promoted.Sub(l.killed).Round(time.Millisecond))
	r.printf("standby at the stop: %v", l.snap)
	if l.snap.orphans > 0 {
		l.fail("the standby held %d outbox rows without their ledger row", l.snap.orphans)
	}
	r.printf("publishing: %d transactions acknowledged, %d failed (outcome read from the new primary); %d messages on the new primary",
		p.okTx.Load(), p.failedTx.Load(), len(ledger))

	// Acknowledged commits the new primary lost, whole transactions only.
	lostIn := map[int64]int{}
	for id := range p.acked {
		if _, ok := ledger[id]; !ok {
			lostIn[p.tx[id]]++
			r.lostMsgs++
		}
	}
	r.lostTx = len(lostIn)
	for id, tx := range p.tx {
		if n, ok := lostIn[tx]; ok && n > 0 {
			if _, kept := ledger[id]; kept {
				l.fail("transaction %d lost part of its messages: message %d survived", tx, id)
			}
		}
	}
	unknownKept := 0
	for id := range p.unknown {
		if _, ok := ledger[id]; ok {
			unknownKept++
		}
	}
	r.printf("lost: %d acknowledged transactions (%d messages) are not on the new primary; of %d messages whose commit failed, %d committed",
		r.lostTx, r.lostMsgs, len(p.unknown), unknownKept)
	if l.sync && r.lostTx > 0 {
		l.fail("synchronous replication lost %d acknowledged transactions (%d messages)", r.lostTx, r.lostMsgs)
	}

	// Deliveries: every message on the new primary at least once.
	first := map[int64]time.Time{}
	count := map[int64]int{}
	subFirst := map[string]time.Time{}
	var claims [phases]map[string]int
	for i := range claims {
		claims[i] = map[string]int{}
	}
	for _, d := range ds {
		if t, ok := first[d.id]; !ok || d.at.Before(t) {
			first[d.id] = d.at
		}
		count[d.id]++
		ph := phaseBefore
		switch {
		case !d.at.Before(l.promoted):
			ph = phaseAfter
			if t, ok := subFirst[d.sub]; !ok || d.at.Before(t) {
				subFirst[d.sub] = d.at
			}
		case !d.at.Before(l.killed):
			ph = phaseOutage
		}
		claims[ph][d.claim]++
	}
	undelivered := 0
	for id := range ledger {
		if _, ok := first[id]; !ok {
			undelivered++
		}
	}
	if undelivered > 0 {
		l.fail("%d messages on the new primary were never delivered", undelivered)
	}
	ghostsAcked := 0
	for id := range first {
		if _, ok := ledger[id]; !ok {
			r.ghosts++
			if _, ok := p.acked[id]; ok {
				ghostsAcked++
			}
		}
	}
	// Two handlers of one message running at once.
	byMsg := map[int64][]delivery{}
	for _, d := range ds {
		byMsg[d.id] = append(byMsg[d.id], d)
	}
	overlaps := 0
	for _, dd := range byMsg {
		slices.SortFunc(dd, func(a, b delivery) int { return a.at.Compare(b.at) })
		for i := 1; i < len(dd); i++ {
			if dd[i].at.Before(dd[i-1].end) {
				overlaps++
			}
		}
	}
	r.printf("handlers of one message running at once: %d", overlaps)
	if l.sync && overlaps > 0 {
		l.fail("synchronous replication: %d times two handlers of one message ran at once", overlaps)
	}
	again := len(ds) - len(first)
	r.printf("delivered: %d deliveries of %d messages (%d again); %d deliveries of %d messages the new primary does not hold (%d of them acknowledged to their publisher)",
		len(ds), len(first), again, countOf(count, func(id int64) bool { _, ok := ledger[id]; return !ok }), r.ghosts, ghostsAcked)
	if l.sync && r.ghosts > 0 {
		l.fail("synchronous replication: %d messages were delivered whose transactions the new primary does not hold", r.ghosts)
	}
	for _, ph := range []int{phaseBefore, phaseAfter} {
		r.printf("claims sampled %s the failover: %d by lock, %d by lease, %d rows gone, %d unknown (the handler's query failed)",
			map[int]string{phaseBefore: "before", phaseAfter: "after"}[ph], claims[ph]["lock"], claims[ph]["lease"], claims[ph]["gone"], claims[ph]["unknown"])
	}
	outage := 0
	for _, n := range claims[phaseOutage] {
		outage += n
	}
	r.printf("handlers started between the stop and the promotion (of rows claimed on the old primary): %d", outage)
	for _, ph := range []int{phaseBefore, phaseAfter} {
		if claims[ph]["lock"] == 0 || claims[ph]["lease"] == 0 {
			l.fail("claims %s the failover: %d by lock, %d by lease; both kinds must run", map[int]string{phaseBefore: "before", phaseAfter: "after"}[ph],
				claims[ph]["lock"], claims[ph]["lease"])
		}
	}

	// Per-key order: a key's messages on the new primary were first
	// delivered in their order.
	byKey := map[string][]ledgerRow{}
	for _, lr := range ledger {
		if lr.key != nil {
			byKey[*lr.key] = append(byKey[*lr.key], lr)
		}
	}
	for key, lrs := range byKey {
		slices.SortFunc(lrs, func(a, b ledgerRow) int { return int(*a.seq - *b.seq) })
		for i := 1; i < len(lrs); i++ {
			a, b := first[lrs[i-1].id], first[lrs[i].id]
			if !a.IsZero() && !b.IsZero() && b.Before(a) {
				l.fail("key %s: message seq %d was first delivered before seq %d", key, *lrs[i].seq, *lrs[i-1].seq)
				break
			}
		}
	}

	// Recovery.
	r.firstNew = -1
	for id, t := range p.acked {
		if t.After(l.promoted) {
			if d, ok := first[id]; ok && (r.firstNew < 0 || d.Sub(l.promoted) < r.firstNew) {
				r.firstNew = d.Sub(l.promoted)
			}
		}
	}
	// Every subscriber claims again, by itself; the bulk queue's have
	// rows to deliver, the keyed queue's share a few keys.
	var claimedAgain, delivering time.Duration
	for _, s := range l.services {
		for name, w := range s.claims {
			t := w.firstSince()
			if t.IsZero() {
				l.fail("%s never claimed after the promotion", name)
				claimedAgain = -1
			} else if claimedAgain >= 0 {
				claimedAgain = max(claimedAgain, t.Sub(l.promoted))
			}
			if t, ok := subFirst[name]; ok && strings.HasSuffix(name, queueBulk) {
				delivering = max(delivering, t.Sub(l.promoted))
			}
		}
	}
	r.allSubscribers = claimedAgain
	l.drainedMu.Lock()
	r.backlog = -1
	if !l.drained.IsZero() {
		r.backlog = l.drained.Sub(l.promoted)
	}
	r.printf("rows published before the promotion left on the new primary, by seconds after it: %s", strings.Join(l.backlogLeft, ", "))
	l.drainedMu.Unlock()
	if r.firstNew < 0 {
		l.fail("no message committed on the new primary was delivered")
	}
	r.printf("recovery after the promotion: every subscriber claiming again %v (the bulk queue's delivering again %v); first delivery of a message committed on the new primary %v; no row published before the promotion left %v",
		ms(r.allSubscribers), ms(delivering), ms(r.firstNew), ms(r.backlog))

	// What the old primary left behind must not stay.
	var left, dlq, blocked, handoffs, locks, sleepers int64
	if err := l.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox), (SELECT count(*) FROM outbox_dlq),
		(SELECT count(*) FROM outbox WHERE blocked), (SELECT count(*) FROM outbox_handoff),
		(SELECT count(*) FROM outbox_locks), (SELECT count(*) FROM outbox_sleepers WHERE until > now())`).Scan(
		&left, &dlq, &blocked, &handoffs, &locks, &sleepers); err != nil {
		return err
	}
	r.printf("new primary after the drain: %d rows, %d dead letters, %d blocked, %d hand-overs, %d lock records, %d sleep records holding (subscribers stopped); the old primary's lock records swept %v after the drain",
		left, dlq, blocked, handoffs, locks, sleepers, ms(l.swept))
	if left+dlq+blocked+handoffs+locks > 0 {
		l.fail("the new primary kept %d rows (%d blocked), %d dead letters, %d hand-overs and %d lock records after the drain",
			left, blocked, dlq, handoffs, locks)
	}
	for ph, s := range l.samples.get() {
		r.printf("sampled %-6s %4d reads: at most %d lock records, %d leased rows, %d sleep records, %d hand-overs; next xid %d",
			phaseNames[ph], s.reads, s.locks, s.leased, s.sleepers, s.handoffs, s.nextXid)
	}
	if before, after := l.samples.get()[phaseLag].nextXid, l.snap.nextXid; before > after {
		r.printf("xids %d to %d, assigned by the old primary but not replicated, are assigned again by the new one", after, before-1)
	}
	return nil
}

func countOf(m map[int64]int, keep func(int64) bool) int {
	n := 0
	for id, c := range m {
		if keep(id) {
			n += c
		}
	}
	return n
}

// ms prints a duration in milliseconds, or "never" for a negative one.
func ms(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.Round(time.Millisecond).String()
}
