package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/format"
	"go/token"
	"go/types"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"text/template"

	"golang.org/x/tools/go/packages"

	"github.com/outboxgen/outboxgen/outbox"
)

const bindUsage = `Usage: outboxgen bind [-dir DIR] [-out FILE] [-asyncapi FILE] [-format yaml|json]

Reads the Go package in DIR and, for every type whose doc comment has a line
  //outbox:message queue=NAME [type=TYPENAME] [codec=NAME]
(its only line starting //outbox:) writes, next to it, one gofmt-clean file
with, per type, the queue's constant, a typed publisher constructor and two
subscriber constructors: New<T>Subscriber for an outbox.Handler, and
New<T>TxSubscriber for an outbox.TxHandler, which acknowledges each message
in the transaction it hands the handler. It writes too an AsyncAPI 3.0
document of the queues and their payloads' JSON Schemas (derived from the
types as encoding/json sees them). Nothing is written unless every
annotation is valid.

codec=NAME chooses the codec the constructors use when the config
passed to them sets none: json (outbox's default, encoding/json), gojson
(contrib/gojson: the same JSON, decoded several times faster), proto or
protojson (contrib/protocodec, for a generated Protocol Buffers message:
the constructors take *T, and the message type is the message's full
name, read from the generated file's descriptor). Annotate a generated
message in its .proto file, in the comment above the message, which
protoc-gen-go copies onto the Go type:
  // OrderPlaced is published when a customer places an order.
  //outbox:message queue=orders.placed codec=proto
  message OrderPlaced { ... }
and run bind in the generated package.

Publishers record the message type in the message-type header: by
default the type's name, which the document states as the header's value.
type=TYPENAME (printable ASCII, no spaces) names it instead: the file gets
a method
  func (T) OutboxMessageType() string { return "TYPENAME" }
and the document states TYPENAME. The type must not declare
OutboxMessageType itself; a type without type= that does leaves the
header out of the document.

The default makes types of one name one message type, whatever their
package: a subscriber of either decodes the other's rows. So bind refuses
a type without type= when another package of the module annotates a type
of the same name without type= (and without its own OutboxMessageType):
set type= on one of them.

Example, in the package that declares the messages:
  //go:generate go run github.com/outboxgen/outboxgen/cmd/outboxgen bind

Flags:
`

var annotationRE = regexp.MustCompile(`^//outbox:message(\s.*)?$`)

// binding is one annotated message type.
type binding struct {
	Type, Queue, ChannelID string
	// MessageType is the annotation's type=, "" when it has none.
	MessageType string
	// Recorded is the message type publishers record: type=, or the
	// default, the type's name; "" when the type's own
	// OutboxMessageType method decides.
	Recorded string
	// Param is the type parameter of its publishers and subscribers: the
	// type, or a pointer to it for a Protocol Buffers message.
	Param string
	// CodecExpr is the codec the constructors set when their config sets
	// none; "" for outbox's default.
	CodecExpr string
	codec     bindCodec
	// protoFile is the .proto file of a Protocol Buffers message, as its
	// descriptor names it.
	protoFile string
	pos       token.Position
}

