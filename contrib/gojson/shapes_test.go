package outboxgojson_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The types below are the message shapes the tests encode and decode with
// both encoding/json and go-json. Event holds one field of each kind.

// Money is a nested struct.
type Money struct {
	Amount   string `json:"amount"`
	Currency string `json:"currency"`
}

// Header is embedded in Event: ID and Seq are promoted, Kind is shadowed
// by Event.Kind, and Version collides with Audit.Version at the same
// depth, so that neither is encoded or decoded.
type Header struct {
	ID      string `json:"id"`
	Kind    string `json:"kind"`
	Version int    `json:"version"`
	Seq     int64
}

// Audit is embedded in Event through a pointer, which decoding allocates
// when it meets one of Audit's keys.
type Audit struct {
	Version int    `json:"version"`
	By      string `json:"by,omitempty"`
}

// trace is an unexported struct type whose exported fields are promoted.
type trace struct {
	TraceID string `json:"trace_id,omitempty"`
}

// Level is written by its MarshalJSON as "L<n>" and read back by its
// UnmarshalJSON, which records a JSON null as -1 so that the tests see
// whether it was called for one.
type Level int

func (l Level) MarshalJSON() ([]byte, error) {
	return strconv.AppendQuote(nil, "L"+strconv.Itoa(int(l))), nil
}

func (l *Level) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*l = -1
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimPrefix(s, "L"))
	if err != nil || !strings.HasPrefix(s, "L") {
		return fmt.Errorf("level %q is not L<n>", s)
	}
	*l = Level(n)
	return nil
}

// Code is written by its MarshalText as "C-<n>", as a value and as a map
// key.
type Code int

func (c Code) MarshalText() ([]byte, error) { return fmt.Appendf(nil, "C-%d", int(c)), nil }

func (c *Code) UnmarshalText(b []byte) error {
	s, ok := strings.CutPrefix(string(b), "C-")
	if !ok {
		return fmt.Errorf("code %q is not C-<n>", b)
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return err
	}
	*c = Code(n)
	return nil
}

// Window has its methods on the pointer: encoding/json calls MarshalJSON
// only for an addressable Window (one reached through a pointer).
type Window struct{ From, To int }

func (w *Window) MarshalJSON() ([]byte, error) {
	return fmt.Appendf(nil, "[%d, %d]", w.From, w.To), nil
}

func (w *Window) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var a [2]int
	if err := json.Unmarshal(b, &a); err != nil {
		return err
	}
	w.From, w.To = a[0], a[1]
	return nil
}

// Span is zero for omitzero when its IsZero says so: when both ends are
// equal.
type Span struct{ A, B int }

func (s Span) IsZero() bool { return s.A == s.B }

// Event is a message with a field of every shape the tests cover.
type Event = EventOf[float32]

// EventOf is Event with a Ratio of type F. EventOf[float64] tells the
// difference of go-json's float32 decoding from the others (see
// float32Explained).
type EventOf[F float32 | float64] struct {
	Header
	*Audit
	trace
	Kind string `json:"kind"`

	Total    Money   `json:"total"`
	Discount *Money  `json:"discount"`
	Note     *string `json:"note"`

	Qty   int     `json:"qty,string"`
	Price float64 `json:"price,string"`
	Paid  bool    `json:"paid,string"`
	Ref   *int64  `json:"ref,string"`
	Label string  `json:"label,string"`

	Count int8    `json:"count"`
	Units uint16  `json:"units"`
	Big   uint64  `json:"big"`
	Delta int64   `json:"delta"`
	Ratio F       `json:"ratio"`
	Score float64 `json:"score"`

	Tags   []string  `json:"tags"`
	Lines  []Money   `json:"lines"`
	Matrix [2][2]int `json:"matrix"`
	Blob   []byte    `json:"blob"`
	Digest [4]byte   `json:"digest"`

	Attrs  map[string]string `json:"attrs"`
	ByID   map[int]string    `json:"by_id"`
	ByCode map[Code]int      `json:"by_code"`

	Level   Level           `json:"level"`
	Code    Code            `json:"code"`
	CodePtr *Code           `json:"code_ptr"`
	Window  Window          `json:"window"`
	WinPtr  *Window         `json:"win_ptr"`
	Raw     json.RawMessage `json:"raw"`
	Any     any             `json:"any"`
	At      time.Time       `json:"at"`
	AtPtr   *time.Time      `json:"at_ptr,omitempty"`

	Opt       string         `json:"opt,omitempty"`
	OptInts   []int          `json:"opt_ints,omitempty"`
	OptMap    map[string]int `json:"opt_map,omitempty"`
	OptPtr    *int           `json:"opt_ptr,omitempty"`
	OptStruct Money          `json:"opt_struct,omitempty"`
	OptTime   time.Time      `json:"opt_time,omitempty"`
	Zero      time.Time      `json:"zero,omitzero"`
	ZeroSpan  Span           `json:"zero_span,omitzero"`
	ZeroMoney Money          `json:"zero_money,omitzero"`
	ZeroInts  []int          `json:"zero_ints,omitzero"`

	Skip string `json:"-"`
	// Dash has the key "-", by the tag "-," that encoding/json documents
	// for it. staticcheck suggests the tag "'-'," of encoding/json/v2,
	// which encoding/json ignores (the key would be "Dash").
	//lint:ignore SA5008 encoding/json documents the tag "-," for the key "-"
	Dash    string `json:"-,"`
	Plain   string
	Größe   string `json:"größe"`
	HTMLKey string `json:"x<y>&z"`
	private int
}

// CaseInner and CaseOuter have fields whose keys differ only in case, one
// of them promoted: a key that matches neither exactly goes to the
// shallower one.
type CaseInner struct{ AB int }

type CaseOuter struct {
	CaseInner
	Ab int `json:"ab"`
}

// Stamped embeds a type with a MarshalJSON method, which is promoted:
// the whole struct is written by it.
type Stamped struct {
	Level
	Note string
}

// Node can point to itself.
type Node struct {
	Name string
	Next *Node
}

// errMarshal is the error failingMarshaler returns.
var errMarshal = errors.New("refused")

// failingMarshaler fails to marshal itself.
type failingMarshaler struct{}

func (failingMarshaler) MarshalJSON() ([]byte, error) { return nil, errMarshal }

// rawJSON is written as the bytes it holds, checked and compacted by the
// encoder.
type rawJSON string

func (r rawJSON) MarshalJSON() ([]byte, error) { return []byte(r), nil }

// textPtr has its MarshalText on the pointer.
type textPtr struct{ N int }

func (t *textPtr) MarshalText() ([]byte, error) { return fmt.Appendf(nil, "t%d", t.N), nil }

// Order is a typical message: the one of the benchmarks.
type Order struct {
	OrderID    string `json:"order_id"`
	CustomerID string `json:"customer_id"`
	Total      Money  `json:"total"`
	Lines      int    `json:"lines"`
}
