// Package childtest runs a test binary again as a child process (a
// subscriber or a relay that a test kills), so tests can SIGKILL what
// they test and start it again.
package childtest

import (
	"bytes"
	"os"
	"os/exec"
	"sync"
	"testing"
)

// Child is one run of the test binary as a child process.
type Child struct {
	cmd    *exec.Cmd
	stderr Buffer
}

// Start runs the test binary with no test selected (-test.run=^$) and the
// current environment plus env, which its TestMain reads to become the
// child. The child is killed when tb ends, if it still runs.
func Start(tb testing.TB, env ...string) *Child {
	tb.Helper()
	c := &Child{cmd: exec.Command(os.Args[0], "-test.run=^$")}
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.Stderr = &c.stderr
	if err := c.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			_ = c.cmd.Process.Kill()
			_ = c.cmd.Wait()
		}
	})
	return c
}

// Kill ends the child with SIGKILL and waits for it; it fails tb when the
// child had exited on its own before.
func (c *Child) Kill(tb testing.TB) {
	tb.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		tb.Fatal(err)
	}
	_ = c.cmd.Wait()
	if c.cmd.ProcessState.Exited() {
		tb.Fatalf("the child exited (%v) before it was killed:\n%s", c.cmd.ProcessState, c.Stderr())
	}
}

// Wait waits for the child to exit on its own (a crash it caused, say) and
// returns how it ended, as exec.Cmd.Wait does.
func (c *Child) Wait() error { return c.cmd.Wait() }

// Stderr returns what the child wrote to its standard error so far.
func (c *Child) Stderr() string { return c.stderr.String() }

// Buffer collects a child's output while a test reads it: safe for one
// writer and readers at once.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
