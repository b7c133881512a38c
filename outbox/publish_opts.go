package outbox

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outboxgen/outboxgen/internal/msgtype"
)

// PublishOpts are per-message options of [Publisher.Publish] and
// [Publisher.PublishBatch]. A nil *PublishOpts means none.
type PublishOpts struct {
	// Headers travel with the message. Keys must be non-empty printable
	// UTF-8 without spaces; values must be UTF-8 without NUL (U+0000),
	// which PostgreSQL's jsonb cannot store. The reserved keys
	// content-type and correlation-id are set by the publisher, and
	// traceparent must be a W3C traceparent. Keys and values together,
	// reserved ones included, are capped at HeadersMaxBytes.
	Headers map[string]string

	// CorrelationID is stored in the correlation-id header. Empty means a
	// fresh random id per Publish call (shared by a PublishBatch). At most 255 bytes of printable UTF-8;
	// the same limit holds for OrderingKey and TimerID.
	CorrelationID string

	// OrderingKey groups messages that must be handled one at a time, in
	// the commit order of the transactions that published them, within the
	// queue, by every subscriber in every process. Empty means no ordering.
	//
	// Only the oldest row of a key is claimable; it holds the key while it
	// is leased, waiting for a retry, or scheduled for later (Delay, At),
	// and its acknowledgement or dead-lettering makes the next row
	// claimable. The publishing transaction holds the key until it ends:
	// concurrent transactions publishing the same key wait for each other,
	// so keep them short and publish several keys in a consistent order.
	OrderingKey string

	// Delay makes the message deliverable this long after the publishing
	// statement runs, measured on the database server's clock. Must not be
	// negative. Zero means now. Every non-negative Duration is accepted:
	// the largest, about 292 years, is far inside the range of PostgreSQL's
	// timestamptz.
	Delay time.Duration

	// At makes the message deliverable at this time; a time in the past
	// means now. Zero means now. At and Delay are mutually exclusive. At
	// must lie in PostgreSQL's timestamptz range, 4714-11-24 00:00:00 UTC
	// BC to 294276-12-31 23:59:59.999999 UTC; it is stored to the
	// microsecond, truncated.
	At time.Time

	// TimerID names a scheduled message so it can be cancelled with
	// [Outbox.CancelTimer]. While a row of the queue holds the timer id,
	// Publish returns [ErrTimerExists]. Not allowed in PublishBatch.
	TimerID string
}

// atMin and atMax bound PublishOpts.At: PostgreSQL's timestamptz range.
// Go's year -4713 is 4714 BC. pgx truncates to the microsecond, so atMax
// is the last nanosecond that lands inside.
var (
	atMin = time.Date(-4713, time.November, 24, 0, 0, 0, 0, time.UTC)
	atMax = time.Date(294276, time.December, 31, 23, 59, 59, 999999999, time.UTC)
)

// maxKeyBytes caps correlation ids, ordering keys and timer ids: they are
// indexed or compared on every claim, not payload.
const maxKeyBytes = 255

// check validates the options; batch says whether they apply to a batch.
func (o *PublishOpts) check(batch bool) error {
	if o == nil {
		return nil
	}
	if o.Delay < 0 {
		return &InputError{Field: "PublishOpts.Delay", Rule: fmt.Sprintf("is %v; must not be negative", o.Delay)}
	}
	if o.Delay != 0 && !o.At.IsZero() {
		return &InputError{Field: "PublishOpts.At", Rule: "set Delay or At, not both"}
	}
	if !o.At.IsZero() && (o.At.Before(atMin) || o.At.After(atMax)) {
		return &InputError{Field: "PublishOpts.At", Rule: fmt.Sprintf(
			"is %v; must lie in PostgreSQL's timestamptz range, 4714-11-24 00:00:00 UTC BC to 294276-12-31 23:59:59.999999 UTC", o.At)}
	}
	if batch && o.TimerID != "" {
		return &InputError{Field: "PublishOpts.TimerID", Rule: "not allowed in PublishBatch: timers are published one at a time"}
	}
	for _, k := range []struct{ field, v string }{
		{"PublishOpts.CorrelationID", o.CorrelationID},
		{"PublishOpts.OrderingKey", o.OrderingKey},
		{"PublishOpts.TimerID", o.TimerID},
	} {
		if err := checkKey(k.field, k.v); err != nil {
			return err
		}
	}
	return nil
}

// checkKey enforces the rule for correlation ids, ordering keys and timer
// ids: at most maxKeyBytes of printable UTF-8 (so no NUL, which text
// cannot hold and which would abort the caller's transaction).
func checkKey(field, v string) error {
	if len(v) > maxKeyBytes {
		return &InputError{Field: field, Rule: fmt.Sprintf("is %d bytes; at most %d", len(v), maxKeyBytes)}
	}
	if !msgtype.Printable(v, true) {
		return &InputError{Field: field, Rule: "must be printable UTF-8"}
	}
	return nil
}

// checkText enforces what an operator's free text (a pause's reason, a
// dead letter's note, a search) must be to be stored or sent as text:
// valid UTF-8 without NUL, at most maxBytes bytes, and not empty when
// required.
func checkText(field, v string, maxBytes int, required bool) error {
	least := 0
	if required {
		least = 1
	}
	if len(v) < least || len(v) > maxBytes || !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 {
		return &InputError{Field: field, Rule: fmt.Sprintf("must be valid UTF-8 without NUL, %d to %d bytes; is %d", least, maxBytes, len(v))}
	}
	return nil
}

// schedule returns the delay and not-before time for the publish queries.
func (o *PublishOpts) schedule() (delaySeconds float64, notBefore *time.Time) {
	if o == nil {
		return 0, nil
	}
	if !o.At.IsZero() {
		at := o.At
		return 0, &at
	}
	return o.Delay.Seconds(), nil
}

func (o *PublishOpts) headers() map[string]string {
	if o == nil {
		return nil
	}
	return o.Headers
}

func (o *PublishOpts) orderingKey() *string {
	if o == nil || o.OrderingKey == "" {
		return nil
	}
	return &o.OrderingKey
}
