package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxgen/outboxgen/internal/dbx"
	"github.com/outboxgen/outboxgen/internal/naming"
)

// Rows written by other clients: psql, COPY, another language. They hold
// what the library never writes; each must end delivered, dead-lettered
// with a reason and an error that says what was wrong, or refused by the
// database with a clear error. Nothing stalls, nothing is lost.

// foreign is one row another client writes into queue: the INSERT's
// extra columns and their SQL values.
type foreign struct {
	name    string
	columns string // after queue, e.g. "payload, headers"
	values  string // SQL for columns
}

// insertForeign inserts r into queue and returns its id.
func (e *env) insertForeign(queue string, r foreign) int64 {
	e.t.Helper()
	var id int64
	override := ""
	if strings.HasPrefix(r.columns, "id,") {
		override = "OVERRIDING SYSTEM VALUE "
	}
	sql := fmt.Sprintf(`INSERT INTO outbox (queue, %s) %sVALUES ($1, %s) RETURNING id`, r.columns, override, r.values)
	if err := e.db.Pool.QueryRow(e.ctx, sql, queue).Scan(&id); err != nil {
		e.t.Fatalf("%s: %s: %v", r.name, sql, err)
	}
	return id
}

// fate is what became of a row: handled (acked by the handler) or
// dead-lettered with a reason and an error text.
type fate struct {
	Handled bool
	Reason  string
	Error   string
}

// fateOf reads what became of row id; handled are the ids a handler
// acknowledged.
func (e *env) fateOf(id int64, handled map[int64]bool) fate {
	e.t.Helper()
	if handled[id] {
		return fate{Handled: true}
	}
	if _, ok := e.row(id); ok {
		return fate{Reason: "(still in the outbox)"}
	}
	r, ok := e.dlqRow(id)
	if !ok {
		return fate{Reason: "(lost)"}
	}
	return fate{Reason: r.FailureReason, Error: deref(r.LastError)}
}

// drainForeign runs a subscriber of queue with handler h until queue has
// no rows left, and returns the ids it acknowledged.
func drainForeign[T any](t *testing.T, e *env, queue string, cfg *SubscriberConfig[T], h func(*Message[T]) error) map[int64]bool {
	t.Helper()
	var (
		mu      sync.Mutex
		handled = map[int64]bool{}
	)
	sub := startSub(t, e.ob, []string{queue}, func(_ context.Context, m *Message[T]) error {
		err := h(m)
		if err == nil {
			mu.Lock()
			handled[m.ID] = true
			mu.Unlock()
		}
		return err
	}, cfg)
	eventually(t, "queue "+queue+" drained", func() bool {
		return e.countWhere(fmt.Sprintf("queue = '%s'", queue)) == 0
	})
	if err := sub.stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	return handled
}

// wantFate is the expected fate of a case: handled when reason is empty,
// else dead-lettered with reason and an error containing text.
type wantFate struct {
	reason string
	text   string
}

// checkFates compares what became of each case's row with want.
func checkFates(t *testing.T, e *env, ids map[string]int64, handled map[int64]bool, want map[string]wantFate) {
	t.Helper()
	for name, id := range ids {
		got := e.fateOf(id, handled)
		w := want[name]
		switch {
		case w.reason == "" && !got.Handled:
			t.Errorf("%s: %+v; want it handled", name, got)
		case w.reason != "" && (got.Reason != w.reason || !strings.Contains(got.Error, w.text)):
			t.Errorf("%s: %+v; want reason %s and an error containing %q", name, got, w.reason, w.text)
		}
	}
}

