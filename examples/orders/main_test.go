package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/outbox/outboxtest"
)

// demoChild, when set, makes this test binary run the demo's main, with
// the demo's flags, instead of its tests.
const demoChild = "ORDERS_DEMO_CHILD"

func init() {
	if os.Getenv(demoChild) != "" {
		main()
		os.Exit(0)
	}
}

// lockedBuffer collects the demo's output while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// databaseOfItsOwn returns a pool on a database made for the test, and
// its URL; the database is dropped when the test ends.
func databaseOfItsOwn(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	admin := outboxtest.Connect(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "orders_demo_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(t.Context(), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Skipf("a database of the test's own: %v", err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("dropping database %s: %v", name, err)
		}
	})
	dsn := admin.Config().ConnString()
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		dsn = u.String()
	} else {
		dsn = strings.TrimSpace(dsn + " dbname=" + name)
	}
	cfg := admin.Config()
	cfg.ConnConfig.Database = name
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, dsn
}

// A second SIGINT ends the demo at once while its first stop is held up
// (here its cleanup waits for a lock the test holds): the first says the
// demo stops, the second exits with status 1.
func TestDemoEndsAtOnceOnASecondSignal(t *testing.T) {
	t.Parallel()
	pool, dsn := databaseOfItsOwn(t)
	cmd := exec.Command(os.Args[0], "-orders=200000")
	cmd.Env = append(os.Environ(), demoChild+"=1", "DATABASE_URL="+dsn)
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	// Once the demo's table is there, hold a lock on it: its publishers
	// wait, and after the first signal so does its DROP SCHEMA.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var there bool
		if err := pool.QueryRow(t.Context(), "SELECT to_regclass('outboxgen_demo.orders') IS NOT NULL").Scan(&there); err != nil {
			t.Fatal(err)
		}
		if there {
			break
		}
		select {
		case <-exited:
			t.Fatalf("the demo exited before making its table:\n%s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the demo made no table:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(t.Context(), "LOCK TABLE outboxgen_demo.orders IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	const stopping = "orders: interrupt: stopping; publishing ends and the subscriber waits for its running handlers (a second signal exits at once)"
	for !strings.Contains(out.String(), stopping) {
		select {
		case <-exited:
			t.Fatalf("the demo exited after one signal:\n%s", out.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the demo did not say it stops:\n%s", out.String())
		}
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(time.Minute):
		t.Fatalf("the demo still runs after a second SIGINT:\n%s", out.String())
	}
	var exit *exec.ExitError
	if !errors.As(waitErr, &exit) || exit.ExitCode() != 1 {
		t.Errorf("the demo ended with %v, want exit status 1:\n%s", waitErr, out.String())
	}
	if want := "orders: interrupt again: exiting at once; schema outboxgen_demo is left"; !strings.Contains(out.String(), want) {
		t.Errorf("the demo's output lacks %q:\n%s", want, out.String())
	}
}
