package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/outbox"
)

// FuzzAnnotation feeds bind's annotation parser doc comments, one line per
// "\n" of the input. It never panics; a doc with no //outbox: line is no
// annotation; any other is an annotation or an error that quotes the
// offending line or names the queue; what it accepts round-trips, in
// either key order, and makes bindings that compile and hold the queue and
// message type unchanged.
func FuzzAnnotation(f *testing.F) {
	for _, s := range []string{
		"//outbox:message queue=orders.created",
		"//outbox:message type=payments.PaymentFailed/v1 queue=payments.failed",
		"// OrderCreated is published when an order is placed.\n//\n//outbox:message queue=orders",
		"//outbox:message", "//outbox:message ", "//outbox:message\tqueue=a", "//outbox:messagequeue=a",
		"//outbox:messages queue=a", "//outbox: message queue=a", "// outbox:message queue=a", "/*outbox:message queue=a*/",
		"//outbox:message queue=a\n//outbox:message queue=b", "//outbox:message queue=a\n//outbox:other",
		"//outbox:message queue=", "//outbox:message queue==", "//outbox:message queue=a=b", "//outbox:message queue=a queue=b",
		"//outbox:message type=t", "//outbox:message queue=a type=", "//outbox:message queue=a type=café",
		"//outbox:message queue=a type=a\x7fb", "//outbox:message queue=a version=2", "//outbox:message queue=a typed",
		"//outbox:message queue=é\u00a0x", "//outbox:message queue=\"quoted\\\"", "//outbox:message queue=\xff",
		"//outbox:message queue=" + strings.Repeat("q", 255), "//outbox:message queue=" + strings.Repeat("q", 256),
		"//outbox:message queue=a type=" + strings.Repeat("t", 1025), "//outbox:message queue=\u2028",
		"//outbox:message queue=orders codec=gojson", "//outbox:message codec=proto queue=orders", "//outbox:message queue=a codec=avro",
		"//outbox:message queue=a codec=protojson type=t", "//outbox:message queue=a codec=json codec=json",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		fset := token.NewFileSet()
		file := fset.AddFile("messages.go", -1, len(text)+1)
		doc := &ast.CommentGroup{}
		off := 0
		var directives []string
		for line := range strings.SplitSeq(text, "\n") {
			doc.List = append(doc.List, &ast.Comment{Slash: file.Pos(off), Text: line})
			off += len(line) + 1
			if strings.HasPrefix(line, "//outbox:") {
				directives = append(directives, line)
			}
		}
		args, at, found, err := annotation(fset, doc)
		switch {
		case len(directives) == 0:
			if found || err != nil {
				t.Fatalf("annotation(%q) = %+v, %v, %v; want none", text, args, found, err)
			}
			return
		case !found:
			t.Fatalf("annotation(%q) found nothing; want %q read", text, directives[0])
		case !at.IsValid() || at.Filename != "messages.go":
			t.Fatalf("annotation(%q) at %v", text, at)
		case err != nil:
			msg := err.Error()
			quoted := false
			for _, d := range directives {
				quoted = quoted || strings.Contains(msg, strconv.Quote(d))
			}
			if !quoted && !strings.Contains(msg, fmt.Sprintf("queue %q", args.queue)) {
				t.Fatalf("annotation(%q): error %q quotes no line and names no queue", text, msg)
			}
			return
		case len(directives) > 1:
			t.Fatalf("annotation(%q) accepted %d //outbox: lines", text, len(directives))
		}
		if err := outbox.ValidateQueue(args.queue); err != nil {
			t.Fatalf("annotation(%q) accepted queue %q: %v", text, args.queue, err)
		}
		if args.messageType != "" {
			if err := validMessageType(args.messageType); err != nil {
				t.Fatalf("annotation(%q) accepted type %q: %v", text, args.messageType, err)
			}
		}
		forms := []string{"//outbox:message queue=" + args.queue}
		if args.messageType != "" {
			forms = []string{
				"//outbox:message queue=" + args.queue + " type=" + args.messageType,
				"//outbox:message type=" + args.messageType + " queue=" + args.queue,
			}
		}
		if args.codec != "json" {
			for i := range forms {
				forms[i] += " codec=" + args.codec
			}
		}
		for _, form := range forms {
			again, _, _, err := annotation(fset, &ast.CommentGroup{List: []*ast.Comment{{Slash: file.Pos(0), Text: form}}})
			if err != nil {
				t.Fatalf("annotation(%q) = %+v, written back as %q: %v", text, args, form, err)
			}
			if diff := cmp.Diff(args, again, cmp.AllowUnexported(annotationArgs{})); diff != "" {
				t.Fatalf("annotation(%q) written back as %q reads differently (-first +second):\n%s", text, form, diff)
			}
		}
		checkBindingsCode(t, binding{Type: "Msg", Param: "Msg", Queue: args.queue, ChannelID: channelID(args.queue), MessageType: args.messageType})
	})
}

// checkBindingsCode generates the bindings of b and checks that they parse
// and spell b's queue and message type unchanged.
func checkBindingsCode(t *testing.T, b binding) {
	t.Helper()
	src, err := bindingsCode("p", []binding{b})
	if err != nil {
		t.Fatalf("bindings of %+v: %v", b, err)
	}
	file, err := parser.ParseFile(token.NewFileSet(), "outbox_bindings.go", src, 0)
	if err != nil {
		t.Fatalf("bindings of %+v do not parse: %v\n%s", b, err, src)
	}
	var queue, messageType string
	ast.Inspect(file, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ValueSpec:
			if n.Names[0].Name == "Queue"+b.Type {
				queue, _ = strconv.Unquote(n.Values[0].(*ast.BasicLit).Value)
			}
		case *ast.FuncDecl:
			if n.Name.Name == "OutboxMessageType" {
				messageType, _ = strconv.Unquote(n.Body.List[0].(*ast.ReturnStmt).Results[0].(*ast.BasicLit).Value)
			}
		}
		return true
	})
	if queue != b.Queue || messageType != b.MessageType {
		t.Fatalf("bindings of queue %q, type %q spell queue %q, type %q:\n%s", b.Queue, b.MessageType, queue, messageType, src)
	}
}
