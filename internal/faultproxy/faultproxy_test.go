package faultproxy

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// echoServer accepts connections and echoes them, sending on ended the
// moment each connection's read side ends.
func echoServer(t *testing.T) (addr string, ended <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	ch := make(chan struct{}, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				_, _ = io.Copy(c, c)
				_ = c.Close()
				ch <- struct{}{}
			}()
		}
	}()
	return ln.Addr().String(), ch
}

func roundTrip(t *testing.T, c net.Conn, s string) {
	t.Helper()
	if _, err := c.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(s))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != s {
		t.Fatalf("read %q, %v; want %q", buf, err, s)
	}
}

// proxiedEcho starts an echo server behind a proxy and returns the
// proxy, a client connection through it that has made a round trip, and
// the server's channel of ended connections (echoServer).
func proxiedEcho(t *testing.T) (*Proxy, net.Conn, <-chan struct{}) {
	t.Helper()
	target, ended := echoServer(t)
	p, err := Listen(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, c, "before")
	return p, c, ended
}

func TestHalfOpenEndsTheServerSideAndSilencesTheClientSide(t *testing.T) {
	t.Parallel()
	p, c, ended := proxiedEcho(t)

	n, closed := p.HalfOpen()
	if n != 1 {
		t.Fatalf("HalfOpen left %d connections half-open, want 1", n)
	}
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the server's side did not end")
	}
	// The client can write, and reads neither an answer nor a close.
	if _, err := c.Write([]byte("after")); err != nil {
		t.Fatalf("write on the half-open connection: %v", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if k, err := c.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read on the half-open connection: %d bytes, %v; want a timeout", k, err)
	}
	select {
	case <-closed:
		t.Fatal("closed before the client closed its side")
	default:
	}

	// New connections pass.
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	roundTrip(t, c2, "new")

	_ = c.Close()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("closed did not fire after the client closed its side")
	}
}

func TestBlackholePassesNoCloseOn(t *testing.T) {
	t.Parallel()
	p, c, ended := proxiedEcho(t)

	p.Blackhole()
	// Nothing passes, and the client's close does not reach the server.
	if _, err := c.Write([]byte("lost")); err != nil {
		t.Fatalf("write into the blackhole: %v", err)
	}
	_ = c.Close()
	select {
	case <-ended:
		t.Fatal("the server's side ended when the client closed behind the blackhole")
	case <-time.After(300 * time.Millisecond):
	}
	// Cut ends it.
	if n := p.Cut(); n != 1 {
		t.Fatalf("Cut closed %d connections, want 1", n)
	}
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the server's side did not end at the cut")
	}
}