func bindCmd(_ context.Context, args []string, stdout, stderr io.Writer, _ func(string) string) error {
	fs := newFlags("bind", bindUsage, stderr)
	dir := fs.String("dir", ".", "directory of the package to bind")
	out := fs.String("out", "outbox_bindings.go", "file to write the bindings to, in -dir")
	doc := fs.String("asyncapi", "", "file to write the AsyncAPI document to, in -dir (default asyncapi.yaml or asyncapi.json)")
	formatFlag := fs.String("format", "yaml", "AsyncAPI document format: yaml or json")
	pos, err := parseFlags(fs, args, "bind")
	if err != nil {
		return err
	}
	if err := noArgs(pos, "bind"); err != nil {
		return err
	}
	if *formatFlag != "yaml" && *formatFlag != "json" {
		return fmt.Errorf("%w: bind: -format %q: want yaml or json", errUsage, *formatFlag)
	}
	if *doc == "" {
		*doc = "asyncapi." + *formatFlag
	}
	if !strings.HasSuffix(*out, ".go") || strings.HasSuffix(*out, "_test.go") {
		return fmt.Errorf("%w: bind: -out %q: want a non-test .go file", errUsage, *out)
	}

	pkg, err := loadPackage(*dir)
	if err != nil {
		return err
	}
	bindings, err := findBindings(pkg, *out)
	if err != nil {
		return err
	}
	if len(bindings) == 0 {
		return fmt.Errorf("bind: no type in %s is annotated //outbox:message queue=NAME", pkg.PkgPath)
	}
	if err := noNamesakes(pkg, bindings); err != nil {
		return err
	}
	code, err := bindingsCode(pkg.Name, bindings)
	if err != nil {
		return err
	}
	document, err := asyncAPI(pkg, bindings, *formatFlag)
	if err != nil {
		return err
	}
	// Write both or neither.
	files := map[string][]byte{filepath.Join(*dir, *out): code, filepath.Join(*dir, *doc): document}
	tmps := map[string]string{}
	defer func() {
		for _, tmp := range tmps {
			_ = os.Remove(tmp)
		}
	}()
	for path, b := range files {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, b, 0o644); err != nil {
			return fmt.Errorf("bind: write %s: %w", path, err)
		}
		tmps[path] = tmp
	}
	for _, path := range slices.Sorted(func(yield func(string) bool) {
		for p := range files {
			if !yield(p) {
				return
			}
		}
	}) {
		if err := os.Rename(tmps[path], path); err != nil {
			return fmt.Errorf("bind: write %s: %w", path, err)
		}
		delete(tmps, path)
		fmt.Fprintf(stdout, "wrote %s\n", path)
	}
	return nil
}

// loadPackage parses and type-checks the package in dir. Type errors are
// tolerated: the package may use the very bindings this run writes, or a
// stale copy of them; only the annotated types must check.
func loadPackage(dir string) (*packages.Package, error) {
	cfg := &packages.Config{
		Mode: packages.NeedName | packages.NeedTypes | packages.NeedSyntax | packages.NeedTypesInfo | packages.NeedFiles | packages.NeedModule,
		Dir:  dir,
	}
	pkgs, err := packages.Load(cfg, ".")
	if err != nil {
		return nil, fmt.Errorf("bind: load %s: %w", dir, err)
	}
	if len(pkgs) != 1 {
		return nil, fmt.Errorf("bind: %s holds %d packages; want one", dir, len(pkgs))
	}
	pkg := pkgs[0]
	var msgs []string
	for _, e := range pkg.Errors {
		// Compile errors reach us as type errors, or as list errors
		// from the go command; only unparsable sources stop us.
		if e.Kind == packages.ParseError {
			msgs = append(msgs, e.Error())
		}
	}
	if len(msgs) > 0 || pkg.Types == nil || len(pkg.Syntax) == 0 {
		return nil, fmt.Errorf("bind: cannot read the package in %s:\n%s", dir, strings.Join(msgs, "\n"))
	}
	return pkg, nil
}

