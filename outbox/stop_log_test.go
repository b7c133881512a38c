package outbox

import (
	stdcmp "cmp"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// stopRecords keeps the subscriber's log records about its stop, each
// as its message and its attributes' values.
type stopRecords struct {
	mu   sync.Mutex
	recs []stopRecord
}

type stopRecord struct {
	Level slog.Level
	Msg   string
	Attrs map[string]any
}

func (h *stopRecords) Enabled(context.Context, slog.Level) bool { return true }
func (h *stopRecords) Handle(_ context.Context, r slog.Record) error {
	if !strings.HasPrefix(r.Message, "outbox: stop") {
		return nil
	}
	rec := stopRecord{Level: r.Level, Msg: r.Message, Attrs: map[string]any{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.Attrs[a.Key] = a.Value.Any()
		return true
	})
	h.mu.Lock()
	h.recs = append(h.recs, rec)
	h.mu.Unlock()
	return nil
}
func (h *stopRecords) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *stopRecords) WithGroup(string) slog.Handler      { return h }

func (h *stopRecords) all() []stopRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]stopRecord(nil), h.recs...)
}

// A stop says what it is doing: when Run's context ends it logs, before
// any running handler returns, that it stops, how many handlers run and
// until when it waits for them; when it has stopped, whether every
// handler finished (drained) or the graceful timeout forced the stop, and
// how many handlers it abandoned.
func TestStopSaysWhatItIsDoing(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		graceful time.Duration // 0: the default
		release  bool          // the handler returns once the stop is logged
		ended    string
		aband    int64
	}{
		{name: "drained", release: true, ended: "drained"},
		{name: "forced", graceful: 100 * time.Millisecond, ended: "forced", aband: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			e.publish("q")
			logs := &stopRecords{}
			cfg := fastConfig[struct{}](nil)
			cfg.GracefulTimeout = tt.graceful
			cfg.Logger = slog.New(logs)
			running, release := make(chan struct{}), make(chan struct{})
			defer close(release) // the forced stop abandons the handler: it returns at the test's end
			s := startSub(t, e.ob, []string{"q"}, func(context.Context, *Message[struct{}]) error {
				close(running)
				<-release // ignoring its context, as a stuck handler does
				return nil
			}, cfg)
			receive(t, running)
			stopAt := time.Now()
			s.cancel()
			eventually(t, "the stop logged", func() bool { return len(logs.all()) > 0 })
			graceful := stdcmp.Or(tt.graceful, GracefulTimeoutDefault)
			began := logs.all()[0]
			deadline, _ := began.Attrs["deadline"].(time.Time)
			if deadline.Before(stopAt.Add(graceful)) || deadline.After(time.Now().Add(graceful)) {
				t.Errorf("deadline %v, want the stop's time plus %v", deadline, graceful)
			}
			delete(began.Attrs, "deadline")
			want := stopRecord{Level: slog.LevelInfo,
				Msg:   "outbox: stopping; waiting for running handlers until the deadline",
				Attrs: map[string]any{"running": int64(1), "graceful_timeout": graceful}}
			if diff := cmp.Diff(want, began); diff != "" {
				t.Errorf("the record of the stop's beginning (-want +got):\n%s", diff)
			}
			if tt.release {
				release <- struct{}{}
			}
			err := s.stop()
			if (tt.ended == "forced") != errors.Is(err, ErrGracefulTimeout) {
				t.Errorf("Run: %v", err)
			}
			recs := logs.all()
			last := recs[len(recs)-1]
			delete(last.Attrs, "took")
			want = stopRecord{Level: slog.LevelInfo, Msg: "outbox: stopped",
				Attrs: map[string]any{"ended": tt.ended, "abandoned": tt.aband, "unwritten": int64(0)}}
			if diff := cmp.Diff(want, last); diff != "" {
				t.Errorf("the record of the stop's end (-want +got):\n%s", diff)
			}
			if len(recs) != 2 {
				t.Errorf("%d records of the stop, want 2: %v", len(recs), recs)
			}
		})
	}
}
