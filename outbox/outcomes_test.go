package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/dbx"
)

func TestStorableText(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", dbx.LastErrorMaxRunes+10)
	for _, c := range []struct{ in, want string }{
		{"plain", "plain"},
		{"nul\x00byte", "nul\uFFFDbyte"},
		{"bad \xff utf8", "bad \uFFFD utf8"},
		{long, long[:2*dbx.LastErrorMaxRunes]},
	} {
		got := dbx.StorableText(c.in)
		if got != c.want || !utf8.ValidString(got) {
			t.Errorf("dbx.StorableText(%.20q) = %.40q, want %.40q", c.in, got, c.want)
		}
	}
}

// A Reject whose text holds NUL and invalid UTF-8 is dead-lettered with
// the text made storable, and the other rows are acknowledged.
func TestUnstorableErrorTextIsDeadLetteredSanitised(t *testing.T) {
	t.Parallel()
	e := setup(t)
	bad := e.publishWith(db.PublishParams{Queue: "q", Payload: []byte("bad")})
	for range 5 {
		e.publish("q")
	}
	failing(t, e, "q", fastConfig[string](nil), func(m *Message[string]) error {
		if m.Payload == "bad" {
			return Reject(fmt.Errorf("bad record %s", "a\x00b\xffc"))
		}
		return nil
	})
	eventually(t, "every row handled", func() bool { return e.count("outbox") == 0 })
	dl, ok := e.dlqRow(bad)
	if !ok || deref(dl.LastError) != "rejected: bad record a\uFFFDb\uFFFDc" {
		t.Errorf("dead letter of %d: %v %q", bad, ok, deref(dl.LastError))
	}
}

// An outcome the database refuses (here a constraint on the dead-letter
// table) is given up alone: the other rows are acknowledged, the refused
// row stays leased for a later delivery, and Run stops promptly.
func TestRefusedOutcomeDoesNotHoldBackTheOthers(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.exec(`CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.payload = 'poison' THEN RAISE EXCEPTION 'refused' USING ERRCODE = 'check_violation'; END IF;
			IF TG_OP = 'DELETE' AND OLD.payload = 'sticky' THEN RAISE EXCEPTION 'refused' USING ERRCODE = 'check_violation'; END IF;
			RETURN coalesce(NEW, OLD);
		END $$`)
	e.exec(`CREATE TRIGGER refuse BEFORE INSERT ON outbox_dlq FOR EACH ROW EXECUTE FUNCTION refuse()`)
	e.exec(`CREATE TRIGGER refuse BEFORE DELETE ON outbox FOR EACH ROW EXECUTE FUNCTION refuse()`)
	poison := e.publishWith(db.PublishParams{Queue: "q", Payload: []byte("poison")})
	sticky := e.publishWith(db.PublishParams{Queue: "q", Payload: []byte("sticky")})
	for range 20 {
		e.publish("q")
	}
	rec := &events{}
	cfg := fastConfig[string](rec)
	cfg.AckBatchSize = 50
	s := startSub(t, e.ob, []string{"q"}, func(_ context.Context, m *Message[string]) error {
		if m.Payload == "poison" {
			return Reject(errors.New("no"))
		}
		return nil
	}, cfg)
	eventually(t, "the other rows acked", func() bool { return e.count("outbox") == 2 })
	eventually(t, "two refusals", func() bool { return len(rec.named(EventWriteRefused)) == 2 })
	if err := s.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	for _, id := range []int64{poison, sticky} {
		if r, ok := e.row(id); !ok || !r.AcquiredToken.Valid {
			t.Errorf("row %d: present %v, leased %v; want left leased", id, ok, r.AcquiredToken.Valid)
		}
	}
	if n := len(rec.named(EventAcked)); n != 20 {
		t.Errorf("acked %d rows, want 20", n)
	}
}

type nilPointerError struct{ msg *string }

func (e *nilPointerError) Error() string { return *e.msg }