// headerCases are headers no publisher of this library writes.
var headerCases = []struct {
	foreign
	typed, raw wantFate
}{
	{foreign{"number value", "payload, headers", `'{}', '{"a": 1}'`},
		wantFate{ReasonDecodeError, `header "a" is a number, not a string`}, wantFate{ReasonDecodeError, `header "a" is a number, not a string`}},
	{foreign{"null value", "payload, headers", `'{}', '{"a": null}'`},
		wantFate{ReasonDecodeError, `header "a" is null, not a string`}, wantFate{ReasonDecodeError, `header "a" is null, not a string`}},
	{foreign{"object value", "payload, headers", `'{}', '{"a": {"b": "c"}}'`},
		wantFate{ReasonDecodeError, `header "a" is an object, not a string`}, wantFate{ReasonDecodeError, `header "a" is an object, not a string`}},
	{foreign{"array value", "payload, headers", `'{}', '{"a": ["x"]}'`},
		wantFate{ReasonDecodeError, `header "a" is an array, not a string`}, wantFate{ReasonDecodeError, `header "a" is an array, not a string`}},
	{foreign{"boolean value", "payload, headers", `'{}', '{"ok": "yes", "a": false}'`},
		wantFate{ReasonDecodeError, `header "a" is a boolean, not a string`}, wantFate{ReasonDecodeError, `header "a" is a boolean, not a string`}},
	{foreign{"null content type", "payload, headers", `'{}', '{"content-type": null}'`},
		wantFate{ReasonDecodeError, `header "content-type" is null, not a string`}, wantFate{ReasonDecodeError, `header "content-type" is null, not a string`}},
	{foreign{"deeply nested", "payload, headers", `'{}', (repeat('{"a": ', 5000) || '"x"' || repeat('}', 5000))::jsonb`},
		wantFate{ReasonDecodeError, `header "a" is an object, not a string`}, wantFate{ReasonDecodeError, `header "a" is an object, not a string`}},
	{foreign{"huge, of strings", "payload, headers", `'{}', (SELECT jsonb_object_agg('k' || i, repeat('v', 1000)) FROM generate_series(1, 2000) AS i)`},
		wantFate{}, wantFate{}},
	{foreign{"odd keys", "payload, headers", `'{}', jsonb_build_object('', 'empty', 'a b', 'space', E'tab\t', 'tab', E'\x1b[31m', 'escape', '😀', 'emoji', '"''', 'quotes')`},
		wantFate{}, wantFate{}},
	{foreign{"empty object", "payload, headers", `'{}', '{}'`}, wantFate{}, wantFate{}},
	{foreign{"NULL", "payload, headers", `'{}', NULL`}, wantFate{}, wantFate{}},
	{foreign{"wrong content type", "payload, headers", `'{}', '{"content-type": "text/xml"}'`},
		wantFate{ReasonDecodeError, `content type "text/xml"`}, wantFate{}},
	{foreign{"wrong message type", "payload, headers", `'{}', '{"message-type": "acme.Invoice"}'`},
		wantFate{ReasonDecodeError, `message type "acme.Invoice"; this subscriber reads "shipment"`}, wantFate{}},
}

func TestHeadersThatAreNotStringsAreDeadLettered(t *testing.T) {
	t.Parallel()
	t.Run("typed", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ids := map[string]int64{}
		want := map[string]wantFate{}
		for _, c := range headerCases {
			ids[c.name], want[c.name] = e.insertForeign("h", c.foreign), c.typed
		}
		// Before and after: the operator's reads show headers that are not
		// strings as stored.
		pending, err := e.ob.Unprocessed(e.ctx, "h", 100)
		if err != nil || len(pending) != len(headerCases) {
			t.Fatalf("Unprocessed: %d rows, %v", len(pending), err)
		}
		if p := pending[0]; p.Headers != nil || string(p.RawHeaders) != `{"a": 1}` {
			t.Errorf("Unprocessed: headers %v, raw %s", p.Headers, p.RawHeaders)
		}
		var headers sync.Map
		handled := drainForeign(t, e, "h", fastConfig[shipment](nil), func(m *Message[shipment]) error {
			headers.Store(m.ID, m.Headers)
			return nil
		})
		checkFates(t, e, ids, handled, want)
		dead, err := e.ob.DeadLetters(e.ctx, DeadLetterFilter{}, 0, 100)
		if err != nil || len(dead) == 0 {
			t.Fatalf("DeadLetters: %v, %v", dead, err)
		}
		if d := dead[0]; d.ID != ids["number value"] || d.Headers != nil || string(d.RawHeaders) != `{"a": 1}` {
			t.Errorf("DeadLetters: row %d, headers %v, raw %s", d.ID, d.Headers, d.RawHeaders)
		}
		if d := dead[len(dead)-1]; d.ID != ids["wrong message type"] || d.RawHeaders != nil || d.Headers["message-type"] != "acme.Invoice" {
			t.Errorf("DeadLetters: row %d, headers %v, raw %s", d.ID, d.Headers, d.RawHeaders)
		}
		if h, _ := headers.Load(ids["odd keys"]); !cmp.Equal(h, map[string]string{
			"": "empty", "a b": "space", "tab\t": "tab", "\x1b[31m": "escape", "😀": "emoji", `"'`: "quotes"}) {
			t.Errorf("odd keys delivered as %q", h)
		}
		if h, _ := headers.Load(ids["huge, of strings"]); len(h.(map[string]string)) != 2000 {
			t.Errorf("huge headers delivered with %d keys, want 2000", len(h.(map[string]string)))
		}
	})
	t.Run("bytes", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ids := map[string]int64{}
		want := map[string]wantFate{}
		for _, c := range headerCases {
			ids[c.name], want[c.name] = e.insertForeign("h", c.foreign), c.raw
		}
		handled := drainForeign(t, e, "h", fastConfig[[]byte](nil), func(*Message[[]byte]) error { return nil })
		checkFates(t, e, ids, handled, want)
	})
}

