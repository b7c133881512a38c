package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/outboxgen/outboxgen/outbox"
)

// scratchPackage copies files into a fresh package directory under
// testdata (inside the module, where the go command can load it).
func scratchPackage(t *testing.T, files map[string]string) string {
	t.Helper()
	dir, err := os.MkdirTemp("testdata", "scratch-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	for name, src := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestBindGolden(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile(filepath.Join("testdata", "bindpkg", "messages.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"yaml", "json"} {
		t.Run(format, func(t *testing.T) {
			t.Parallel()
			dir := scratchPackage(t, map[string]string{"messages.go": strings.Replace(string(src), "package bindpkg", "package bindpkg", 1)})
			r := runCLI(t, nil, "bind", "-dir", dir, "-format", format)
			if r.code != 0 {
				t.Fatalf("exit %d: %s", r.code, r.stderr)
			}
			for _, name := range []string{"outbox_bindings.go", "asyncapi." + format} {
				got, err := os.ReadFile(filepath.Join(dir, name))
				if err != nil {
					t.Fatal(err)
				}
				// The document's title is the package path, which differs
				// between the scratch copy and the golden package.
				got = []byte(strings.ReplaceAll(string(got), filepath.ToSlash(dir), "testdata/bindpkg"))
				golden := filepath.Join("testdata", "bind", name)
				if *update {
					if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(golden, got, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(golden)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(string(want), string(got)); diff != "" {
					t.Errorf("%s differs from %s (-golden +got; make golden updates it):\n%s", name, golden, diff)
				}
			}
			// The generated file compiles with the package: type=
			// makes PaymentFailed an outbox.MessageTyper.
			pkg, err := loadPackage(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range pkg.Errors {
				t.Errorf("generated package: %v", e)
			}
			// Generating again over the output (and its
			// OutboxMessageType) gives the same output.
			before := dirFiles(t, dir)
			if r := runCLI(t, nil, "bind", "-dir", dir, "-format", format); r.code != 0 {
				t.Fatalf("second run: exit %d: %s", r.code, r.stderr)
			}
			if diff := cmp.Diff(before, dirFiles(t, dir)); diff != "" {
				t.Errorf("second run changed the output:\n%s", diff)
			}
		})
	}
}

func TestBindRejectsBadAnnotationsAndWritesNothing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, src, msg string
	}{
		{"not a struct", `package p

//outbox:message queue=ids
type IDs []string
`, "messages.go:3: IDs is not a struct"},
		{"two types one queue", `package p

//outbox:message queue=orders
type A struct{ X int }

//outbox:message queue=orders
type B struct{ Y int }
`, `are both bound to queue "orders"`},
		{"invalid queue", `package p

//outbox:message queue=` + strings.Repeat("q", 256) + `
type A struct{ X int }
`, "messages.go:3: A: outbox: queue"},
		{"malformed annotation", `package p

//outbox:message topic=orders
type A struct{ X int }
`, "want //outbox:message queue=NAME"},
		{"not key=value", `package p

//outbox:message queue=orders typed
type A struct{ X int }
`, `annotation "//outbox:message queue=orders typed": "typed" is not key=value`},
		{"no queue", `package p

//outbox:message type=orders.A
type A struct{ X int }
`, `annotation "//outbox:message type=orders.A": no queue`},
		{"unknown key", `package p

//outbox:message queue=orders type=A version=2
type A struct{ X int }
`, `annotation "//outbox:message queue=orders type=A version=2": unknown key "version"`},
		{"duplicate queue", `package p

//outbox:message queue=orders queue=other
type A struct{ X int }
`, `annotation "//outbox:message queue=orders queue=other": duplicate key "queue"`},
		{"duplicate type", `package p

//outbox:message type=A queue=orders type=B
type A struct{ X int }
`, `messages.go:3: A: annotation "//outbox:message type=A queue=orders type=B": duplicate key "type"`},
		{"empty type", `package p

//outbox:message queue=orders type=
type A struct{ X int }
`, `annotation "//outbox:message queue=orders type=": empty type`},
		{"non-ASCII type", `package p

//outbox:message queue=orders type=café
type A struct{ X int }
`, `type "café": want printable ASCII without spaces`},
		{"control character in type", "package p\n\n//outbox:message queue=orders type=a\x7fb\ntype A struct{ X int }\n",
			`type "a\x7fb": want printable ASCII without spaces`},
		{"long type", `package p

//outbox:message queue=orders type=` + strings.Repeat("t", 1025) + `
type A struct{ X int }
`, "type is 1025 bytes; at most 1024"},
		{"type with its own OutboxMessageType", `package p

//outbox:message queue=orders type=orders.A
type A struct{ X int }

func (*A) OutboxMessageType() string { return "a" }
`, "messages.go:3: A: type= would generate method OutboxMessageType, but A already has method OutboxMessageType ("},
		{"type with a promoted OutboxMessageType", `package p

type Named struct{}

func (Named) OutboxMessageType() string { return "n" }

//outbox:message queue=orders type=orders.A
type A struct{ Named }
`, "A already has method OutboxMessageType"},
		{"type with a field OutboxMessageType", `package p

//outbox:message queue=orders type=orders.A
type A struct{ OutboxMessageType string }
`, "A already has field OutboxMessageType"},
		{"alias", `package p

type B struct{ X int }

//outbox:message queue=orders
type A = B
`, "messages.go:5: A is an alias; annotate the type it stands for"},
		{"two annotations", `package p

//outbox:message queue=orders
//outbox:message queue=other
type A struct{ X int }
`, `messages.go:4: A: annotation "//outbox:message queue=other": a type has one //outbox: line`},
		{"misspelt annotation", `package p

//outbox:messages queue=orders
type A struct{ X int }
`, `messages.go:3: A: annotation "//outbox:messages queue=orders": want //outbox:message queue=NAME [type=TYPENAME]`},
		{"unencodable field", `package p

//outbox:message queue=orders
type A struct{ C chan int }
`, "field C: type chan int has no JSON form"},
		{"unknown codec", `package p

//outbox:message queue=orders codec=avro
type A struct{ X int }
`, "codec=avro: want one of json, gojson, proto, protojson"},
		{"proto codec on a plain struct", `package p

//outbox:message queue=orders codec=proto
type A struct{ X int }
`, "A is not a generated Protocol Buffers message; codec=proto binds those"},
		{"type= with a proto codec", `package p

//outbox:message queue=orders codec=protojson type=shop.A
type A struct{ X int }
`, "type= with codec=protojson: the codec names the message by its full Protocol Buffers name"},
		{"no annotations", `package p

type A struct{ X int }
`, "no type in"},
		{"unparsable source", `package p

type A struct{
`, "cannot read the package"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := scratchPackage(t, map[string]string{"messages.go": tt.src})
			r := runCLI(t, nil, "bind", "-dir", dir)
			if r.code != 1 || !strings.Contains(r.stderr, tt.msg) {
				t.Errorf("exit %d, %q; want 1 and %q", r.code, r.stderr, tt.msg)
			}
			if files := dirFiles(t, dir); len(files) != 1 {
				t.Errorf("wrote %v", keys(files))
			}
		})
	}
	for _, args := range [][]string{{"bind", "-format", "xml"}, {"bind", "-out", "x.txt"}, {"bind", "-nope"}, {"bind", "extra"}} {
		if r := runCLI(t, nil, args...); r.code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, r.code, r.stderr)
		}
	}
}

