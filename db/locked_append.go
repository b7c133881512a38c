package db

import "context"

// LockQueueAppend is LockQueue (sqlc's, in locked.sql.go) appending the
// rows it locks to items, which it returns, as rows of Lock (their queue
// is arg.Queue): a subscriber of one queue and one of several then hand
// their rows on alike. A claim knows how many rows it asked for, so its
// caller sizes items once: grown row by row, a slice of thousands of rows
// allocates about five times its final size. It scans the columns
// LockQueue returns, in their order; the tests compare the two.
func (q *Queries) LockQueueAppend(ctx context.Context, arg LockQueueParams, items []LockRow) ([]LockRow, error) {
	rows, err := q.db.Query(ctx, lockQueue,
		arg.IdleTimeoutMs,
		arg.Queue,
		arg.AfterAt,
		arg.AfterID,
		arg.MaxRows,
	)
	if err != nil {
		return items, err
	}
	defer rows.Close()
	// One destination list serves every row: passed as separate
	// arguments, Scan's list is allocated anew for each row.
	dest := make([]any, 11)
	for rows.Next() {
		items = append(items, LockRow{Queue: arg.Queue})
		i := &items[len(items)-1]
		dest[0], dest[1], dest[2], dest[3], dest[4], dest[5] = &i.ID, &i.Payload, &i.Headers, &i.OrderingKey, &i.TimerID, &i.CreatedAt
		dest[6], dest[7], dest[8], dest[9], dest[10] = &i.AttemptsCount, &i.DeliveriesCount, &i.SinceFirstAttemptSeconds, &i.NextAttemptAt, &i.Xid
		if err := rows.Scan(dest...); err != nil {
			return items[:len(items)-1], err
		}
	}
	return items, rows.Err()
}
