package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// endLog is a worker's file of handler ends: one line per delivery,
// "id unix-nanoseconds kind". A handler's end cannot wait for the
// database (the worker's connections may be stalled or half-open, and
// the worker killed before they recover), so it is appended to a file,
// which a SIGKILL of the worker does not undo once written; the
// coordinator loads every file into the deliveries table before it
// counts.
type endLog struct {
	mu sync.Mutex
	f  *os.File
}

// openEndLog opens this process's end file in dir.
func openEndLog(dir string) (*endLog, error) {
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("worker-%d.ends", os.Getpid())), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &endLog{f: f}, nil
}

// write appends the end of delivery id, in one write.
func (l *endLog) write(id int64, end time.Time, kind string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err := fmt.Fprintf(l.f, "%d %d %s\n", id, end.UnixNano(), kind)
	return err
}

func (l *endLog) close() error { return l.f.Close() }

// loadEnds sets handler_end and end_kind of every delivery whose worker
// wrote its end. A line cut short by a kill is skipped: that delivery's
// end counts as unknown.
func (c *coordinator) loadEnds(ctx context.Context) error {
	files, err := filepath.Glob(filepath.Join(c.ends, "*.ends"))
	if err != nil {
		return err
	}
	var rows [][]any
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) != 3 {
				continue
			}
			id, err1 := strconv.ParseInt(fields[0], 10, 64)
			ns, err2 := strconv.ParseInt(fields[1], 10, 64)
			if err1 != nil || err2 != nil {
				continue
			}
			rows = append(rows, []any{id, time.Unix(0, ns), fields[2]})
		}
		err = sc.Err()
		_ = f.Close()
		if err != nil {
			return err
		}
	}
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE ends (id bigint, at timestamptz, kind text) ON COMMIT DROP`); err != nil {
		return err
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"ends"}, []string{"id", "at", "kind"}, pgx.CopyFromRows(rows)); err != nil {
		return fmt.Errorf("loading the handlers' ends: %w", err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s.deliveries AS d SET handler_end = e.at, end_kind = e.kind
		FROM ends AS e WHERE e.id = d.id`, pgx.Identifier{c.schema}.Sanitize())); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
