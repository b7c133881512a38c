package outbox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// serviceMain is the program of a service module that publishes or
// consumes OrderPlaced messages, its own copy of the type imported from
// TYPEPKG. "publish QUEUE N" publishes N of them; "consume QUEUE" handles
// the queue's rows until none is left and prints each handled one.
const serviceMain = `package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/outboxgen/outboxgen/outbox"

	"TYPEPKG"
)

func main() {
	if err := run(context.Background(), os.Args[1], os.Args[2], os.Args[3:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(ctx context.Context, mode, queue string, args []string) error {
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	ob, err := outbox.New(pool, &outbox.Config{Schema: os.Getenv("OUTBOX_SCHEMA")})
	if err != nil {
		return err
	}
	switch mode {
	case "publish":
		n, err := strconv.Atoi(args[0])
		if err != nil {
			return err
		}
		pub, err := outbox.NewPublisher[TYPENAME.OrderPlaced](ob, queue, nil)
		if err != nil {
			return err
		}
		msgs := make([]TYPENAME.OrderPlaced, n)
		for i := range msgs {
			msgs[i] = TYPENAME.OrderPlaced{OrderID: fmt.Sprintf("o-%03d", i), Cents: int64(i)}
		}
		_, err = pub.PublishBatch(ctx, pool, msgs, nil)
		return err
	case "consume":
		var (
			mu   sync.Mutex
			seen []string
		)
		sub, err := outbox.NewSubscriber(ob, []string{queue}, func(_ context.Context, m *outbox.Message[TYPENAME.OrderPlaced]) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, fmt.Sprintf("%s %d %s", m.Payload.OrderID, m.Payload.Cents, m.MessageType()))
			return nil
		}, &outbox.SubscriberConfig[TYPENAME.OrderPlaced]{MinFetchInterval: 10 * time.Millisecond, MaxFetchInterval: 50 * time.Millisecond})
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- sub.Run(ctx) }()
		for {
			left, err := ob.Unprocessed(ctx, queue, 1)
			if err != nil {
				cancel()
				return errors.Join(err, <-done)
			}
			if len(left) == 0 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil {
			return fmt.Errorf("Run: %w", err)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, s := range seen {
			fmt.Println(s)
		}
		return nil
	}
	return fmt.Errorf("unknown mode %q", mode)
}
`

// service is a Go module of its own, built from serviceMain, whose
// OrderPlaced lives in a package of that module.
type service struct {
	bin string
	env []string
}

// buildService writes module modulePath into a temporary directory, with
// typeSrc as the source of its package typePkg (relative to the module),
// and builds it against this repository's outbox package.
func buildService(t *testing.T, goTool, root, modulePath, typePkg, typeSrc string, env []string) service {
	t.Helper()
	dir := t.TempDir()
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	importPath := modulePath + "/" + typePkg
	files := map[string]string{
		"go.mod": "module " + modulePath + "\n\ngo 1.26\n\nrequire github.com/outboxgen/outboxgen v0.0.0\n\n" +
			"replace github.com/outboxgen/outboxgen => " + root + "\n",
		"go.sum":                           string(sum),
		"main.go":                          strings.NewReplacer("TYPEPKG", importPath, "TYPENAME", filepath.Base(typePkg)).Replace(serviceMain),
		filepath.Join(typePkg, "types.go"): typeSrc,
	}
	for name, src := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "service")
	// Built with -race, as make test builds this test binary, the service
	// reuses the packages compiled for it from the build cache: only its
	// own two packages are compiled (a build in another mode compiles
	// the standard library, pgx and the outbox anew, minutes on a cold
	// cache), and its own races are reported too.
	build := exec.Command(goTool, "build", "-race", "-o", bin, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", modulePath, err, out)
	}
	return service{bin: bin, env: env}
}

// run runs the service with args and returns its standard output.
func (s service) run(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(s.bin, args...)
	cmd.Env = append(os.Environ(), s.env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(filepath.Dir(s.bin)), strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

func TestConsumerInAnotherModuleDecodesACopyOfTheType(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds two Go modules")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build the services with")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	e := setup(t)
	env := []string{"DATABASE_URL=" + e.db.URL, "OUTBOX_SCHEMA=" + e.db.Schema}
	// Two services, each with its own OrderPlaced of the same name and JSON
	// in a package of its own module.
	shop := buildService(t, goTool, root, "example.com/shop", "events", `package events

// OrderPlaced is published when an order is placed.
type OrderPlaced struct {
	OrderID string `+"`json:\"order_id\"`"+`
	Cents   int64  `+"`json:\"total_cents\"`"+`
}
`, env)
	shipping := buildService(t, goTool, root, "example.com/shipping", "internal/inbound", `package inbound

// OrderPlaced is the shipping service's copy of the shop's message.
type OrderPlaced struct {
	Cents   int64  `+"`json:\"total_cents\"`"+`
	OrderID string `+"`json:\"order_id\"`"+`
}
`, env)

	const n = 200
	want := make([]string, n)
	for i := range want {
		want[i] = fmt.Sprintf("o-%03d %d OrderPlaced", i, i)
	}
	for _, dir := range []struct {
		name     string
		from, to service
		queue    string
	}{
		{"shop to shipping", shop, shipping, "orders.placed"},
		{"shipping to shop", shipping, shop, "orders.placed.back"},
	} {
		dir.from.run(t, "publish", dir.queue, fmt.Sprint(n))
		got := strings.Split(strings.TrimSpace(dir.to.run(t, "consume", dir.queue)), "\n")
		slices.Sort(got)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: handled rows (-want +got):\n%s", dir.name, diff)
		}
	}
	var dead int
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT count(*) FROM outbox_dlq`).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if dead != 0 {
		t.Errorf("%d rows dead-lettered, want none", dead)
	}
}
