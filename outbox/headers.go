package outbox

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/outboxgen/outboxgen/internal/msgtype"
)

// Reserved header keys. The publisher sets HeaderContentType from its codec,
// HeaderCorrelationID from [PublishOpts.CorrelationID] (or a fresh id), and
// HeaderMessageType from the message's Go type (see [MessageTyper]);
// callers may not set them. HeaderTraceparent, when given, must be a W3C
// trace-context traceparent.
const (
	HeaderContentType   = "content-type"
	HeaderCorrelationID = "correlation-id"
	HeaderTraceparent   = "traceparent"
	// HeaderMessageType names the type a row was published as: by
	// default the Go type's name without its package path (see
	// [MessageTyper] for the name and the rule). A typed subscriber
	// refuses a row of another type as a decode_error; rows without it
	// (written by plain SQL, or by a Publisher[[]byte]) are accepted.
	HeaderMessageType = "message-type"
)

// Headers [Outbox.ReplayDeadLetters] sets on each row it replays, linking
// it to the dead letter it came from so that its history is not lost:
// HeaderReplayedFrom holds the dead letter's id (its id in the outbox
// before it failed), HeaderFirstFailedAt when the row first failed, in RFC
// 3339 UTC with microseconds. A row replayed again keeps the
// HeaderFirstFailedAt of its first replay and gets the HeaderReplayedFrom
// of its latest. They are not reserved, but a replay overwrites
// HeaderReplayedFrom and keeps a HeaderFirstFailedAt it finds.
const (
	HeaderReplayedFrom  = "replayed-from"
	HeaderFirstFailedAt = "first-failed-at"
)

// HeadersMaxBytes caps a message's headers: the sum of the lengths of every
// key and value, reserved headers included.
const HeadersMaxBytes = 8 << 10

// traceparentRE is version-format 00: version-traceid-parentid-flags.
var traceparentRE = regexp.MustCompile(`^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)

// checkHeaders validates caller-supplied headers; reserved is the size of
// the reserved headers the publisher adds. field prefixes errors.
func checkHeaders(field string, h map[string]string, reserved int) error {
	size := reserved
	for k, v := range h {
		kf := fmt.Sprintf("%s[%q]", field, k)
		switch {
		case k == "":
			return &InputError{Field: field, Rule: "header keys must not be empty"}
		case !msgtype.Printable(k, false):
			return &InputError{Field: kf, Rule: "header keys must be printable UTF-8 without spaces"}
		case k == HeaderContentType:
			return &InputError{Field: kf, Rule: "is reserved: the publisher's codec sets it"}
		case k == HeaderCorrelationID:
			return &InputError{Field: kf, Rule: "is reserved: set PublishOpts.CorrelationID instead"}
		case k == HeaderMessageType:
			return &InputError{Field: kf, Rule: "is reserved: the publisher sets it from the message type (see MessageTyper)"}
		case k == HeaderTraceparent && !traceparentRE.MatchString(v):
			return &InputError{Field: kf, Rule: "must be a W3C traceparent (version-traceid-parentid-flags, lower-case hex)"}
		case !utf8.ValidString(v):
			return &InputError{Field: kf, Rule: "header values must be valid UTF-8"}
		case strings.IndexByte(v, 0) >= 0:
			return &InputError{Field: kf, Rule: "header values must not contain NUL (U+0000): PostgreSQL's jsonb cannot store it"}
		}
		size += len(k) + len(v)
	}
	if size > HeadersMaxBytes {
		return &InputError{Field: field,
			Rule: fmt.Sprintf("headers are %d bytes; at most %d (HeadersMaxBytes)", size, HeadersMaxBytes)}
	}
	return nil
}

// encodeHeaders adds the reserved headers to the caller's and encodes them
// for the headers column. An empty messageType is left out.
func encodeHeaders(h map[string]string, contentType, correlationID, messageType string) (json.RawMessage, error) {
	all := make(map[string]string, len(h)+3)
	for k, v := range h {
		all[k] = v
	}
	all[HeaderContentType] = contentType
	all[HeaderCorrelationID] = correlationID
	if messageType != "" {
		all[HeaderMessageType] = messageType
	}
	b, err := json.Marshal(all)
	if err != nil {
		return nil, wrapOp("encode headers", err)
	}
	return b, nil
}