// findBindings collects the annotated types of pkg, validating each.
func findBindings(pkg *packages.Package, out string) ([]binding, error) {
	var (
		bs   []binding
		errs []error
	)
	byQueue := map[string]binding{}
	byChannel := map[string]binding{}
	for _, f := range pkg.Syntax {
		pos := pkg.Fset.Position(f.Package)
		if filepath.Base(pos.Filename) == out {
			continue
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, spec := range gd.Specs {
				ts := spec.(*ast.TypeSpec)
				doc := ts.Doc
				if doc == nil && len(gd.Specs) == 1 {
					doc = gd.Doc
				}
				ann, at, found, err := annotation(pkg.Fset, doc)
				if !found {
					continue
				}
				where := relPos(at)
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %s: %w", where, ts.Name.Name, err))
					continue
				}
				obj := pkg.Types.Scope().Lookup(ts.Name.Name)
				if ts.Assign.IsValid() {
					errs = append(errs, fmt.Errorf("%s: %s is an alias; annotate the type it stands for", where, ts.Name.Name))
					continue
				}
				if _, isStruct := obj.Type().Underlying().(*types.Struct); !isStruct {
					errs = append(errs, fmt.Errorf("%s: %s is not a struct; only structs can be outbox messages", where, ts.Name.Name))
					continue
				}
				if ts.TypeParams != nil {
					errs = append(errs, fmt.Errorf("%s: %s is generic; messages must be concrete types", where, ts.Name.Name))
					continue
				}
				codec, _ := codecNamed(ann.codec) // parseAnnotation checked it
				recorded, param, file := ann.messageType, ts.Name.Name, ""
				ownTyper := noOwnTyper(pkg, obj, out)
				switch isProto := isProtoMessage(obj.Type()); {
				case codec.proto && !isProto:
					errs = append(errs, fmt.Errorf("%s: %s is not a generated Protocol Buffers message; codec=%s binds those", where, ts.Name.Name, codec.name))
					continue
				case codec.proto:
					full, protoFile, err := protoFullName(pkg, f, ts.Name.Name)
					if err != nil {
						errs = append(errs, fmt.Errorf("%s: %s: %w", where, ts.Name.Name, err))
						continue
					}
					recorded, param, file = full, "*"+ts.Name.Name, protoFile
				case isProto:
					errs = append(errs, fmt.Errorf("%s: %s is a generated Protocol Buffers message; bind it with codec=proto or codec=protojson", where, ts.Name.Name))
					continue
				case ann.messageType != "" && ownTyper != nil:
					errs = append(errs, fmt.Errorf("%s: %s: %w", where, ts.Name.Name, ownTyper))
					continue
				case ann.messageType == "" && ownTyper == nil:
					recorded = ts.Name.Name // outbox's default for a non-generic type
				}
				queue := ann.queue
				b := binding{Type: ts.Name.Name, Queue: queue, ChannelID: channelID(queue), MessageType: ann.messageType, Recorded: recorded,
					Param: param, codec: codec, protoFile: file, pos: at}
				if codec.expr != nil {
					b.CodecExpr = codec.expr(param)
				}
				if prev, dup := byQueue[queue]; dup {
					errs = append(errs, fmt.Errorf("%s: %s and %s (%s) are both bound to queue %q", where, b.Type, prev.Type, relPos(prev.pos), queue))
					continue
				}
				if prev, dup := byChannel[b.ChannelID]; dup {
					errs = append(errs, fmt.Errorf("%s: queues %q and %q (%s) map to the same AsyncAPI channel id %q", where, queue, prev.Queue, relPos(prev.pos), b.ChannelID))
					continue
				}
				byQueue[queue], byChannel[b.ChannelID] = b, b
				bs = append(bs, b)
			}
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("bind: %w", errors.Join(errs...))
	}
	slices.SortFunc(bs, func(a, b binding) int { return strings.Compare(a.Type, b.Type) })
	return bs, nil
}

// annotationArgs are the key=value pairs of an //outbox:message line.
type annotationArgs struct {
	// codec is codec='s value, "json" when there is none.
	queue, messageType, codec string
}

const annotationForm = "//outbox:message queue=NAME [type=TYPENAME] [codec=json|gojson|proto|protojson]"

// annotation finds //outbox:message in doc and returns its arguments. Any
// other line starting //outbox: (a misspelt //outbox:messages, say), or a
// second annotation, is an error rather than a line bind ignores.
func annotation(fset *token.FileSet, doc *ast.CommentGroup) (args annotationArgs, at token.Position, found bool, err error) {
	if doc == nil {
		return args, at, false, nil
	}
	for _, c := range doc.List {
		if !strings.HasPrefix(c.Text, "//outbox:") {
			continue
		}
		if found {
			return args, fset.Position(c.Slash), true, fmt.Errorf("annotation %q: a type has one //outbox: line", c.Text)
		}
		found, at = true, fset.Position(c.Slash)
		m := annotationRE.FindStringSubmatch(c.Text)
		if m == nil {
			return args, at, true, fmt.Errorf("annotation %q: want %s", c.Text, annotationForm)
		}
		if args, err = parseAnnotation(m[1]); err != nil {
			return args, at, true, fmt.Errorf("annotation %q: %w", c.Text, err)
		}
		if err := outbox.ValidateQueue(args.queue); err != nil {
			return args, at, true, err
		}
	}
	return args, at, found, nil
}