// A handler error whose Error method panics (a typed nil pointer) ends
// the delivery like any error, with a text naming the type; the process
// survives.
func TestHandlerErrorWhoseErrorMethodPanics(t *testing.T) {
	t.Parallel()
	e := setup(t)
	id := e.publish("q")
	cfg := fastConfig[string](nil)
	cfg.Retry = NoRetry{}
	failing(t, e, "q", cfg, func(*Message[string]) error {
		var err *nilPointerError
		return err
	})
	eventually(t, "the dead letter", func() bool { _, ok := e.dlqRow(id); return ok })
	dl, _ := e.dlqRow(id)
	if !strings.HasPrefix(deref(dl.LastError), "error of type *outbox.nilPointerError whose Error method panicked") {
		t.Errorf("last_error = %q", deref(dl.LastError))
	}
}

// While every outcome write fails (a trigger raises), Run still returns
// within GracefulTimeout plus StopSlack of its context ending, and says
// how many outcomes it gave up.
func TestRunReturnsWithinGracefulTimeoutWhileWritesFail(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// The sequence counts the deletes tried: nextval survives the
	// rollback. The error is one a retry may cure (insufficient
	// resources), so the acknowledger retries it.
	e.exec(`CREATE SEQUENCE deletes_tried`)
	e.exec(`CREATE FUNCTION broken() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM nextval('deletes_tried'); RAISE EXCEPTION 'database trouble' USING ERRCODE = 'insufficient_resources'; END $$`)
	e.exec(`CREATE TRIGGER broken BEFORE DELETE ON outbox FOR EACH ROW EXECUTE FUNCTION broken()`)
	for range 3 {
		e.publish("q")
	}
	handled := make(chan struct{}, 3)
	cfg := fastConfig[string](nil)
	cfg.GracefulTimeout = 300 * time.Millisecond
	s := startSub(t, e.ob, []string{"q"}, func(context.Context, *Message[string]) error {
		handled <- struct{}{}
		return nil
	}, cfg)
	for range 3 {
		<-handled
	}
	eventually(t, "the acknowledger retrying", func() bool {
		var tried int
		if err := e.db.Pool.QueryRow(e.ctx, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM deletes_tried`).Scan(&tried); err != nil {
			t.Fatal(err)
		}
		return tried >= 2
	})
	e.stopIsBounded(s, cfg.GracefulTimeout, 3)
}

// recordingHandler keeps every log record with the trace value of the
// context it was logged with.
type recordingHandler struct {
	mu   *sync.Mutex
	recs *[]loggedRecord
}

type loggedRecord struct {
	level slog.Level
	msg   string
	trace any
	count int64
}

type traceKey struct{}

func (h recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h recordingHandler) Handle(ctx context.Context, r slog.Record) error {
	lr := loggedRecord{level: r.Level, msg: r.Message, trace: ctx.Value(traceKey{})}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "count" {
			lr.count = a.Value.Int64()
		}
		return true
	})
	h.mu.Lock()
	*h.recs = append(*h.recs, lr)
	h.mu.Unlock()
	return nil
}
func (h recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordingHandler) WithGroup(string) slog.Handler      { return h }

// A burst of dead letters logs one full line (with the handler's context,
// so a trace id reaches it) and one summary with the count of the rest.
func TestBurstOfDeadLettersIsSummarised(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for range 30 {
		e.publish("q")
	}
	var (
		mu   sync.Mutex
		recs []loggedRecord
	)
	cfg := fastConfig[string](nil)
	cfg.Logger = slog.New(recordingHandler{mu: &mu, recs: &recs})
	sub, err := NewSubscriber(e.ob, []string{"q"}, func(context.Context, *Message[string]) error {
		return Reject(errors.New("no"))
	}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := startIn(t, context.WithValue(context.Background(), traceKey{}, "trace-1"), sub)
	eventually(t, "30 dead letters", func() bool { return e.count("outbox_dlq") == 30 })
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	var got []loggedRecord
	for _, r := range recs {
		// The test pool is sized by the machine's cores; the warning
		// about its size is not this test's.
		if r.level == slog.LevelWarn && !strings.HasPrefix(r.msg, poolWarning) {
			got = append(got, r)
		}
	}
	want := []loggedRecord{
		{level: slog.LevelWarn, msg: "outbox: delivery ended; row dead-lettered", trace: "trace-1"},
		{level: slog.LevelWarn, msg: "outbox: more outcomes of this kind in the last interval", count: 29},
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(loggedRecord{})); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
}
