package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/internal/childtest"
	"github.com/outboxgen/outboxgen/internal/pgtest"
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

// A second SIGINT ends the demo at once while its first stop is held up
// (here its cleanup waits for a lock the test holds): the first says the
// demo stops, the second exits with status 1.
func TestDemoEndsAtOnceOnASecondSignal(t *testing.T) {
	t.Parallel()
	pool, dsn := pgtest.Database(t, outboxtest.Connect(t), "orders_demo")
	cmd := exec.Command(os.Args[0], "-orders=200000")
	cmd.Env = append(os.Environ(), demoChild+"=1", "DATABASE_URL="+dsn)
	var out childtest.Buffer
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