// The document states the message-type header publishers record: type=,
// else the type's name, which outbox records by default; a type that
// chooses its name in its own OutboxMessageType method leaves it out.
func TestBindDocumentsTheRecordedMessageType(t *testing.T) {
	t.Parallel()
	dir := scratchPackage(t, map[string]string{"messages.go": `package p

//outbox:message queue=a
type ByDefault struct{ X int }

//outbox:message queue=b type=shop.Named
type Named struct{ X int }

//outbox:message queue=c
type OwnMethod struct{ X int }

func (OwnMethod) OutboxMessageType() string { return "own" }
`})
	if r := runCLI(t, nil, "bind", "-dir", dir, "-format", "json"); r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	b, err := os.ReadFile(filepath.Join(dir, "asyncapi.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Components struct {
			Messages map[string]struct {
				Headers *struct {
					Properties map[string]struct{ Const string }
				}
			}
		}
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for name, m := range doc.Components.Messages {
		got[name] = "<none>"
		if m.Headers != nil {
			got[name] = m.Headers.Properties[outbox.HeaderMessageType].Const
		}
	}
	want := map[string]string{"ByDefault": "ByDefault", "Named": "shop.Named", "OwnMethod": "<none>"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("message-type header in the document (-want +got):\n%s", diff)
	}
}

// scratchModule writes files (paths relative to the module's root) into a
// fresh module of its own, example.com/shop, and returns its directory.
func scratchModule(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	files["go.mod"] = "module example.com/shop\n\ngo 1.26\n"
	for name, src := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Two annotated types of one name in a module would record one message
// type by default, and each one's subscribers would decode the other's
// rows: bind refuses either package, naming both types, their files and
// the fix, and writes nothing, until one of them sets type= (or chooses
// its name with its own OutboxMessageType method).
func TestBindRefusesTwoAnnotatedTypesOfOneNameInAModule(t *testing.T) {
	t.Parallel()
	const (
		orders  = "package orders\n\n//outbox:message queue=shop.orders\ntype Order struct{ ID string }\n"
		billing = "package billing\n\n//outbox:message queue=billing.orders%s\ntype Order struct{ ID string }\n%s"
	)
	for _, tt := range []struct {
		name, billing string
		refused       bool
	}{
		{"neither sets type=", fmt.Sprintf(billing, "", ""), true},
		{"one sets type=", fmt.Sprintf(billing, " type=billing.Order", ""), false},
		{"one has its own OutboxMessageType", fmt.Sprintf(billing, "", "\nfunc (*Order) OutboxMessageType() string { return \"billing.Order\" }\n"), false},
		{"the other is not annotated", "package billing\n\ntype Order struct{ ID string }\n", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			mod := scratchModule(t, map[string]string{"orders/messages.go": orders, "internal/billing/messages.go": tt.billing})
			for _, pkg := range []struct{ dir, self, other, otherFile string }{
				{"orders", "Order", "example.com/shop/internal/billing.Order", "internal/billing/messages.go"},
				{"internal/billing", "Order", "example.com/shop/orders.Order", "orders/messages.go"},
			} {
				if !tt.refused && pkg.dir == "internal/billing" {
					continue // not every variant annotates it without type=
				}
				dir := filepath.Join(mod, pkg.dir)
				r := runCLI(t, nil, "bind", "-dir", dir)
				if !tt.refused {
					if r.code != 0 {
						t.Errorf("bind in %s: exit %d: %s", pkg.dir, r.code, r.stderr)
					}
					continue
				}
				self := filepath.Join(dir, "messages.go") + ":3: Order and " + pkg.other + " (" + filepath.Join(mod, pkg.otherFile) + ":3)"
				for _, want := range []string{self, `both annotated //outbox:message without type=, so both record message type "Order"`,
					"a subscriber of either decodes the other's rows: set type= on one of them (type=" + filepath.Base(pkg.dir) + ".Order, say)"} {
					if r.code != 1 || !strings.Contains(r.stderr, want) {
						t.Errorf("bind in %s: exit %d, %q; want 1 and %q", pkg.dir, r.code, r.stderr, want)
					}
				}
				if files := dirFiles(t, dir); len(files) != 1 {
					t.Errorf("bind in %s wrote %v", pkg.dir, keys(files))
				}
			}
		})
	}
}

// codec=gojson makes the constructors use contrib/gojson's codec unless
// their config sets one; the document's content type stays JSON.
func TestBindChoosesTheCodec(t *testing.T) {
	t.Parallel()
	dir := scratchPackage(t, map[string]string{"messages.go": `package p

//outbox:message queue=orders codec=gojson
type A struct{ X int }

//outbox:message queue=mail
type B struct{ Y int }
`})
	if r := runCLI(t, nil, "bind", "-dir", dir); r.code != 0 {
		t.Fatalf("bind: exit %d\n%s", r.code, r.stderr)
	}
	files := dirFiles(t, dir)
	code := files["outbox_bindings.go"]
	for _, want := range []string{"\t\"github.com/outboxgen/outboxgen/contrib/gojson\"\n", "c.Codec = outboxgojson.Codec[A]{}",
		"return outbox.NewSubscriber(ob, []string{QueueA}, h, ASubscriberConfig(cfg))",
		"return outbox.NewPublisher(ob, QueueB, cfg)"} {
		if !strings.Contains(code, want) {
			t.Errorf("the bindings lack %q:\n%s", want, code)
		}
	}
	if strings.Count(files["asyncapi.yaml"], `contentType: "application/json"`) != 2 {
		t.Errorf("the document's content types:\n%s", files["asyncapi.yaml"])
	}
}

// The Go names protoc-gen-go gives messages, and the full names a file
// descriptor gives them, nested ones too.
func TestProtoNamesFromAFileDescriptor(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"OrderPlaced": "OrderPlaced", "order_placed": "OrderPlaced", "v2_event": "V2Event",
		"_private": "XPrivate", "HTTPRequest": "HTTPRequest", "a.b_c": "ABC", "a.B": "A_B"} {
		if got := goCamelCase(in); got != want {
			t.Errorf("goCamelCase(%q) = %q, want %q", in, got, want)
		}
	}
	// file "shop/v1/order.proto", package "shop.v1", message Order with a
	// nested message line_item, and message Refund.
	str := func(num int, s string) []byte { return append([]byte{byte(num<<3 | 2), byte(len(s))}, s...) }
	nested := str(1, "line_item")
	order := append(str(1, "Order"), append([]byte{3<<3 | 2, byte(len(nested))}, nested...)...)
	desc := append(append(str(1, "shop/v1/order.proto"), str(2, "shop.v1")...), append([]byte{4<<3 | 2, byte(len(order))}, order...)...)
	desc = append(desc, 0x50, 0x01) // field 10, a varint: skipped
	refund := str(1, "Refund")
	desc = append(desc, append([]byte{4<<3 | 2, byte(len(refund))}, refund...)...)
	file, names, err := descriptorNames(desc)
	want := map[string]string{"Order": "shop.v1.Order", "Order_LineItem": "shop.v1.Order.line_item", "Refund": "shop.v1.Refund"}
	if diff := cmp.Diff(want, names); diff != "" || err != nil || file != "shop/v1/order.proto" {
		t.Errorf("descriptorNames = %q, (-want +got):\n%s%v", file, diff, err)
	}
	if _, _, err := descriptorNames(desc[:len(desc)-3]); err == nil {
		t.Error("a truncated descriptor read without error")
	}
}
