package outboxgen

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// serialMark is what the doc comment of a test that does not call
// t.Parallel says, followed by why: most tests wait on the database, not
// the CPU, so a test left serial makes the whole package wait on it.
const serialMark = "Not parallel:"

// TestEveryTestRunsInParallelOrSaysWhyNot reads every test file of every
// module of the repository: each top-level test calls t.Parallel, or its
// doc comment says why it cannot (serialMark).
func TestEveryTestRunsInParallelOrSaysWhyNot(t *testing.T) {
	t.Parallel()
	var files int
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		files++
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || fn.Body == nil || !isTest(fn) {
				continue
			}
			if !callsParallel(fn.Body) && (fn.Doc == nil || !strings.Contains(fn.Doc.Text(), serialMark)) {
				t.Errorf("%s: %s neither calls t.Parallel nor says why not (%q in its doc comment)", path, fn.Name.Name, serialMark)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Errorf("read %d test files; the repository has more than 100", files)
	}
}

// isTest reports whether fn is a top-level test: TestXxx(t *testing.T),
// TestMain aside.
func isTest(fn *ast.FuncDecl) bool {
	name := fn.Name.Name
	if !strings.HasPrefix(name, "Test") || name == "TestMain" || fn.Type.Params.NumFields() != 1 {
		return false
	}
	star, ok := fn.Type.Params.List[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	sel, ok := star.X.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "T"
}

// callsParallel reports whether body calls a Parallel method (t.Parallel)
// outside the function literals it holds (its subtests).
func callsParallel(body *ast.BlockStmt) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.CallExpr:
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Parallel" && len(n.Args) == 0 {
				found = true
			}
		}
		return !found
	})
	return found
}
