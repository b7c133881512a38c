// Command filegraph measures how the files of a Go package refer to each
// other: an edge A→B is a file A that uses a package-level identifier (a
// type, func, var or const, or a method of a package-level type) declared
// in another file B of the package. Struct fields are not counted.
//
// Only the non-test files the build context selects are read; the package
// is type-checked with go/types, its imports read from source. It prints
// the files, their total lines, the distinct edges and how many of those
// lie inside a strongly connected component of two or more files: the
// edges that run back up, since with no cycle every reference could point
// down a single order of the files.
//
//	cd bench && go run ./cmd/filegraph -dir ../outbox
//
// With -pkgs it does the same for each package of a comma-separated list
// of directories and also lists the imports between them.
//
//	go run ./cmd/filegraph -pkgs ../outbox,../db,../outbox/outboxtest
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/build"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

func main() {
	var (
		dir, pkgs string
		verbose   bool
	)
	flag.StringVar(&dir, "dir", "../outbox", "package directory to measure")
	flag.StringVar(&pkgs, "pkgs", "", "comma-separated package directories: measure each and the imports between them (overrides -dir)")
	flag.BoolVar(&verbose, "v", false, "also list every edge, marking those inside a cycle")
	flag.Parse()
	dirs := []string{dir}
	if pkgs != "" {
		dirs = nil
		for _, d := range strings.Split(pkgs, ",") {
			if d = strings.TrimSpace(d); d != "" {
				dirs = append(dirs, d)
			}
		}
	}
	if err := run(os.Stdout, dirs, pkgs != "", verbose); err != nil {
		fmt.Fprintln(os.Stderr, "filegraph:", err)
		os.Exit(1)
	}
}

// graph is one package's file-level reference graph.
type graph struct {
	dir, path string
	files     []string // base names, sorted
	lines     int
	edges     map[[2]string]bool
	imports   []string // import paths of the package
	sccs      [][]string
}

func run(w io.Writer, dirs []string, multi, verbose bool) error {
	if len(dirs) == 0 {
		return errors.New("no package directories")
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "source", nil) // one importer, so packages are checked once
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	defer os.Chdir(wd)
	abss := make([]string, len(dirs))
	for i, d := range dirs {
		if abss[i], err = filepath.Abs(d); err != nil {
			return err
		}
	}
	var gs []*graph
	for i, d := range dirs {
		abs := abss[i]
		// The source importer asks the go command, in the working
		// directory, where an import lies: work in the package's own
		// module, so it resolves the package's dependencies.
		if err := os.Chdir(abs); err != nil {
			return err
		}
		g, err := load(fset, imp, d, abs)
		if err != nil {
			return fmt.Errorf("%s: %w", d, err)
		}
		gs = append(gs, g)
	}
	if !multi {
		printOne(w, gs[0])
	} else {
		printMany(w, gs)
	}
	if verbose {
		for _, g := range gs {
			printEdges(w, g)
		}
	}
	return nil
}

// printEdges lists g's edges, those inside a cycle marked with *.
func printEdges(w io.Writer, g *graph) {
	comp := map[string]int{}
	for i, c := range g.sccs {
		for _, f := range c {
			comp[f] = i
		}
	}
	var es [][2]string
	for e := range g.edges {
		es = append(es, e)
	}
	slices.SortFunc(es, func(a, b [2]string) int { return strings.Compare(a[0]+"\x00"+a[1], b[0]+"\x00"+b[1]) })
	fmt.Fprintf(w, "\nEdges of %s (* inside a cycle):\n\n", g.path)
	for _, e := range es {
		mark := ""
		if comp[e[0]] == comp[e[1]] {
			mark = " *"
		}
		fmt.Fprintf(w, "- %s → %s%s\n", e[0], e[1], mark)
	}
}

// importPath asks the go command for the import path of the package in dir.
func importPath(dir string) string {
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}}", ".")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return filepath.Base(dir)
	}
	return strings.TrimSpace(string(out))
}

func load(fset *token.FileSet, imp types.Importer, dir, abs string) (*graph, error) {
	bp, err := build.ImportDir(abs, 0)
	if err != nil {
		return nil, err
	}
	if len(bp.CgoFiles) > 0 {
		return nil, errors.New("cgo files are not supported")
	}
	g := &graph{dir: dir, path: importPath(abs), edges: map[[2]string]bool{}}
	var files []*ast.File
	for _, name := range bp.GoFiles {
		src, err := os.ReadFile(filepath.Join(abs, name))
		if err != nil {
			return nil, err
		}
		g.lines += bytes.Count(src, []byte("\n"))
		if len(src) > 0 && src[len(src)-1] != '\n' {
			g.lines++
		}
		f, err := parser.ParseFile(fset, filepath.Join(abs, name), src, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
		g.files = append(g.files, name)
	}
	slices.Sort(g.files)
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: imp}
	pkg, err := conf.Check(g.path, fset, files, info)
	if err != nil {
		return nil, err
	}
	for _, p := range pkg.Imports() {
		g.imports = append(g.imports, p.Path())
	}
	slices.Sort(g.imports)
	for id, obj := range info.Uses {
		if !packageLevel(pkg, obj) {
			continue
		}
		from := filepath.Base(fset.Position(id.Pos()).Filename)
		to := filepath.Base(fset.Position(obj.Pos()).Filename)
		if from != to {
			g.edges[[2]string{from, to}] = true
		}
	}
	g.sccs = components(g.files, g.edges)
	return g, nil
}

