package outbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/lease"
	"github.com/outboxgen/outboxgen/internal/msgtype"
)

// Message is one delivery of an outbox row to a handler.
type Message[T any] struct {
	// ID is the row's id, stable across deliveries.
	ID int64
	// Queue is the queue the row was published to.
	Queue string
	// Payload is the decoded message.
	Payload T
	// Headers are the row's headers, reserved ones included. A row whose
	// headers are not an object of strings (another client wrote it)
	// never reaches a handler: it ends with reason decode_error.
	Headers map[string]string
	// OrderingKey is the row's ordering key, or empty. A row another
	// client wrote with the key "" (which PublishOpts treats as no key) is
	// keyed all the same: its key's rows are handled one at a time.
	OrderingKey string
	// TimerID is the row's timer id, or empty.
	TimerID string
	// Deliveries counts the claims of this row, this one included. Above 1
	// the row was delivered before (a retry, or a reclaim after a crash).
	Deliveries int
	// Attempts counts the earlier handled attempts that failed.
	Attempts int
	// CreatedAt is when the row was published (server clock), within the
	// years 1 to 9999: another client's infinity is the last microsecond
	// of 9999, and its -infinity the first of year 1.
	CreatedAt time.Time
}

// CorrelationID returns the correlation-id header.
func (m *Message[T]) CorrelationID() string { return m.Headers[HeaderCorrelationID] }

// ContentType returns the content-type header.
func (m *Message[T]) ContentType() string { return m.Headers[HeaderContentType] }

// MessageType returns the message-type header: the type the row was
// published as, or empty.
func (m *Message[T]) MessageType() string { return m.Headers[HeaderMessageType] }

// contentTypeAccepter is implemented by codecs that read more than their
// own content type. Other codecs accept their ContentType() or rows
// written without one (by plain SQL, say).
type contentTypeAccepter interface {
	Accepts(contentType string) bool
}

// Accepts reports true: raw bytes can be read whatever wrote them.
func (BytesCodec) Accepts(string) bool { return true }

// headerCache remembers the last header document a worker decoded: rows
// published by one PublishBatch share their header bytes, and copying a
// small map costs less than reading JSON. A document's headers are kept
// once two rows in a row had it: rows published one at a time each have
// a correlation id of their own, and keeping every document would copy
// every row's headers for nothing. It also holds the message type the
// worker's T expects, worked out (with reflection) on first use, so a
// cache serves one T.
type headerCache struct {
	raw string            // the last document decoded
	m   map[string]string // its headers, when kept (see above)

	typeKnown bool
	msgType   msgtype.Type
	typeErr   error
}

// decode reads a headers column, which must be an object of strings: this
// library writes nothing else, and the table refuses anything but an
// object. Values of other types, written by other clients, are an error
// naming the first such key; a null value is one too, where
// encoding/json alone would read it as "". Each call returns a map of its
// own, which the caller may change.
func (c *headerCache) decode(raw []byte) (map[string]string, error) {
	same := string(raw) == c.raw
	if same && c.m != nil {
		return maps.Clone(c.m), nil
	}
	doc := c.raw
	if !same {
		doc = string(raw)
	}
	m, plain := stringObject(doc)
	if !plain {
		var err error
		if m, err = decodeHeadersJSON(raw); err != nil {
			return nil, err
		}
	}
	c.raw, c.m = doc, nil
	if same || !plain {
		c.m = maps.Clone(m)
	}
	return m, nil
}

