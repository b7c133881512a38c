package outboxgen

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestExamplesImportNoInternalPackage keeps what users copy free of this
// repository's internal packages: every file with a package example
// (func Example...), in every module of the repository, and the quick
// start the README quotes.
func TestExamplesImportNoInternalPackage(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("git", "ls-files", "*_test.go", "examples/quickstart/*.go").Output()
	if err != nil {
		t.Skipf("git ls-files: %v", err)
	}
	checked := 0
	for _, path := range strings.Fields(string(out)) {
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(path, "examples/quickstart/") && !hasExample(f.Decls) {
			continue
		}
		checked++
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.Contains("/"+p+"/", "/internal/") {
				t.Errorf("%s imports %s: users copy examples, and cannot import it", path, p)
			}
		}
	}
	if checked < 5 {
		t.Errorf("checked %d files with examples, want the package examples of outbox, outboxtest and contrib", checked)
	}
}

// hasExample reports whether decls declare a package example.
func hasExample(decls []ast.Decl) bool {
	for _, d := range decls {
		if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Example") {
			return true
		}
	}
	return false
}
