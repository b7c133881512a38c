package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
)

// logCounter is the subscribers' slog handler: it counts records by level
// and message, for the report, and writes them to w when verbose.
type logCounter struct {
	mu     *sync.Mutex
	counts map[string]int
	out    slog.Handler // nil: count only
}

func newLogCounter(w io.Writer, verbose bool) *logCounter {
	l := &logCounter{mu: &sync.Mutex{}, counts: map[string]int{}}
	if verbose {
		l.out = slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})
	}
	return l
}

func (l *logCounter) Enabled(context.Context, slog.Level) bool { return true }

func (l *logCounter) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		l.mu.Lock()
		l.counts[r.Level.String()+" "+r.Message]++
		l.mu.Unlock()
	}
	if l.out != nil {
		return l.out.Handle(ctx, r)
	}
	return nil
}

func (l *logCounter) WithAttrs(as []slog.Attr) slog.Handler {
	c := *l
	if l.out != nil {
		c.out = l.out.WithAttrs(as)
	}
	return &c
}

func (l *logCounter) WithGroup(name string) slog.Handler {
	c := *l
	if l.out != nil {
		c.out = l.out.WithGroup(name)
	}
	return &c
}

// summary lists the warnings and errors logged, most frequent first.
func (l *logCounter) summary() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for m, n := range l.counts {
		out = append(out, fmt.Sprintf("%5d × %s", n, m))
	}
	slices.SortFunc(out, func(a, b string) int { return strings.Compare(b, a) })
	return out
}