// parseAnnotation parses the key=value pairs after //outbox:message, in any
// order: queue= is required, type= optional.
func parseAnnotation(text string) (annotationArgs, error) {
	var args annotationArgs
	seen := map[string]bool{}
	for _, field := range strings.Fields(text) {
		k, v, ok := strings.Cut(field, "=")
		if !ok {
			return args, fmt.Errorf("%q is not key=value; want %s", field, annotationForm)
		}
		switch k {
		case "queue", "type", "codec":
		default:
			return args, fmt.Errorf("unknown key %q; want %s", k, annotationForm)
		}
		if seen[k] {
			return args, fmt.Errorf("duplicate key %q; want %s", k, annotationForm)
		}
		seen[k] = true
		switch k {
		case "queue":
			if v == "" {
				return args, fmt.Errorf("empty queue; want %s", annotationForm)
			}
			args.queue = v
		case "type":
			if err := validMessageType(v); err != nil {
				return args, err
			}
			args.messageType = v
		case "codec":
			if _, err := codecNamed(v); err != nil {
				return args, err
			}
			args.codec = v
		}
	}
	if args.codec == "" {
		args.codec = bindCodecs[0].name
	}
	if c, _ := codecNamed(args.codec); c.proto && args.messageType != "" {
		return args, fmt.Errorf("type= with codec=%s: the codec names the message by its full Protocol Buffers name", args.codec)
	}
	if args.queue == "" {
		return args, fmt.Errorf("no queue; want %s", annotationForm)
	}
	return args, nil
}

// messageTypeMaxBytes is the longest name outbox accepts from
// OutboxMessageType.
const messageTypeMaxBytes = 1024

// validMessageType accepts a type= value: printable ASCII without spaces,
// which outbox accepts from OutboxMessageType and which needs no quoting
// in the annotation.
func validMessageType(name string) error {
	if name == "" {
		return fmt.Errorf("empty type; want type=TYPENAME or no type=")
	}
	if len(name) > messageTypeMaxBytes {
		return fmt.Errorf("type is %d bytes; at most %d", len(name), messageTypeMaxBytes)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("type %q: want printable ASCII without spaces", name)
		}
	}
	return nil
}

// noOwnTyper fails when the type of obj already has a field or method
// OutboxMessageType (its own, or promoted from an embedded field) outside
// the bindings file out, which a generated one would clash with or
// silently shadow.
func noOwnTyper(pkg *packages.Package, obj types.Object, out string) error {
	found, _, _ := types.LookupFieldOrMethod(obj.Type(), true, pkg.Types, "OutboxMessageType")
	if found == nil {
		return nil
	}
	pos := pkg.Fset.Position(found.Pos())
	if pos.IsValid() && filepath.Base(pos.Filename) == out && found.Pkg() == pkg.Types {
		return nil // generated by an earlier run
	}
	what := "method"
	if _, isVar := found.(*types.Var); isVar {
		what = "field"
	}
	where := ""
	if pos.IsValid() {
		where = " (" + relPos(pos) + ")"
	}
	return fmt.Errorf("type= would generate method OutboxMessageType, but %s already has %s OutboxMessageType%s: drop type= or the %s", obj.Name(), what, where, what)
}

// relPos is file:line relative to the working directory when it can be.
func relPos(p token.Position) string {
	name := p.Filename
	if wd, err := os.Getwd(); err == nil {
		if rel, err := filepath.Rel(wd, name); err == nil && !strings.HasPrefix(rel, "..") {
			name = rel
		}
	}
	return fmt.Sprintf("%s:%d", name, p.Line)
}

