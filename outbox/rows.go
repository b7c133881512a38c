package outbox

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/outboxgen/outboxgen/db"
)

// Bounds of [Outbox.Rows].
const (
	RowsLimitDefault = 50
	RowsLimitMax     = 1000
	// RowsScan is how many rows of its index a page with a filter
	// (RowQuery.MessageType, OlderThan, NewerThan, State RowRetrying)
	// reads at most.
	RowsScan = 5000
)

// RowQuery chooses the rows [Outbox.Rows] lists: one queue's rows in one
// state, or one ordering key's rows.
type RowQuery struct {
	// Queue is the queue. Required.
	Queue string
	// State is RowReady (the default), RowScheduled, RowRetrying (the
	// scheduled rows waiting for their retry), RowLeased or RowExpired.
	// Rows behind their key's head (RowBlocked) are listed by key (Key;
	// HeldKeys finds the keys that hold rows back).
	State string
	// Key, when set, lists the rows of this ordering key in every state,
	// in the key's order (its head first), and State is not used.
	Key string
	// MessageType, when set, lists only rows whose message-type header
	// is this.
	MessageType string
	// OlderThan, when not 0, lists only rows created at least this long
	// ago; NewerThan, when not 0, only rows created less than this long
	// ago (on the database's clock).
	OlderThan, NewerThan time.Duration
	// Newest lists the newest first: the latest due, the latest lease
	// expiry, a key's last row; else the oldest first.
	Newest bool
	// After continues from the page before (its Next).
	After *RowCursor
	// Limit is how many rows a page holds. Default RowsLimitDefault; at
	// most RowsLimitMax.
	Limit int
}

// Filtered reports whether q filters its range (MessageType, OlderThan,
// NewerThan, or State RowRetrying): a page of it then reads at most
// [RowsScan] rows, and can hold fewer than Limit and still have a next
// one.
func (q RowQuery) Filtered() bool {
	return q.MessageType != "" || q.OlderThan != 0 || q.NewerThan != 0 || q.State == RowRetrying
}

// RowCursor is where a page of [Outbox.Rows] ended: pass it as
// RowQuery.After, with the same query, for the next page.
type RowCursor struct {
	At time.Time `json:"at"`
	ID int64     `json:"id"`
}

// String writes the cursor as text (time/id), for a link or a command
// line; [ParseRowCursor] reads it back.
func (c RowCursor) String() string {
	return c.At.Format(time.RFC3339Nano) + "/" + strconv.FormatInt(c.ID, 10)
}

// ParseRowCursor reads a cursor that [RowCursor.String] wrote. Other text
// gives an *[InputError] for field.
func ParseRowCursor(field, s string) (*RowCursor, error) {
	at, id, ok := strings.Cut(s, "/")
	t, terr := time.Parse(time.RFC3339Nano, at)
	n, nerr := strconv.ParseInt(id, 10, 64)
	if !ok || terr != nil || nerr != nil {
		return nil, &InputError{Field: field, Rule: fmt.Sprintf("must be a cursor a page of rows gave (time/id); is %q", s)}
	}
	return &RowCursor{At: t, ID: n}, nil
}