// packageLevel reports whether obj is declared at pkg's top level, or is a
// method of a type declared there (a method of a named interface has that
// interface as its receiver; one of an interface literal is not counted).
func packageLevel(pkg *types.Package, obj types.Object) bool {
	if obj == nil || obj.Pkg() != pkg || !obj.Pos().IsValid() {
		return false
	}
	if obj.Parent() == pkg.Scope() {
		return true
	}
	fn, ok := obj.(*types.Func)
	if !ok {
		return false
	}
	recv := fn.Signature().Recv()
	if recv == nil {
		return false
	}
	t := recv.Type()
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	switch t := t.(type) {
	case *types.Named:
		return t.Obj().Parent() == pkg.Scope()
	case *types.Alias:
		return t.Obj().Parent() == pkg.Scope()
	}
	return false
}

// components returns the strongly connected components of the graph
// (Tarjan's algorithm), each sorted, largest first.
func components(nodes []string, edges map[[2]string]bool) [][]string {
	adj := map[string][]string{}
	for e := range edges {
		adj[e[0]] = append(adj[e[0]], e[1])
	}
	for _, v := range adj {
		slices.Sort(v)
	}
	var (
		index   = map[string]int{}
		low     = map[string]int{}
		onStack = map[string]bool{}
		stack   []string
		next    int
		out     [][]string
		visit   func(v string)
	)
	visit = func(v string) {
		index[v], low[v] = next, next
		next++
		stack = append(stack, v)
		onStack[v] = true
		for _, u := range adj[v] {
			if _, seen := index[u]; !seen {
				visit(u)
				low[v] = min(low[v], low[u])
			} else if onStack[u] {
				low[v] = min(low[v], index[u])
			}
		}
		if low[v] == index[v] {
			var c []string
			for {
				u := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				onStack[u] = false
				c = append(c, u)
				if u == v {
					break
				}
			}
			slices.Sort(c)
			out = append(out, c)
		}
	}
	for _, v := range nodes {
		if _, seen := index[v]; !seen {
			visit(v)
		}
	}
	slices.SortStableFunc(out, func(a, b []string) int { return len(b) - len(a) })
	return out
}

// cyclic counts the edges whose two ends share a component of two or more
// files, and the files in such components.
func (g *graph) cyclic() (edges, files int) {
	comp := map[string]int{}
	for i, c := range g.sccs {
		if len(c) >= 2 {
			files += len(c)
			for _, f := range c {
				comp[f] = i + 1
			}
		}
	}
	for e := range g.edges {
		if c := comp[e[0]]; c != 0 && c == comp[e[1]] {
			edges++
		}
	}
	return edges, files
}

func printOne(w io.Writer, g *graph) {
	ce, cf := g.cyclic()
	fmt.Fprintf(w, "# filegraph: %s\n\n", g.path)
	fmt.Fprintf(w, "%s, non-test files only; A→B when file A uses a package-level type, func, var or const, or a method, declared in file B.\n\n", g.dir)
	fmt.Fprintln(w, "| files | lines | edges (file pairs) | edges inside a cycle | files in a cycle | cycles (SCCs ≥ 2) | largest |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|")
	fmt.Fprintf(w, "| %d | %d | %d | %d (%.0f %%) | %d | %d | %d |\n", len(g.files), g.lines, len(g.edges), ce,
		pct(ce, len(g.edges)), cf, bigSCCs(g), largest(g))
	for i, c := range g.sccs {
		if len(c) < 2 {
			break
		}
		fmt.Fprintf(w, "\nCycle %d (%d files): %s\n", i+1, len(c), strings.Join(c, ", "))
	}
	var acyclic []string
	for _, c := range g.sccs {
		if len(c) == 1 {
			acyclic = append(acyclic, c[0])
		}
	}
	slices.Sort(acyclic)
	fmt.Fprintf(w, "\nOutside any cycle (%d): %s\n", len(acyclic), strings.Join(acyclic, ", "))
}

func printMany(w io.Writer, gs []*graph) {
	fmt.Fprintln(w, "# filegraph: packages")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Non-test files only; A→B when file A uses a package-level type, func, var or const, or a method, declared in file B.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| package | files | lines | edges | edges inside a cycle | files in a cycle | largest cycle |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
	var files, lines, edges, cedges int
	for _, g := range gs {
		ce, cf := g.cyclic()
		files, lines, edges, cedges = files+len(g.files), lines+g.lines, edges+len(g.edges), cedges+ce
		fmt.Fprintf(w, "| %s | %d | %d | %d | %d (%.0f %%) | %d | %d |\n", g.path, len(g.files), g.lines, len(g.edges), ce,
			pct(ce, len(g.edges)), cf, largest(g))
	}
	fmt.Fprintf(w, "| **total** | %d | %d | %d | %d (%.0f %%) | | |\n", files, lines, edges, cedges, pct(cedges, edges))
	listed := map[string]bool{}
	for _, g := range gs {
		listed[g.path] = true
	}
	fmt.Fprintln(w, "\nImports between them:")
	fmt.Fprintln(w)
	n := 0
	for _, g := range gs {
		for _, p := range g.imports {
			if listed[p] {
				fmt.Fprintf(w, "- %s → %s\n", g.path, p)
				n++
			}
		}
	}
	if n == 0 {
		fmt.Fprintln(w, "- none")
	}
}

func bigSCCs(g *graph) int {
	n := 0
	for _, c := range g.sccs {
		if len(c) >= 2 {
			n++
		}
	}
	return n
}

func largest(g *graph) int {
	if len(g.sccs) == 0 || len(g.sccs[0]) < 2 {
		return 0
	}
	return len(g.sccs[0])
}

func pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}