func TestHeadersThatAreNotAnObjectAreRefusedByTheTable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, h := range []string{`[]`, `["a", "b"]`, `"x"`, `1`, `true`, `null`} {
		_, err := e.db.Pool.Exec(e.ctx, `INSERT INTO outbox (queue, payload, headers) VALUES ('q', '', $1::jsonb)`, h)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "23514" || pe.ConstraintName != "outbox_headers_chk" {
			t.Errorf("headers %s: %v; want a check violation of outbox_headers_chk", h, err)
		}
	}
	if n := e.count("outbox"); n != 0 {
		t.Errorf("%d rows inserted", n)
	}
}

// payloadCases are payloads a JSON subscriber of shipment cannot read,
// and one it can.
var payloadCases = []struct {
	foreign
	typed wantFate
}{
	{foreign{"not json", "payload", `'not json'`}, wantFate{ReasonDecodeError, "invalid character 'o' in literal null"}},
	{foreign{"empty", "payload", `''`}, wantFate{ReasonDecodeError, "unexpected end of JSON input"}},
	{foreign{"array for a struct", "payload", `'[1, 2]'`}, wantFate{ReasonDecodeError, "cannot unmarshal array into Go value of type outbox.shipment"}},
	{foreign{"number for a string field", "payload", `'{"id": 5}'`}, wantFate{ReasonDecodeError, "cannot unmarshal number into Go struct field shipment.id of type string"}},
	{foreign{"truncated", "payload", `'{"id": "s-1"'`}, wantFate{ReasonDecodeError, "unexpected end of JSON input"}},
	{foreign{"not UTF-8", "payload", `'\xfffe'::bytea`}, wantFate{ReasonDecodeError, "invalid character"}},
	{foreign{"another type's message", "payload, headers", `'{"id": "s-1"}', '{"content-type": "application/json", "message-type": "acme.Invoice"}'`},
		wantFate{ReasonDecodeError, `message type "acme.Invoice"; this subscriber reads`}},
	{foreign{"fits", "payload, headers", `'{"id": "s-1", "carrier": "ups"}', '{"content-type": "application/json"}'`}, wantFate{}},
}

func TestPayloadsTheCodecCannotReadAreDeadLettered(t *testing.T) {
	t.Parallel()
	t.Run("typed", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ids := map[string]int64{}
		want := map[string]wantFate{}
		for _, c := range payloadCases {
			ids[c.name], want[c.name] = e.insertForeign("p", c.foreign), c.typed
		}
		var got shipment
		handled := drainForeign(t, e, "p", fastConfig[shipment](nil), func(m *Message[shipment]) error {
			got = m.Payload
			return nil
		})
		checkFates(t, e, ids, handled, want)
		if got != (shipment{ID: "s-1", Carrier: "ups"}) {
			t.Errorf("delivered %+v", got)
		}
	})
	t.Run("bytes", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		ids := map[string]int64{}
		want := map[string]wantFate{}
		for _, c := range payloadCases {
			ids[c.name], want[c.name] = e.insertForeign("p", c.foreign), wantFate{}
		}
		var (
			mu  sync.Mutex
			got = map[int64][]byte{}
		)
		handled := drainForeign(t, e, "p", fastConfig[[]byte](nil), func(m *Message[[]byte]) error {
			mu.Lock()
			got[m.ID] = m.Payload
			mu.Unlock()
			return nil
		})
		checkFates(t, e, ids, handled, want)
		if p := got[ids["empty"]]; p == nil || len(p) != 0 {
			t.Errorf("empty payload delivered as %#v, want an empty slice", p)
		}
		if p := got[ids["not UTF-8"]]; string(p) != "\xff\xfe" {
			t.Errorf("bytes delivered as %q", p)
		}
	})
}

