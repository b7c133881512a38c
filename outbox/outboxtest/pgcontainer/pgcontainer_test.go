package pgcontainer_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/outbox/outboxtest/pgcontainer"
)

// containerModules are the modules of testcontainers and the Docker
// client: none of them may be linked where pgcontainer is not imported.
var containerModules = []string{"github.com/testcontainers/", "github.com/docker/", "github.com/moby/", "github.com/containerd/"}

// Only what imports pgcontainer links testcontainers and the Docker
// client: not the outbox packages, not the demo (unless built with -tags
// container), not a service's test binary that uses outboxtest
// (examples/bindings, a module of its own as a service's is); a test
// binary that imports pgcontainer does.
func TestOnlyImportersLinkTestcontainers(t *testing.T) {
	t.Parallel()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the dependencies with")
	}
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		dir  string // relative to the repository's root
		args []string
		want bool
	}{
		{"the outbox packages", ".", []string{"./outbox", "./outbox/outboxtest"}, false},
		{"the demo", ".", []string{"./examples/orders"}, false},
		{"the demo built with -tags container", ".", []string{"-tags", "container", "./examples/orders"}, true},
		{"a service's test binary that uses outboxtest", "examples/bindings", []string{"-test", "./..."}, false},
		{"a test binary that imports pgcontainer", ".", []string{"-test", "./outbox/outboxtest/pgcontainer"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}"}, c.args...)
			cmd := exec.CommandContext(t.Context(), goCmd, args...)
			cmd.Dir = filepath.Join(root, c.dir)
			out, err := cmd.Output()
			if err != nil {
				var stderr []byte
				if ee, ok := err.(*exec.ExitError); ok {
					stderr = ee.Stderr
				}
				t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), c.dir, err, stderr)
			}
			var linked []string
			for _, m := range strings.Fields(string(out)) {
				if slices.ContainsFunc(containerModules, func(p string) bool { return strings.HasPrefix(m, p) }) && !slices.Contains(linked, m) {
					linked = append(linked, m)
				}
			}
			if got := len(linked) > 0; got != c.want {
				t.Errorf("go %s in %s: links testcontainers or Docker: %v, want %v (%v)", strings.Join(args, " "), c.dir, got, c.want, linked)
			}
		})
	}
}

// Start starts PostgreSQL in a container where Docker runs, and stop
// removes it; without Docker, its error says to start Docker.
func TestStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	url, stop, err := pgcontainer.Start(ctx)
	if err != nil {
		if !strings.Contains(err.Error(), "is Docker running?") {
			t.Fatalf("Start: %v; want an error asking whether Docker runs", err)
		}
		t.Skipf("no Docker here: %v", err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		stop()
		t.Fatalf("%s: %v", url, err)
	}
	err = conn.Ping(ctx)
	_ = conn.Close(context.Background())
	stop()
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	if _, err := pgx.Connect(ctx, url); err == nil {
		t.Errorf("%s still answers after stop", url)
	}
}