// RowSummary is one row as [Outbox.Rows] lists it: what a list shows, the
// payload left out ([Outbox.Row] reads it whole).
type RowSummary struct {
	ID    int64  `json:"id"`
	Queue string `json:"queue"`
	// State is RowReady, RowScheduled, RowBlocked, RowLeased or
	// RowExpired, on the server's clock when it was read.
	State       string `json:"state"`
	OrderingKey string `json:"ordering_key,omitempty"`
	TimerID     string `json:"timer_id,omitempty"`
	// MessageType is its message-type header.
	MessageType string `json:"message_type,omitempty"`
	Attempts    int    `json:"attempts"`
	Deliveries  int    `json:"deliveries"`
	// LastError is the first 200 characters of the last handler error.
	LastError      string    `json:"last_error,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
	NextAttemptAt  time.Time `json:"next_attempt_at"`
	LeaseExpiresAt time.Time `json:"lease_expires_at,omitzero"`
}

// Rows lists a page of the outbox table's rows of one queue in one state
// (or of one ordering key), oldest or newest first, and the cursor of the
// next page (nil after the last). Each page is one range of an index (the
// pending index for ready and scheduled rows, the lease-expiry index for
// leased and expired ones, the ordering index for a key) that stops at the
// page's size, however many rows the queue holds. With a filter
// (MessageType, OlderThan, NewerThan, or State RowRetrying, the
// scheduled rows that failed before), a page reads at most [RowsScan]
// rows of its range and lists those that match: a page can then hold
// fewer rows than Limit, or none, and still have a next one, which goes
// on from the last row it read. Rows in the log tier's
// ring are listed once they move into the table; rows due (or leased
// until) at infinity are not listed. Invalid queries give an
// *[InputError].
func (o *Outbox) Rows(ctx context.Context, q RowQuery) ([]RowSummary, *RowCursor, error) {
	if err := checkQueueToRead("RowQuery.Queue", q.Queue); err != nil {
		return nil, nil, err
	}
	if q.Limit == 0 {
		q.Limit = RowsLimitDefault
	}
	if q.Limit < 0 || q.Limit > RowsLimitMax {
		return nil, nil, &InputError{Field: "RowQuery.Limit", Rule: fmt.Sprintf("must be 1 to %d", RowsLimitMax)}
	}
	if q.State == "" {
		q.State = RowReady
	}
	if q.OlderThan < 0 || q.NewerThan < 0 {
		return nil, nil, &InputError{Field: "RowQuery.OlderThan", Rule: "OlderThan and NewerThan must not be negative"}
	}
	if err := checkText("RowQuery.MessageType", q.MessageType, HeadersMaxBytes, false); err != nil {
		return nil, nil, err
	}
	// From the start: before every row oldest first, after every row
	// newest first.
	after := RowCursor{At: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), ID: math.MinInt64}
	if q.Newest {
		after = RowCursor{At: time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC), ID: math.MaxInt64}
	}
	if q.After != nil {
		after = *q.After
	}
	// One row more than the page says whether a next one exists.
	p := db.RowsParams{Newest: q.Newest, Queue: q.Queue, AfterAt: after.At, AfterID: after.ID, MaxRows: int32(q.Limit + 1),
		ScanRows: int32(q.Limit + 1), MessageType: q.MessageType, OlderThanSeconds: q.OlderThan.Seconds(), NewerThanSeconds: q.NewerThan.Seconds()}
	if q.Filtered() {
		p.ScanRows = RowsScan
	}
	switch {
	case q.Key != "":
		if err := checkKey("RowQuery.Key", q.Key); err != nil {
			return nil, nil, err
		}
		p.Mode, p.Key = "key", q.Key
	case q.State == RowReady || q.State == RowScheduled || q.State == RowRetrying:
		p.Mode, p.Due, p.Retrying = "pending", q.State == RowReady, q.State == RowRetrying
	case q.State == RowLeased || q.State == RowExpired:
		p.Mode, p.Expired = "leased", q.State == RowExpired
	default:
		return nil, nil, &InputError{Field: "RowQuery.State",
			Rule: fmt.Sprintf("must be %s, %s, %s, %s or %s (blocked rows are listed by their Key); is %q", RowReady, RowScheduled, RowRetrying,
				RowLeased, RowExpired, q.State)}
	}
	rows, err := o.queries(o.pool).Rows(ctx, p)
	if err != nil {
		return nil, nil, o.readError(ctx, "Rows", err)
	}
	// The rows that matched, then the last row the page read: the next
	// page goes on after the page's last row when it is full, else after
	// the last row read when the read stopped at its bound.
	cursor := func(r db.RowsRow) *RowCursor {
		if p.Mode == "leased" {
			return &RowCursor{At: r.LeaseExpiresAt, ID: r.ID}
		}
		return &RowCursor{At: r.NextAttemptAt, ID: r.ID}
	}
	var next *RowCursor
	if n := len(rows); n > 0 && rows[n-1].Edge {
		edge := rows[n-1]
		rows = rows[:n-1]
		switch {
		case len(rows) > q.Limit:
			rows = rows[:q.Limit]
			next = cursor(rows[q.Limit-1])
		case edge.Pos >= int64(p.ScanRows):
			next = cursor(edge)
		}
	}
	out := make([]RowSummary, len(rows))
	for i, r := range rows {
		s := RowSummary{ID: r.ID, Queue: r.Queue, Attempts: int(r.AttemptsCount), Deliveries: int(r.DeliveriesCount), LastError: r.LastError,
			CreatedAt: r.CreatedAt, NextAttemptAt: r.NextAttemptAt,
			State: rowState(r.Leased, r.Blocked, r.LeaseExpiresAt, r.NextAttemptAt, r.ReadAt)}
		if r.Leased {
			s.LeaseExpiresAt = r.LeaseExpiresAt
		}
		if r.OrderingKey != nil {
			s.OrderingKey = *r.OrderingKey
		}
		if r.TimerID != nil {
			s.TimerID = *r.TimerID
		}
		s.MessageType = r.MessageType
		out[i] = s
	}
	return out, next, nil
}