// columnCases set columns the library fills itself: NULL where it writes
// a value, and values it never writes. Payloads are valid JSON.
var columnCases = []foreign{
	{"explicit NULLs", "payload, headers, ordering_key, timer_id, first_attempt_at, last_attempt_at, last_error, acquired_at, acquired_token, lease_expires_at",
		`'{}', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL`},
	{"negative attempts", "payload, attempts_count", `'{}', -5`},
	{"negative deliveries", "payload, deliveries_count", `'{}', -5`},
	{"minimum counts", "payload, attempts_count, deliveries_count", `'{}', -2147483648, -2147483648`},
	{"next_attempt_at -infinity", "payload, next_attempt_at", `'{}', '-infinity'`},
	{"created_at in the future", "payload, created_at", `'{}', now() + interval '10 years'`},
	{"created_at infinity", "payload, created_at", `'{}', 'infinity'`},
	{"created_at -infinity", "payload, created_at", `'{}', '-infinity'`},
	{"first_attempt_at infinity", "payload, first_attempt_at, attempts_count", `'{}', 'infinity', 1`},
	{"first_attempt_at -infinity", "payload, first_attempt_at, attempts_count", `'{}', '-infinity', 1`},
	{"last_attempt_at infinity", "payload, last_attempt_at", `'{}', 'infinity'`},
	{"huge last_error", "payload, last_error", `'{}', repeat('é', 1000000)`},
	{"empty timer id", "payload, timer_id", `'{}', ''`},
	{"odd timer id", "payload, timer_id", `'{}', E'\t😀\n'`},
	{"negative id", "id, payload", `-42, '{}'`},
	{"leased, expired", "payload, acquired_at, acquired_token, lease_expires_at", `'{}', now(), gen_random_uuid(), now() - interval '1 second'`},
	{"leased at infinity until -infinity", "payload, acquired_at, acquired_token, lease_expires_at", `'{}', 'infinity', gen_random_uuid(), '-infinity'`},
	{"keyed, blocked by hand", "payload, ordering_key, blocked", `'{}', 'k', true`},
}

func TestRowsWithOddColumnValuesAreDelivered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ids := map[string]int64{}
	want := map[string]wantFate{}
	for _, c := range columnCases {
		ids[c.name] = e.insertForeign("c", c)
	}
	var (
		mu  sync.Mutex
		got = map[int64]*Message[shipment]{}
	)
	handled := drainForeign(t, e, "c", fastConfig[shipment](nil), func(m *Message[shipment]) error {
		mu.Lock()
		got[m.ID] = m
		mu.Unlock()
		return nil
	})
	checkFates(t, e, ids, handled, want)
	for _, name := range []string{"negative attempts", "negative deliveries", "minimum counts"} {
		if m := got[ids[name]]; m == nil || m.Attempts != 0 || m.Deliveries != 1 {
			t.Errorf("%s: delivered %+v; want 0 attempts and the first delivery", name, m)
		}
	}
	if m := got[ids["created_at infinity"]]; m == nil || !m.CreatedAt.Equal(timeMax) {
		t.Errorf("created_at infinity: delivered %+v; want CreatedAt %v", m, timeMax)
	}
	if m := got[ids["created_at -infinity"]]; m == nil || !m.CreatedAt.Equal(timeMin) {
		t.Errorf("created_at -infinity: delivered %+v; want CreatedAt %v", m, timeMin)
	}
	if m := got[ids["odd timer id"]]; m == nil || m.TimerID != "\t😀\n" {
		t.Errorf("odd timer id: delivered %+v", m)
	}
}

// Timestamps are read within the years 1 to 9999, which Go prints and
// encodes as JSON: infinity as the last microsecond, -infinity as the
// first.
var (
	timeMax = time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC)
	timeMin = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
)

// The claim adds a delivery: at the integer maximum it must stay there
// rather than fail the claim of the whole batch.
func TestClaimOfARowAtMaxDeliveriesDoesNotOverflow(t *testing.T) {
	t.Parallel()
	for _, maxDeliveries := range []int{0, -1} {
		t.Run(fmt.Sprintf("MaxDeliveries=%d", maxDeliveries), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			before := e.publish("q")
			huge := e.insertForeign("q", foreign{"max deliveries", "payload, deliveries_count, last_error", `'{}', 2147483647, 'crashed'`})
			long := e.insertForeign("q", foreign{"long error", "payload, deliveries_count, last_error", `'{}', 2147483647, repeat('é', 1000000)`})
			after := e.publish("q")
			cfg := fastConfig[[]byte](nil)
			cfg.MaxDeliveries = maxDeliveries
			var deliveries sync.Map
			handled := drainForeign(t, e, "q", cfg, func(m *Message[[]byte]) error {
				deliveries.Store(m.ID, m.Deliveries)
				return nil
			})
			if !handled[before] || !handled[after] {
				t.Errorf("rows claimed with it: handled %v; want %d and %d", handled, before, after)
			}
			if maxDeliveries < 0 {
				if n, _ := deliveries.Load(huge); n != math.MaxInt32 {
					t.Errorf("delivered %v times; want %d", n, math.MaxInt32)
				}
				return
			}
			got, _ := e.dlqRow(huge)
			want := "claimed 2147483647 times; MaxDeliveries is 25; last handler error: crashed"
			if got.FailureReason != ReasonMaxDeliveries || deref(got.LastError) != want || got.DeliveriesCount != math.MaxInt32 {
				t.Errorf("dead letter %+v (%s); want max_deliveries, %d deliveries, %q", got, deref(got.LastError), math.MaxInt32, want)
			}
			// Another client's last_error of any length is cut with the rest.
			got, _ = e.dlqRow(long)
			if n := utf8.RuneCountInString(deref(got.LastError)); got.FailureReason != ReasonMaxDeliveries || n != dbx.LastErrorMaxRunes {
				t.Errorf("dead letter %+v with a last error of %d characters; want max_deliveries and %d", got.ID, n, dbx.LastErrorMaxRunes)
			}
		})
	}
}

