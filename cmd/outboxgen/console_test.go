package main

import (
	"bufio"
	"context"
	"io"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// startConsole runs outboxgen console with args until the test ends and
// returns the URL it serves and its second line (the chosen outbox's).
func startConsole(t *testing.T, env map[string]string, args ...string) (string, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	var stderr strings.Builder
	go func() {
		done <- run(ctx, append([]string{"console", "-listen", "127.0.0.1:0"}, args...), pw, &stderr, func(k string) string { return env[k] })
		_ = pw.Close()
	}()
	out := bufio.NewReader(pr)
	line, err := out.ReadString('\n')
	second, err2 := out.ReadString('\n')
	if err != nil || err2 != nil {
		cancel()
		t.Fatalf("console printed %q %q, %v %v; stderr: %s", line, second, err, err2, stderr.String())
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("console exited %d after its context ended; stderr: %s", code, stderr.String())
			}
		case <-time.After(10 * time.Second):
			t.Error("console did not stop within 10 s of its context ending")
		}
	})
	url, _, ok := strings.Cut(strings.TrimPrefix(line, "outboxgen console on "), " ")
	if !ok || !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("console's first line: %q", line)
	}
	return url, strings.TrimSuffix(second, "\n")
}

func get(t *testing.T, url, user, password string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

func TestConsoleServesTheOutboxesOnLoopback(t *testing.T) {
	t.Parallel()
	d, _, env, _ := migrated(t)
	env["OUTBOX_SCHEMA"] = d.Schema
	url, second := startConsole(t, env)
	if want := "outbox " + d.Schema + ".outbox: " + url + "o/" + d.Schema + "/outbox/"; second != want {
		t.Errorf("second line %q, want %q", second, want)
	}
	code, body := get(t, url, "", "")
	if code != http.StatusOK || !strings.Contains(body, `data-outbox="`+d.Schema+`.outbox"`) {
		t.Errorf("GET / = %d; body lists the outbox: %v", code, strings.Contains(body, d.Schema))
	}
	if !strings.Contains(body, "read-only") {
		t.Error("the console without -actions does not say it is read-only")
	}
}

func TestConsoleAsksForItsPassword(t *testing.T) {
	t.Parallel()
	_, _, env, _ := migrated(t)
	env["OUTBOXGEN_CONSOLE_PASSWORD"] = "s3cret"
	url, _ := startConsole(t, env, "-user", "ops")
	var got []int
	for _, c := range [][2]string{{"", ""}, {"ops", "wrong"}, {"other", "s3cret"}, {"ops", "s3cret"}} {
		code, _ := get(t, url, c[0], c[1])
		got = append(got, code)
	}
	if diff := cmp.Diff([]int{401, 401, 401, 200}, got); diff != "" {
		t.Errorf("status without, with wrong and with right credentials (-want +got):\n%s", diff)
	}
}

func TestConsoleUsageErrors(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none"}
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"every interface without a password", env, []string{"-listen", ":8080"}, "reachable from other machines"},
		{"another host without a password", env, []string{"-listen", "10.0.0.1:8080"}, "pass -user"},
		{"user without password", env, []string{"-user", "ops"}, "OUTBOXGEN_CONSOLE_PASSWORD"},
		{"password without user", map[string]string{"OUTBOXGEN_CONSOLE_PASSWORD": "x"}, nil, "pass -user too"},
		{"bad address", env, []string{"-listen", "nowhere"}, `-listen "nowhere"`},
		{"argument", env, []string{"extra"}, "console"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runCLI(t, c.env, append([]string{"console"}, c.args...)...)
			if r.code != 2 || !strings.Contains(r.stderr, c.want) {
				t.Errorf("exit %d, stderr %q; want 2 and %q", r.code, r.stderr, c.want)
			}
		})
	}
}

// getHost reads url with host as the request's Host, and a login when
// user is set.
func getHost(t *testing.T, url, host, user, password string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// Without -user the console answers loopback names and those -allow-host
// adds; with -user any name, unless -allow-host narrows it.
func TestConsoleAnswersOnlyTheHostsItIsTold(t *testing.T) {
	t.Parallel()
	_, _, env, _ := migrated(t)
	port := func(u string) string { return strings.TrimSuffix(u[strings.LastIndex(u, ":"):], "/") }
	for _, c := range []struct {
		name  string
		user  bool
		args  []string
		hosts map[string]int
	}{
		{"no login", false, nil, map[string]int{"localhost": 200, "127.0.0.1": 200, "rebind.test": 421, "console.example.com": 421}},
		{"no login, allowed names", false, []string{"-allow-host", "console.example.com,Other.Example.com", "-allow-host", "third.example.com"},
			map[string]int{"localhost": 200, "console.example.com": 200, "other.example.com": 200, "third.example.com": 200, "rebind.test": 421}},
		{"login", true, nil, map[string]int{"localhost": 200, "console.example.com": 200, "rebind.test": 200}},
		{"login, allowed names", true, []string{"-allow-host", "console.example.com"},
			map[string]int{"localhost": 200, "console.example.com": 200, "rebind.test": 421}},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := maps.Clone(env)
			user, password := "", ""
			if c.user {
				user, password = "ops", "s3cret"
				env["OUTBOXGEN_CONSOLE_PASSWORD"] = password
				c.args = append(c.args, "-user", user)
			}
			url, _ := startConsole(t, env, c.args...)
			got := map[string]int{}
			for host := range c.hosts {
				got[host] = getHost(t, url, host+port(url), user, password)
			}
			if diff := cmp.Diff(c.hosts, got); diff != "" {
				t.Errorf("status by Host (-want +got):\n%s", diff)
			}
		})
	}
	if r := runCLI(t, env, "console", "-listen", "127.0.0.1:0", "-allow-host", "https://console.example.com"); r.code != 2 ||
		!strings.Contains(r.stderr, `-allow-host "https://console.example.com"`) {
		t.Errorf("-allow-host with a URL: exit %d, stderr %q; want 2 and the flag named", r.code, r.stderr)
	}
}