// channelID turns a queue name into an AsyncAPI channel id.
func channelID(queue string) string {
	return strings.Map(func(r rune) rune {
		if r == '_' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, queue)
}

var bindingsTmpl = template.Must(template.New("bindings").Parse(`// Code generated by outboxgen bind. DO NOT EDIT.

package {{.Package}}

{{if eq (len .Imports) 1}}import {{printf "%q" (index .Imports 0)}}
{{else}}import (
{{- range .Imports}}
	{{printf "%q" .}}
{{- end}}
)
{{end}}{{range .Bindings}}
// Queue{{.Type}} is the queue of {{.Type}} messages.
const Queue{{.Type}} = {{printf "%q" .Queue}}
{{if .CodecExpr}}
// New{{.Type}}Publisher returns a publisher of {{.Type}} messages to Queue{{.Type}}, with {{.CodecExpr}} unless cfg sets a codec.
func New{{.Type}}Publisher(ob *outbox.Outbox, cfg *outbox.PublisherConfig[{{.Param}}]) (*outbox.Publisher[{{.Param}}], error) {
	c := outbox.PublisherConfig[{{.Param}}]{}
	if cfg != nil {
		c = *cfg
	}
	if c.Codec == nil {
		c.Codec = {{.CodecExpr}}
	}
	return outbox.NewPublisher(ob, Queue{{.Type}}, &c)
}

// New{{.Type}}Subscriber returns a subscriber that hands the {{.Type}} messages of Queue{{.Type}} to h, with {{.CodecExpr}} unless cfg sets a codec.
func New{{.Type}}Subscriber(ob *outbox.Outbox, h outbox.Handler[{{.Param}}], cfg *outbox.SubscriberConfig[{{.Param}}]) (*outbox.Subscriber[{{.Param}}], error) {
	return outbox.NewSubscriber(ob, []string{Queue{{.Type}}}, h, {{.Type}}SubscriberConfig(cfg))
}

// New{{.Type}}TxSubscriber returns a subscriber that hands the {{.Type}} messages of Queue{{.Type}} to h, each in a transaction that acknowledges it (see outbox.NewTxSubscriber), with {{.CodecExpr}} unless cfg sets a codec.
func New{{.Type}}TxSubscriber(ob *outbox.Outbox, h outbox.TxHandler[{{.Param}}], cfg *outbox.SubscriberConfig[{{.Param}}]) (*outbox.Subscriber[{{.Param}}], error) {
	return outbox.NewTxSubscriber(ob, []string{Queue{{.Type}}}, h, {{.Type}}SubscriberConfig(cfg))
}

// {{.Type}}SubscriberConfig is cfg (nil: the defaults) with {{.CodecExpr}} unless it sets a codec.
func {{.Type}}SubscriberConfig(cfg *outbox.SubscriberConfig[{{.Param}}]) *outbox.SubscriberConfig[{{.Param}}] {
	c := outbox.SubscriberConfig[{{.Param}}]{}
	if cfg != nil {
		c = *cfg
	}
	if c.Codec == nil {
		c.Codec = {{.CodecExpr}}
	}
	return &c
}
{{- else}}
// New{{.Type}}Publisher returns a publisher of {{.Type}} messages to Queue{{.Type}}.
func New{{.Type}}Publisher(ob *outbox.Outbox, cfg *outbox.PublisherConfig[{{.Param}}]) (*outbox.Publisher[{{.Param}}], error) {
	return outbox.NewPublisher(ob, Queue{{.Type}}, cfg)
}

// New{{.Type}}Subscriber returns a subscriber that hands the {{.Type}} messages of Queue{{.Type}} to h.
func New{{.Type}}Subscriber(ob *outbox.Outbox, h outbox.Handler[{{.Param}}], cfg *outbox.SubscriberConfig[{{.Param}}]) (*outbox.Subscriber[{{.Param}}], error) {
	return outbox.NewSubscriber(ob, []string{Queue{{.Type}}}, h, cfg)
}

// New{{.Type}}TxSubscriber returns a subscriber that hands the {{.Type}} messages of Queue{{.Type}} to h, each in a transaction that acknowledges it (see outbox.NewTxSubscriber).
func New{{.Type}}TxSubscriber(ob *outbox.Outbox, h outbox.TxHandler[{{.Param}}], cfg *outbox.SubscriberConfig[{{.Param}}]) (*outbox.Subscriber[{{.Param}}], error) {
	return outbox.NewTxSubscriber(ob, []string{Queue{{.Type}}}, h, cfg)
}
{{- end}}
{{- if .MessageType}}

// OutboxMessageType names {{.Type}} in the message-type header (see outbox.MessageTyper).
func ({{.Type}}) OutboxMessageType() string { return {{printf "%q" .MessageType}} }
{{- end}}
{{end}}`))

func bindingsCode(pkgName string, bs []binding) ([]byte, error) {
	var buf bytes.Buffer
	imports := []string{"github.com/outboxgen/outboxgen/outbox"}
	for _, b := range bs {
		if p := b.codec.importPath; p != "" && !slices.Contains(imports, p) {
			imports = append(imports, p)
		}
	}
	slices.Sort(imports)
	if err := bindingsTmpl.Execute(&buf, struct {
		Package  string
		Imports  []string
		Bindings []binding
	}{pkgName, imports, bs}); err != nil {
		return nil, fmt.Errorf("bind: %w", err)
	}
	src, err := format.Source(buf.Bytes())
	if err != nil {
		return nil, fmt.Errorf("bind: format bindings: %w", err)
	}
	return src, nil
}

// asyncAPI writes the AsyncAPI 3.0 document of bs.
func asyncAPI(pkg *packages.Package, bs []binding, formatName string) ([]byte, error) {
	s := newSchemas()
	channels, operations, messages := obj(), obj(), obj()
	named := make([]*types.Named, len(bs))
	for i, b := range bs {
		t, ok := pkg.Types.Scope().Lookup(b.Type).Type().(*types.Named)
		if !ok {
			return nil, fmt.Errorf("bind: %s: %s is not a defined type", relPos(b.pos), b.Type)
		}
		if b.codec.proto { // its payload is its .proto's, not a JSON Schema
			continue
		}
		// The message types keep their own names under
		// components/schemas, whatever other packages' types they use.
		s.name(t)
		named[i] = t
	}
	for i, b := range bs {
		var payload any
		if b.codec.proto {
			payload = protoPayload(b, filepath.Dir(b.pos.Filename))
		} else {
			ref, err := s.schema(named[i])
			if err != nil {
				return nil, fmt.Errorf("bind: %s: %s: %w", relPos(b.pos), b.Type, err)
			}
			payload = ref
		}
		msg := obj().
			set("name", b.Type).
			set("contentType", b.codec.contentType)
		if b.Recorded != "" {
			msg.set("headers", obj().
				set("type", "object").
				set("properties", obj().set(outbox.HeaderMessageType, obj().
					set("type", "string").
					set("const", b.Recorded))).
				set("required", []string{outbox.HeaderMessageType}))
		}
		messages.set(b.Type, msg.set("payload", payload))
		channels.set(b.ChannelID, obj().
			set("address", b.Queue).
			set("messages", obj().set(b.Type, obj().set("$ref", "#/components/messages/"+b.Type))))
		chRef := obj().set("$ref", "#/channels/"+b.ChannelID)
		msgRef := []any{obj().set("$ref", "#/channels/"+b.ChannelID+"/messages/"+b.Type)}
		operations.set("publish"+b.Type, obj().set("action", "send").set("channel", chRef).set("messages", msgRef))
		operations.set("consume"+b.Type, obj().set("action", "receive").set("channel", chRef).set("messages", msgRef))
	}
	doc := obj().
		set("asyncapi", "3.0.0").
		set("info", obj().
			set("title", pkg.PkgPath).
			set("version", "1.0.0").
			set("description", "Transactional outbox queues of package "+pkg.Name+", generated by outboxgen bind.")).
		set("channels", channels).
		set("operations", operations).
		set("components", obj().set("messages", messages).set("schemas", s.defs))
	var b strings.Builder
	if formatName == "json" {
		writeJSON(&b, doc, "")
		b.WriteString("\n")
	} else {
		b.WriteString("# Code generated by outboxgen bind. DO NOT EDIT.\n")
		writeYAML(&b, doc, "")
	}
	return []byte(b.String()), nil
}