// Recording an attempt adds one: at the integer maximum the retry and the
// dead letter must be written, not refused by the database again and
// again.
func TestAttemptsAtTheirMaximumSaturate(t *testing.T) {
	t.Parallel()
	t.Run("retry exhausted", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		id := e.insertForeign("q", foreign{"max attempts", "payload, attempts_count", `'{}', 2147483647`})
		drainForeign(t, e, "q", fastConfig[[]byte](nil), func(*Message[[]byte]) error { return errors.New("boom") })
		got, _ := e.dlqRow(id)
		if got.FailureReason != ReasonRetryExhausted || got.AttemptsCount != math.MaxInt32 || deref(got.LastError) != "boom" {
			t.Errorf("dead letter %+v (%s); want retry_exhausted after %d attempts", got, deref(got.LastError), math.MaxInt32)
		}
	})
	t.Run("retried", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		id := e.insertForeign("q", foreign{"max attempts", "payload, attempts_count", `'{}', 2147483647`})
		cfg := fastConfig[[]byte](nil)
		cfg.Retry = ConstantRetry{}
		var (
			mu    sync.Mutex
			calls []int
		)
		handled := drainForeign(t, e, "q", cfg, func(m *Message[[]byte]) error {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, m.Attempts)
			if len(calls) < 3 {
				return errors.New("again")
			}
			return nil
		})
		if !handled[id] || !cmp.Equal(calls, []int{math.MaxInt32, math.MaxInt32, math.MaxInt32}) {
			t.Errorf("handled %v, attempts seen %v; want it handled on the third call, at the maximum each time", handled[id], calls)
		}
	})
	t.Run("negative", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		id := e.insertForeign("q", foreign{"negative attempts", "payload, attempts_count", `'{}', -7`})
		cfg := fastConfig[[]byte](nil)
		cfg.Retry = LinearRetry{Initial: time.Millisecond, Step: time.Millisecond, MaxAttempts: 2}
		var (
			mu    sync.Mutex
			calls []int
		)
		drainForeign(t, e, "q", cfg, func(m *Message[[]byte]) error {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, m.Attempts)
			return errors.New("boom")
		})
		got, _ := e.dlqRow(id)
		if got.FailureReason != ReasonRetryExhausted || got.AttemptsCount != 2 || !cmp.Equal(calls, []int{0, 1}) {
			t.Errorf("dead letter %+v after calls with attempts %v; want retry_exhausted after 2 attempts, seen as 0 and 1", got, calls)
		}
	})
}

// A row due at infinity, or so far ahead that the wait overflows a
// Duration, is never due: the idle fetcher must back off as usual, not
// claim in a loop, and not warn about it.
func TestRowsDueAtInfinityDoNotMakeTheFetcherSpin(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, at := range []string{"infinity", "100000-01-01", "294276-12-31 23:59:59.999999+00"} {
		e.insertForeign("q", foreign{at, "payload, next_attempt_at", fmt.Sprintf("'{}', '%s'", at)})
	}
	due := e.insertForeign("q", foreign{"-infinity", "payload, next_attempt_at", `'{}', '-infinity'`})
	rec := &events{}
	cfg := fastConfig[[]byte](rec)
	cfg.MinFetchInterval, cfg.MaxFetchInterval = 50*time.Millisecond, time.Second
	var (
		mu   sync.Mutex
		logs []loggedRecord
	)
	cfg.Logger = slog.New(recordingHandler{mu: &mu, recs: &logs})
	handled := make(chan int64, 1)
	s := startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[[]byte]) error {
		handled <- m.ID
		return nil
	}, cfg)
	if got := receive(t, handled); got != due {
		t.Errorf("handled row %d, want %d (due at -infinity)", got, due)
	}
	// BenchmarkIdleFetcherWithRowsDueAtInfinity measures the claims a
	// second.
	idleSettles(t, rec, cfg.MaxFetchInterval, "rows due at infinity")
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, r := range logs {
		if r.level >= slog.LevelWarn && !strings.HasPrefix(r.msg, poolWarning) { // the test pool's size is the machine's
			t.Errorf("logged %v %q", r.level, r.msg)
		}
	}
	if n := e.count("outbox"); n != 3 {
		t.Errorf("%d rows left, want the 3 never due", n)
	}
}

