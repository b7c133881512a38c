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
	for rows.Next() {
		items = append(items, LockRow{Queue: arg.Queue})
		i := &items[len(items)-1]
		if err := rows.Scan(&i.ID, &i.Payload, &i.Headers, &i.OrderingKey, &i.TimerID, &i.CreatedAt,
			&i.AttemptsCount, &i.DeliveriesCount, &i.SinceFirstAttemptSeconds, &i.NextAttemptAt, &i.Xid); err != nil {
			return items[:len(items)-1], err
		}
	}
	return items, rows.Err()
}
