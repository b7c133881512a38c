package main

import (
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/tools/go/packages"
)

// annotated is an annotated message type of another package of the module.
type annotated struct {
	pkgPath, name string
	pos           token.Position
}

// noNamesakes refuses bindings that record their type's name, by default,
// when another package of pkg's module annotates a type of the same name
// that records it too: outbox's default message type is the bare type
// name, so the two would be one message type, and a subscriber of either
// would decode the other's rows. type= on either one (or an
// OutboxMessageType method of its own) tells them apart. Packages the go
// command leaves out of the module's ./... (testdata, nested modules) are
// not looked at, and neither are other packages' annotations that do not
// parse: their own bind reports those.
func noNamesakes(pkg *packages.Package, bindings []binding) error {
	byName := map[string]binding{}
	for _, b := range bindings {
		if b.MessageType == "" && b.Recorded == b.Type {
			byName[b.Type] = b
		}
	}
	if len(byName) == 0 || pkg.Module == nil || pkg.Module.Dir == "" || pkg.Module.Path == "" {
		return nil
	}
	others, err := moduleAnnotated(pkg.Module.Dir, pkg.Module.Path, pkg.PkgPath, byName)
	if err != nil {
		return err
	}
	var errs []error
	for _, o := range others {
		b := byName[o.name]
		errs = append(errs, fmt.Errorf("%s: %s and %s.%s (%s) are both annotated //outbox:message without type=, so both record message type %q "+
			"and a subscriber of either decodes the other's rows: set type= on one of them (type=%s.%s, say), or on both",
			relPos(b.pos), b.Type, o.pkgPath, o.name, relPos(o.pos), b.Type, lastElem(pkg.PkgPath), b.Type))
	}
	if len(errs) > 0 {
		return fmt.Errorf("bind: %w", errors.Join(errs...))
	}
	return nil
}

// moduleAnnotated returns the types of the module at dir, of path
// modPath, outside the package self, that are named as in names, annotated
// //outbox:message without type=, and without an OutboxMessageType method
// of their own. It reads the module's non-test Go files whatever their
// build constraints, and skips what the go command's ./... skips:
// testdata, directories starting with "." or "_", and nested modules.
func moduleAnnotated(dir, modPath, self string, names map[string]binding) ([]annotated, error) {
	var out []annotated
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if path != dir {
			name := d.Name()
			if name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir
			}
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		pkgPath := modPath
		if rel != "." {
			pkgPath += "/" + filepath.ToSlash(rel)
		}
		if pkgPath == self {
			return nil
		}
		found, err := dirAnnotated(path, pkgPath, names)
		out = append(out, found...)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("bind: read the module in %s: %w", dir, err)
	}
	return out, nil
}

// dirAnnotated is moduleAnnotated for the package in dir, of path pkgPath.
// Files that do not parse are skipped: their own package's bind reports
// them.
func dirAnnotated(dir, pkgPath string, names map[string]binding) ([]annotated, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var (
		found []annotated
		files []*ast.File
	)
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		if !bytes.Contains(src, []byte("//outbox:")) && !bytes.Contains(src, []byte("OutboxMessageType")) {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), src, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			continue
		}
		files = append(files, f)
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, spec := range gd.Specs {
				ts := spec.(*ast.TypeSpec)
				if _, named := names[ts.Name.Name]; !named {
					continue
				}
				doc := ts.Doc
				if doc == nil && len(gd.Specs) == 1 {
					doc = gd.Doc
				}
				ann, at, ok, err := annotation(fset, doc)
				if c, _ := codecNamed(ann.codec); ok && err == nil && ann.messageType == "" && !c.proto { // proto codecs name by full name
					found = append(found, annotated{pkgPath: pkgPath, name: ts.Name.Name, pos: at})
				}
			}
		}
	}
	out := found[:0]
	for _, a := range found {
		if !ownTyperMethod(files, a.name) {
			out = append(out, a)
		}
	}
	return out, nil
}

// ownTyperMethod reports whether files declare an OutboxMessageType
// method on the type name (or a pointer to it) outside generated files,
// so the type chooses its message type itself.
func ownTyperMethod(files []*ast.File, name string) bool {
	for _, f := range files {
		if ast.IsGenerated(f) {
			continue
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || len(fd.Recv.List) != 1 || fd.Name.Name != "OutboxMessageType" {
				continue
			}
			recv := fd.Recv.List[0].Type
			if star, ok := recv.(*ast.StarExpr); ok {
				recv = star.X
			}
			if id, ok := recv.(*ast.Ident); ok && id.Name == name {
				return true
			}
		}
	}
	return false
}

// lastElem is the last element of an import path.
func lastElem(path string) string {
	return path[strings.LastIndexByte(path, '/')+1:]
}
