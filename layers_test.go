package outboxgen

import (
	"os/exec"
	"strings"
	"testing"
)

// layers are the module's packages that deliver messages, lowest first:
// a package may import the module's packages of lower layers only, so
// the engine never reaches up into the public API, and no package below
// it into the engine. docs/architecture.md draws them.
var layers = [][]string{
	{"db"},
	{"internal/dbx", "internal/crew", "internal/naming", "internal/msgtype"},
	{"internal/wakeup", "internal/lease", "internal/ring"},
	{"internal/claim"},
	{"internal/engine"},
	{"outbox"},
	{"console"},
}

// TestPackagesImportOnlyBelowThem holds the packages of layers to their
// order.
func TestPackagesImportOnlyBelowThem(t *testing.T) {
	t.Parallel()
	const module = "github.com/outboxgen/outboxgen/"
	layer := map[string]int{}
	var pkgs []string
	for i, l := range layers {
		for _, p := range l {
			layer[p] = i
			pkgs = append(pkgs, "./"+p)
		}
	}
	out, err := exec.Command("go", append([]string{"list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}"}, pkgs...)...).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	seen := 0
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		seen++
		for _, imp := range fields[1:] {
			dep, ok := strings.CutPrefix(imp, module)
			if !ok {
				continue
			}
			l, known := layer[dep]
			switch {
			case !known:
				t.Errorf("%s imports %s, which has no layer", pkg, dep)
			case l >= layer[pkg]:
				t.Errorf("%s (layer %d) imports %s (layer %d): a package imports only lower layers", pkg, layer[pkg], dep, l)
			}
		}
	}
	if seen != len(pkgs) {
		t.Errorf("go list listed %d packages, want %d", seen, len(pkgs))
	}
}
