package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/outbox/outboxtest"
)

// quickstartChild, when set, makes this test binary run the quick start's
// main instead of its tests.
const quickstartChild = "QUICKSTART_CHILD"

func init() {
	if os.Getenv(quickstartChild) == "" {
		return
	}
	// The handler logs "order o-1 placed" through the log package; holding
	// that write keeps the handler running, so the stop has one to wait
	// for. The subscriber's slog lines go to standard error directly.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	log.SetOutput(holdPlaced{})
	main()
	os.Exit(0)
}

// holdPlaced writes to standard error, and never returns from writing the
// line of an order placed.
type holdPlaced struct{}

func (holdPlaced) Write(p []byte) (int, error) {
	n, err := os.Stderr.Write(p)
	if bytes.Contains(p, []byte("placed")) {
		select {}
	}
	return n, err
}

// lockedBuffer collects a child's output while the test reads it.
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

// databaseOfItsOwn returns the URL of a database made for the test and
// dropped when it ends: the quick start migrates public.outbox.
func databaseOfItsOwn(t *testing.T) string {
	t.Helper()
	admin := outboxtest.Connect(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "quickstart_" + hex.EncodeToString(b[:])
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
		return u.String()
	}
	return strings.TrimSpace(dsn + " dbname=" + name)
}

// waitFor waits until out holds want, or the child exits first.
func waitFor(t *testing.T, out *lockedBuffer, exited <-chan struct{}, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(out.String(), want) {
		select {
		case <-exited:
			t.Fatalf("the quick start exited before it wrote %q:\n%s", want, out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the quick start did not write %q:\n%s", want, out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The first SIGINT logs the stop, which waits for the running handler;
// a second ends the process at once, before the graceful timeout, with
// status 1.
func TestQuickStartEndsAtOnceOnASecondSignal(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), quickstartChild+"=1", "DATABASE_URL="+databaseOfItsOwn(t))
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
	waitFor(t, &out, exited, "order o-1 placed")
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	waitFor(t, &out, exited, `msg="outbox: stopping; waiting for running handlers until the deadline"`)
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(time.Minute):
		t.Fatalf("the quick start still runs after a second SIGINT:\n%s", out.String())
	}
	var exit *exec.ExitError
	if !errors.As(waitErr, &exit) || exit.ExitCode() != 1 {
		t.Errorf("the quick start ended with %v, want exit status 1:\n%s", waitErr, out.String())
	}
	got := out.String()
	for _, want := range []string{"running=1", `msg="a second signal: exiting without waiting for running handlers" signal=interrupt`} {
		if !strings.Contains(got, want) {
			t.Errorf("the quick start's output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "graceful timeout passed") || strings.Contains(got, "outbox: stopped") {
		t.Errorf("the quick start waited for the graceful timeout:\n%s", got)
	}
}