// decodeHeadersJSON is decode's reading of what stringObject leaves to
// encoding/json: every document that is not a plain object of strings.
func decodeHeadersJSON(raw []byte) (map[string]string, error) {
	var m map[string]string
	err := json.Unmarshal(raw, &m)
	if err != nil || bytes.Contains(raw, []byte("null")) {
		if bad := notStrings(raw); bad != nil {
			return nil, bad
		}
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

// stringObject reads s as encoding/json reads it into a map of strings,
// for the documents headers columns hold: a JSON object whose values are
// strings of valid UTF-8 with no escape but the two-character ones, which
// is how PostgreSQL prints the headers this library writes. The map's
// keys and values are substrings of s wherever they need no unescaping,
// so reading a document costs its map. ok is false for every other
// document (another value, a \u escape, a byte encoding/json would
// replace or refuse), and encoding/json reads those. Rows published one
// at a time each have a correlation id of their own, so no cache serves
// them, and encoding/json took most of a message's decoding there.
func stringObject(s string) (m map[string]string, ok bool) {
	i := skipSpace(s, 0)
	if i == len(s) || s[i] != '{' {
		return nil, false
	}
	m = make(map[string]string, 4)
	i = skipSpace(s, i+1)
	if i < len(s) && s[i] == '}' {
		return m, skipSpace(s, i+1) == len(s)
	}
	for {
		var k, v string
		if k, i, ok = jsonString(s, i); !ok {
			return nil, false
		}
		if i = skipSpace(s, i); i == len(s) || s[i] != ':' {
			return nil, false
		}
		if v, i, ok = jsonString(s, skipSpace(s, i+1)); !ok {
			return nil, false
		}
		m[k] = v
		if i = skipSpace(s, i); i == len(s) {
			return nil, false
		}
		switch s[i] {
		case ',':
			i = skipSpace(s, i+1)
		case '}':
			return m, skipSpace(s, i+1) == len(s)
		default:
			return nil, false
		}
	}
}

// skipSpace returns the index of the first byte of s from i on that is
// not JSON whitespace.
func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// jsonString reads the JSON string that starts at s[i], returning its
// value and the index after its closing quote; ok is false for no string
// there and for one stringObject leaves to encoding/json.
func jsonString(s string, i int) (v string, next int, ok bool) {
	if i == len(s) || s[i] != '"' {
		return "", 0, false
	}
	start, ascii := i+1, true
	var b []byte // the value unescaped so far, once it held an escape
	for j := start; j < len(s); j++ {
		c := s[j]
		switch {
		case c == '"':
			if !ascii && !utf8.ValidString(s[start:j]) {
				return "", 0, false
			}
			if b == nil {
				return s[start:j], j + 1, true
			}
			return string(b), j + 1, true
		case c < 0x20:
			return "", 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		case c == '\\':
			if j+1 == len(s) {
				return "", 0, false
			}
			var u byte
			switch s[j+1] {
			case '"', '\\', '/':
				u = s[j+1]
			case 'b':
				u = '\b'
			case 'f':
				u = '\f'
			case 'n':
				u = '\n'
			case 'r':
				u = '\r'
			case 't':
				u = '\t'
			default:
				return "", 0, false
			}
			if b == nil {
				b = append(make([]byte, 0, len(s)-start), s[start:j]...)
			}
			b = append(b, u)
			j++
			continue
		}
		if b != nil {
			b = append(b, c)
		}
	}
	return "", 0, false
}

// notStrings returns an error naming the first key, in byte order, of the
// JSON object raw whose value is not a string, or nil when there is none
// (or raw is no object).
func notStrings(raw []byte) error {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return nil
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v := bytes.TrimLeft(m[k], " \t\r\n")
		if len(v) == 0 || v[0] == '"' {
			continue
		}
		kind := "a number"
		switch v[0] {
		case 'n':
			kind = "null"
		case 't', 'f':
			kind = "a boolean"
		case '{':
			kind = "an object"
		case '[':
			kind = "an array"
		}
		return fmt.Errorf("header %q is %s, not a string", k, kind)
	}
	return nil
}

// readHeaders reads a headers column for an operator: as a map when it is
// an object of strings, else as stored, so that reading rows other clients
// wrote never fails and shows what they wrote.
func readHeaders(hc *headerCache, raw []byte) (map[string]string, json.RawMessage) {
	if len(raw) == 0 {
		return nil, nil
	}
	if h, err := hc.decode(raw); err == nil {
		return h, nil
	}
	return nil, json.RawMessage(slices.Clone(raw))
}

// decodeMessage turns a claimed row into a Message. An error means the row
// can never be handled: its headers or payload are unreadable, or it was
// published as another type than T.
func decodeMessage[T any](m *Message[T], c Codec[T], contentType string, row *db.ClaimRow, hc *headerCache) error {
	*m = Message[T]{
		ID: row.ID, Queue: row.Queue, Deliveries: int(row.DeliveriesCount), Attempts: lease.Attempts(row.AttemptsCount),
		CreatedAt: row.CreatedAt,
	}
	if row.OrderingKey != nil {
		m.OrderingKey = *row.OrderingKey
	}
	if row.TimerID != nil {
		m.TimerID = *row.TimerID
	}
	if len(row.Headers) > 0 && string(row.Headers) != "null" {
		h, err := hc.decode(row.Headers)
		if err != nil {
			return fmt.Errorf("headers are not an object of strings: %w", err)
		}
		m.Headers = h
	}
	if ct := m.Headers[HeaderContentType]; ct != "" && ct != contentType {
		a, ok := c.(contentTypeAccepter)
		if !ok || !a.Accepts(ct) {
			return fmt.Errorf("content type %q; codec %T reads %q", ct, c, contentType)
		}
	}
	if mt := m.Headers[HeaderMessageType]; mt != "" {
		if !hc.typeKnown {
			hc.msgType, hc.typeErr = messageTypeOf(c)
			hc.typeKnown = true
		}
		switch {
		case hc.typeErr != nil:
			return fmt.Errorf("message type %q; the subscriber's own type has no valid name: %w", mt, hc.typeErr)
		case !hc.msgType.Reads(mt) && hc.msgType.Qualified != "" && msgtype.IsQualified(mt):
			// A name of an earlier release names the packages of its types.
			return fmt.Errorf("message type %q; this subscriber reads %q, or %q as earlier releases spelled it", mt, hc.msgType.Name, hc.msgType.Qualified)
		case !hc.msgType.Reads(mt):
			return fmt.Errorf("message type %q; this subscriber reads %q", mt, hc.msgType.Name)
		}
	}
	payload, err := decodePayload(c, row.Payload)
	if err != nil {
		return err
	}
	m.Payload = payload
	return nil
}

// decodePayload runs the codec, turning its panic into an error.
func decodePayload[T any](c Codec[T], b []byte) (v T, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("codec %T panicked decoding: %v", c, r)
		}
	}()
	v, err = c.Decode(b)
	if err != nil {
		return v, fmt.Errorf("codec %T: %w", c, err)
	}
	return v, nil
}