// Timestamps no publisher writes (infinite, far ahead, in the future)
// must not fail the operator's reads of the queue or the dead-letter
// table, nor those of other queues.
func TestInfiniteTimestampsDoNotBreakInspection(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.publish("other")
	rows := []foreign{
		{"created_at -infinity", "payload, created_at", `'{}', '-infinity'`},
		{"created_at infinity", "payload, created_at", `'{}', 'infinity'`},
		{"created_at in the future", "payload, created_at", `'{}', now() + interval '1 year'`},
		{"due at infinity", "payload, next_attempt_at, attempts_count", `'{}', 'infinity', 1`},
		{"due at -infinity", "payload, next_attempt_at, attempts_count", `'{}', '-infinity', 1`},
		{"attempted at infinity", "payload, first_attempt_at, last_attempt_at", `'{}', 'infinity', '-infinity'`},
	}
	for _, r := range rows {
		e.insertForeign("q", r)
		e.insertForeign("future", foreign{r.name, "payload, created_at", `'{}', now() + interval '1 year'`})
	}
	// Keys held by heads scheduled at infinity, whose waiting rows were
	// created at -infinity and in the future.
	e.insertForeign("keyed", foreign{"head", "payload, ordering_key, next_attempt_at", `'{}', 'a', 'infinity'`})
	e.insertForeign("keyed", foreign{"waiting", "payload, ordering_key, created_at", `'{}', 'a', '-infinity'`})
	e.insertForeign("keyed", foreign{"head", "payload, ordering_key, next_attempt_at", `'{}', 'b', 'infinity'`})
	e.insertForeign("keyed", foreign{"waiting", "payload, ordering_key, created_at", `'{}', 'b', now() + interval '1 day'`})
	e.exec(`INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failed_at, failure_reason)
		VALUES (-1, 'q', '', 1, 1, '-infinity', 'infinity', 'rejected'), (-2, 'q', '', 1, 1, 'infinity', '-infinity', 'rejected')`)

	stats, err := e.ob.QueueStats(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	byQueue := map[string]QueueStats{}
	for _, s := range stats {
		byQueue[s.Queue] = s
	}
	if s := byQueue["q"]; s.OldestAge != math.MaxInt64 || s.Ready != 5 || s.Scheduled != 1 || s.DeadLettered != 2 {
		t.Errorf("q: %+v; want the saturated age of a row created at -infinity, 5 ready, 1 scheduled, 2 dead-lettered", s)
	}
	if s := byQueue["future"]; s.OldestAge != 0 || s.Ready != len64(rows) {
		t.Errorf("future: %+v; want age 0 and %d ready", s, len(rows))
	}
	if s := byQueue["keyed"]; s.HeldKeysScheduled != 2 || s.OldestHeldKey != "a" || s.OldestHeldAge != math.MaxInt64 || s.Blocked != 2 {
		t.Errorf("keyed: %+v; want 2 keys held, the oldest a, its age saturated", s)
	}
	if s := byQueue["other"]; s.Ready != 1 || s.OldestAge < 0 || s.OldestAge > time.Minute {
		t.Errorf("other: %+v", s)
	}

	b, err := e.ob.RetryBacklog(e.ctx, []string{"q"})
	if err != nil || b.Rows != 2 || b.NextDueIn != math.MinInt64 {
		t.Errorf("RetryBacklog: %+v, %v; want 2 rows, the earliest overdue without bound", b, err)
	}
	pending, err := e.ob.Unprocessed(e.ctx, "q", 100)
	if err != nil || len(pending) != len(rows) {
		t.Fatalf("Unprocessed: %d rows, %v; want %d", len(pending), err, len(rows))
	}
	if due := pending[3].DueAt; !due.Equal(timeMax) {
		t.Errorf("Unprocessed: a row due at infinity is due at %v; want %v", due, timeMax)
	}
	dead, err := e.ob.DeadLetters(e.ctx, DeadLetterFilter{}, math.MinInt64, 10)
	if err != nil || len(dead) != 2 {
		t.Fatalf("DeadLetters: %+v, %v", dead, err)
	}
	if !dead[0].CreatedAt.Equal(timeMax) || !dead[0].FailedAt.Equal(timeMin) ||
		!dead[1].CreatedAt.Equal(timeMin) || !dead[1].FailedAt.Equal(timeMax) {
		t.Errorf("DeadLetters read infinite timestamps as %v %v, %v %v", dead[0].CreatedAt, dead[0].FailedAt, dead[1].CreatedAt, dead[1].FailedAt)
	}
}

func len64[T any](s []T) int64 { return int64(len(s)) }

// Queue names other clients may use. Printable ones are served like any
// other; names with control characters are refused by NewSubscriber, so
// their rows wait for an operator, and must not disturb other queues or
// the operator's reads.
var (
	printableQueues = []string{"with space", `quo"te's`, "😀 emoji", strings.Repeat("q", QueueMaxBytes), strings.Repeat("😀", 63) + "abc", "x"}
	controlQueues   = []string{"tab\there", "new\nline", "\x1b[31mred", "bell\a"}
)

func TestOddQueueNamesNeverBreakOtherQueuesOrReads(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ids := map[string]int64{}
	for _, q := range append(slices.Clone(printableQueues), controlQueues...) {
		ids[q] = e.insertForeign(q, foreign{q, "payload", `'{}'`})
	}
	for _, q := range []string{"", strings.Repeat("q", QueueMaxBytes+1), strings.Repeat("😀", 64)} {
		_, err := e.db.Pool.Exec(e.ctx, `INSERT INTO outbox (queue, payload) VALUES ($1, '')`, q)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "23514" || pe.ConstraintName != "outbox_queue_chk" {
			t.Errorf("queue of %d bytes: %v; want a check violation of outbox_queue_chk", len(q), err)
		}
	}
	for _, q := range controlQueues {
		_, err := NewSubscriber(e.ob, []string{q}, func(context.Context, *Message[[]byte]) error { return nil }, nil)
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != "queues[0]" || ce.Rule != "must be printable UTF-8" {
			t.Errorf("NewSubscriber(%q): %v; want a *ConfigError", q, err)
		}
	}

	// The operator's reads see every queue, whatever its name.
	stats, err := e.ob.QueueStats(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range stats {
		names = append(names, s.Queue)
	}
	want := append(slices.Clone(printableQueues), controlQueues...)
	slices.Sort(want)
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("QueueStats queues (-want +got):\n%s", diff)
	}
	for _, q := range controlQueues {
		if p, err := e.ob.Unprocessed(e.ctx, q, 10); err != nil || len(p) != 1 || p[0].ID != ids[q] {
			t.Errorf("Unprocessed(%q): %+v, %v", q, p, err)
		}
		if b, err := e.ob.RetryBacklog(e.ctx, []string{q}); err != nil || b.Rows != 0 {
			t.Errorf("RetryBacklog(%q): %+v, %v", q, b, err)
		}
	}

	// One subscriber serves every printable queue; the others' rows stay.
	handled := make(chan int64, len(printableQueues))
	s := startSub(t, e.ob, printableQueues, func(_ context.Context, m *Message[[]byte]) error {
		if m.ID != ids[m.Queue] {
			t.Errorf("row %d delivered with queue %q", m.ID, m.Queue)
		}
		handled <- m.ID
		return nil
	}, fastConfig[[]byte](nil))
	for range printableQueues {
		receive(t, handled)
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	if n := e.count("outbox"); n != len(controlQueues) {
		t.Errorf("%d rows left; want the %d of queues no subscriber can serve", n, len(controlQueues))
	}

	// Dead letters of every queue are listed, filtered, replayed and
	// purged by name.
	for i, q := range controlQueues {
		e.exec(`INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason)
			VALUES ($1, $2, '', 1, 1, now(), 'rejected')`, -1-i, q)
	}
	for _, q := range controlQueues {
		dead, err := e.ob.DeadLetters(e.ctx, DeadLetterFilter{Queue: q}, math.MinInt64, 10)
		if err != nil || len(dead) != 1 || dead[0].Queue != q {
			t.Errorf("DeadLetters of %q: %+v, %v", q, dead, err)
		}
	}
	res, err := e.ob.ReplayDeadLetters(e.ctx, DeadLetterFilter{Queue: controlQueues[0]}, nil)
	if err != nil || res.Replayed != 1 {
		t.Errorf("replay of %q: %+v, %v", controlQueues[0], res, err)
	}
	if res, err := e.ob.PurgeDeadLetters(e.ctx, DeadLetterFilter{Queue: controlQueues[1]}, nil); err != nil || res.Deleted != 1 {
		t.Errorf("purge of %q: %+v, %v", controlQueues[1], res, err)
	}
	if n := e.countWhere(fmt.Sprintf("queue = %s", naming.QuoteLiteral(controlQueues[0]))); n != 2 {
		t.Errorf("%q holds %d rows after the replay, want 2", controlQueues[0], n)
	}
}

// Ordering keys no publisher of this library writes: the empty string
// (PublishOpts treats "" as no key, SQL can write it), blanks, control
// characters, the separator the key lock hashes with, emoji, a long key.
// Each is simply a key: its rows are handled one at a time, in order.
func TestEveryOrderingKeyIsAKeyTheEmptyStringToo(t *testing.T) {
	t.Parallel()
	e := setup(t)
	keys := []string{"", " ", "\t", "\n", "a\x1fb", "a", "😀", strings.Repeat("k", 4000)}
	const perKey = 4
	want := map[string][]int64{}
	for range perKey {
		for _, k := range keys {
			want[k] = append(want[k], e.insertForeign("q", foreign{"keyed", "payload, ordering_key", fmt.Sprintf("'{}', %s", naming.QuoteLiteral(k))}))
		}
		e.insertForeign("q", foreign{"unkeyed", "payload", `'{}'`})
	}
	stats, err := e.ob.QueueStats(e.ctx)
	if err != nil || len(stats) != 1 || stats[0].Blocked != int64(len(keys)*(perKey-1)) || stats[0].Ready != int64(len(keys)+perKey) {
		t.Fatalf("QueueStats: %+v, %v; want %d blocked, %d ready", stats, err, len(keys)*(perKey-1), len(keys)+perKey)
	}

	var (
		mu      sync.Mutex
		got     = map[string][]int64{}
		running = map[string]bool{}
	)
	cfg := fastConfig[[]byte](nil)
	cfg.Workers = 8
	drainForeign(t, e, "q", cfg, func(m *Message[[]byte]) error {
		k, ok := "", false
		mu.Lock()
		for _, key := range keys {
			if slices.Contains(want[key], m.ID) {
				k, ok = key, true
			}
		}
		if ok {
			if running[k] {
				t.Errorf("key %q: row %d handled while another row of the key runs", k, m.ID)
			}
			running[k] = true
			got[k] = append(got[k], m.ID)
			if m.OrderingKey != k {
				t.Errorf("row %d delivered with key %q, want %q", m.ID, m.OrderingKey, k)
			}
		}
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		mu.Lock()
		running[k] = false
		mu.Unlock()
		return nil
	})
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rows handled per key, in order (-want +got):\n%s", diff)
	}
	if n := e.handOffs(); n != 0 {
		t.Errorf("%d hand-overs left", n)
	}
}

// The time since a first attempt written as ±infinity saturates: one in
// the infinite past has used up any MaxTotalDelay (the sum with the next
// delay must not wrap around to a small one), one in the infinite future
// none of it.
func TestRetryCapsHoldForAFirstAttemptAtInfinity(t *testing.T) {
	t.Parallel()
	e := setup(t)
	past := e.insertForeign("q", foreign{"past", "payload, first_attempt_at, attempts_count", `'{}', '-infinity', 1`})
	future := e.insertForeign("q", foreign{"future", "payload, first_attempt_at, attempts_count", `'{}', 'infinity', 1`})
	cfg := fastConfig[[]byte](nil)
	cfg.Retry = ConstantRetry{Delay: time.Millisecond, MaxAttempts: 3, MaxTotalDelay: time.Hour}
	drainForeign(t, e, "q", cfg, func(*Message[[]byte]) error { return errors.New("boom") })
	for id, attempts := range map[int64]int32{past: 2, future: 3} {
		if got, _ := e.dlqRow(id); got.FailureReason != ReasonRetryExhausted || got.AttemptsCount != attempts {
			t.Errorf("row %d: %+v; want retry_exhausted after %d attempts", id, got, attempts)
		}
	}
	if ok := (ConstantRetry{Delay: time.Hour, MaxTotalDelay: 2 * time.Hour}).caps().allow(1, math.MaxInt64, time.Hour); ok {
		t.Error("a retry after the longest elapsed time is allowed")
	}
}
