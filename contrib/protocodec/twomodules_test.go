package protocodec_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/outbox/outboxtest"
)

// Two services agree on a message by its .proto contract alone: shop
// (testdata/shop) and billing (testdata/billing) are modules of their own,
// each with its own code generated from the contract under its own Go
// package path and name (example.com/shop/gen/shopv1.OrderPlaced,
// example.com/billing/contracts/orderspb.OrderPlaced). Shop publishes,
// billing subscribes, each in a process of its own, and billing handles
// every order, named shop.v1.OrderPlaced.
func TestTwoServicesWithTheirOwnGeneratedCodeAgreeByTheContract(t *testing.T) {
	t.Parallel()
	f := outboxtest.New(t, outboxtest.Connect(t), nil)
	env := append(os.Environ(), "DATABASE_URL="+f.Pool.Config().ConnString(), "OUTBOX_SCHEMA="+f.Schema)
	bin := t.TempDir()
	build := func(module string) string {
		t.Helper()
		out := filepath.Join(bin, module)
		cmd := exec.CommandContext(t.Context(), "go", "build", "-o", out, ".")
		cmd.Dir = filepath.Join("testdata", module)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", module, err, b)
		}
		return out
	}
	shop, billing := build("shop"), build("billing")
	run := func(program string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), program, args...)
		cmd.Env = env
		out, err := cmd.Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("%s: %v\n%s%s", filepath.Base(program), err, out, stderr)
		}
		return string(out)
	}
	run(shop, "3")
	got := strings.Split(strings.TrimSpace(run(billing, "3")), "\n")
	want := []string{
		"ord_0 1000 EUR shop.v1.OrderPlaced",
		"ord_1 1001 EUR shop.v1.OrderPlaced",
		"ord_2 1002 EUR shop.v1.OrderPlaced",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("billing handled (-want +got):\n%s", diff)
	}
}
