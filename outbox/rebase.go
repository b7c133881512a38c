package outbox

import (
	"context"

	"github.com/outboxgen/outboxgen/internal/ring"
)

// RingRebased is what [Outbox.RebaseRing] did.
type RingRebased struct {
	// Consumed counts the ring's rows it deleted, which their lanes had
	// read; Kept the rows left, which every lane now reads from the start.
	Consumed, Kept int64
}

// RebaseRing makes the log tier's ring (<table>_ring, schema 13) readable
// in the cluster the outbox was restored into from a pg_dump, or reached
// by a cut-over to a logical replica. The ring's rows, progress and
// records of claims hold the transaction ids and snapshots of the cluster
// that wrote them; where that cluster's counter was ahead, no snapshot
// here would see the rows until this cluster's counter passed them.
// RebaseRing, in one transaction that locks the ring's tables, deletes
// the rows their lanes had consumed, gives the rows left its own
// transaction id (each key keeps its order), and forgets where the lanes
// stood, so every lane reads the ring from its start. A row a claim held
// when the dump was taken is delivered again, without that delivery
// counted toward MaxDeliveries.
//
// Run it once after the restore, connected as the outbox's owner, before
// the outbox's writers and subscribers start there; `outboxgen rebase`
// runs it. Rows written after a rebase need none. The outbox table needs
// no such step.
func (o *Outbox) RebaseRing(ctx context.Context) (RingRebased, error) {
	r, err := ring.Rebase(ctx, o.pool, o.naming)
	if err != nil {
		return RingRebased{}, wrapOp("RebaseRing", err)
	}
	return RingRebased{Consumed: r.Consumed, Kept: r.Kept}, nil
}
