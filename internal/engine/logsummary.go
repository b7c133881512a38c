package engine

import (
	"context"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/outboxgen/outboxgen/internal/lease"
)

// logSummaryInterval is how long per-row outcome logs of one kind are
// summarised after the first is written in full.
const logSummaryInterval = 10 * time.Second

// logSummary keeps a burst of retries or dead letters from becoming a log
// line per row: in each interval the first outcome of a queue and kind is
// logged in full, with the handler's context (so trace ids reach it), and
// the rest are counted and logged as one summary line when the interval
// ends.
type logSummary struct {
	log      *slog.Logger
	interval time.Duration

	mu      sync.Mutex
	seen    map[summaryKey]*summaryCount
	timer   *time.Timer
	stopped bool
}

type summaryKey struct{ queue, kind string }

type summaryCount struct {
	suppressed int
	lastError  string
}

func newLogSummary(log *slog.Logger, interval time.Duration) *logSummary {
	return &logSummary{log: log, interval: interval, seen: map[summaryKey]*summaryCount{}}
}

// note records one outcome of kind ("retried", "dead_lettered:<reason>",
// "deleted:<reason>") of delivery d, with its error text.
func (s *logSummary) note(d *lease.Delivery, kind, errText string) {
	k := summaryKey{d.Row.Queue, kind}
	s.mu.Lock()
	c, ok := s.seen[k]
	if !ok {
		s.seen[k] = &summaryCount{}
		if s.timer == nil && !s.stopped {
			s.timer = time.AfterFunc(s.interval, s.flush)
		}
	} else {
		c.suppressed++
		c.lastError = errText
	}
	s.mu.Unlock()
	if !ok {
		level, msg := summaryLevel(kind)
		s.log.Log(d.Context(), level, msg, append(rowAttrs(d), slog.String("outcome", kind), slog.String("error", errText))...)
	}
}

// flush logs the counts of the interval that ended and starts a new one.
func (s *logSummary) flush() {
	s.mu.Lock()
	seen := s.seen
	s.seen = map[summaryKey]*summaryCount{}
	s.timer = nil
	s.mu.Unlock()
	keys := make([]summaryKey, 0, len(seen))
	for k, c := range seen {
		if c.suppressed > 0 {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].queue < keys[j].queue || (keys[i].queue == keys[j].queue && keys[i].kind < keys[j].kind)
	})
	for _, k := range keys {
		c := seen[k]
		level, _ := summaryLevel(k.kind)
		s.log.Log(context.Background(), level, "outbox: more outcomes of this kind in the last interval",
			slog.String("queue", k.queue), slog.String("outcome", k.kind), slog.Int("count", c.suppressed),
			slog.Duration("interval", s.interval), slog.String("last_error", c.lastError))
	}
}

// close logs what is still counted and stops the interval timer.
func (s *logSummary) close() {
	s.mu.Lock()
	s.stopped = true
	if s.timer != nil {
		s.timer.Stop()
	}
	s.mu.Unlock()
	s.flush()
}

// summaryLevel is the level and first-line message of an outcome kind.
func summaryLevel(kind string) (slog.Level, string) {
	switch {
	case kind == "retried":
		return slog.LevelInfo, "outbox: handler failed; retrying"
	case strings.HasPrefix(kind, "dead_lettered"):
		return slog.LevelWarn, "outbox: delivery ended; row dead-lettered"
	default:
		return slog.LevelError, "outbox: delivery ended; row deleted (dead-lettering is off)"
	}
}
