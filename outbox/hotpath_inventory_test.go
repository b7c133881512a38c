package outbox

import (
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// hotPathSources are the files whose generated queries run on the hot
// path: publish, claim, heartbeat, outcomes, hand-over, sleep and
// wake-up.
var hotPathSources = []string{"publisher.go", "timer.go", "../internal/engine/*.go", "../internal/claim/*.go"}

// notOnTheOutbox are hot-path queries (by method) that read and write none of the
// outbox's tables, so a held vacuum horizon leaves their cost as it is.
var notOnTheOutbox = map[string]string{
	"ConfirmLocked":                "reads the transaction status of a claim's xid",
	"StillInFlight":                "reads pg_stat_activity for the sessions of a sleep record",
	"SavepointLockEnd":             "a savepoint",
	"RollbackToLockEnd":            "a rollback to the savepoint",
	"LiftIdleInTransactionTimeout": "a SET LOCAL",
	"IdleInTransactionTimeout":     "reads a setting",
}

// onlyWithTheRing are the statements of claims from the log tier's ring
// (claim.Env.Ring, schema 13). Their reads under a held horizon are
// measured by the ring's own soak (soak -ring) and plan tests
// (internal/claim's TestRingReadStepsOverWhatAHeldTransactionKeepsBehindIt),
// not by the table's benchmark, whose fixture publishes into the table.
// RingInUse is not among them: every claimer of the table asks it, and
// the table's benchmark measures it.
var onlyWithTheRing = map[string]bool{
	"RingConfirm": true, "RingMove": true, "RingMoveCrashed": true, "RingMoveKeyed": true, "RingPositions": true,
	"RingProgress": true, "RingRead": true, "RingReadKeyed": true, "RingReadyLanes": true,
	"RingReadRest": true, "RingRecord": true, "RingHeldKeys": true, "RingTakeLanes": true,
	"RingTurnState": true, "RingNextSlot": true, "RingCloseSlot": true, "RingDoneSlots": true, "RingTruncate": true,
	"RingPrune": true, "RingLockKeyedLanes": true, "RingAddLanes": true, "RingAck": true, "RingWaitAcks": true,
}

// queryMethods returns the generated queries (the methods of
// db.Queries), each with the statement it sends: the name of the SQL
// constant it passes, or its own name when it passes none. Two methods
// that send one statement (LockQueue and LockQueueAppend) are one
// statement here.
func queryMethods(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("../db/*.go")
	if err != nil {
		t.Fatal(err)
	}
	methods := map[string]string{}
	for _, f := range parseFiles(t, files) {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || len(fn.Recv.List) != 1 || !fn.Name.IsExported() {
				continue
			}
			star, ok := fn.Recv.List[0].Type.(*ast.StarExpr)
			if !ok {
				continue
			}
			if recv, ok := star.X.(*ast.Ident); !ok || recv.Name != "Queries" {
				continue
			}
			methods[fn.Name.Name] = fn.Name.Name
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) < 2 {
					return true
				}
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok && slices.Contains([]string{"Query", "QueryRow", "Exec"}, sel.Sel.Name) {
					if sql, ok := call.Args[1].(*ast.Ident); ok {
						methods[fn.Name.Name] = sql.Name
						return false
					}
				}
				return true
			})
		}
	}
	return methods
}

// parseFiles parses the Go files named, failing t when one does not parse.
func parseFiles(t *testing.T, files []string) []*ast.File {
	t.Helper()
	fset := gotoken.NewFileSet()
	var out []*ast.File
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, f)
	}
	return out
}

// calledStatements returns the statements of the generated queries that
// node calls.
func calledStatements(node ast.Node, methods map[string]string) map[string]bool {
	called := map[string]bool{}
	ast.Inspect(node, func(n ast.Node) bool {
		if call, ok := n.(*ast.CallExpr); ok {
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok && methods[sel.Sel.Name] != "" {
				called[methods[sel.Sel.Name]] = true
			}
		}
		return true
	})
	return called
}

// Every generated query the hot path runs on the outbox's tables is among
// the statements BenchmarkHotPathBuffersUnderAHeldSnapshot measures, so
// that a new one cannot slow down under a held vacuum horizon unseen.
func TestEveryHotPathQueryIsMeasuredUnderAHeldSnapshot(t *testing.T) {
	t.Parallel()
	methods := queryMethods(t)
	var files []string
	for _, pattern := range hotPathSources {
		matches, err := filepath.Glob(pattern)
		if err != nil || len(matches) == 0 {
			t.Fatalf("%s: %v (matched %d files)", pattern, err, len(matches))
		}
		for _, m := range matches {
			if !strings.HasSuffix(m, "_test.go") {
				files = append(files, m)
			}
		}
	}
	hot := map[string]bool{}
	for _, f := range parseFiles(t, files) {
		for q := range calledStatements(f, methods) {
			hot[q] = true
		}
	}
	var measured map[string]bool
	for _, f := range parseFiles(t, []string{"horizon_plans_bench_test.go"}) {
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == "measure" {
				measured = calledStatements(fn, methods)
			}
		}
	}
	if len(measured) == 0 {
		t.Fatal("found no query that the benchmark's measure calls")
	}
	var unmeasured, stale []string
	exempt := map[string]bool{}
	for q := range onlyWithTheRing {
		exempt[methods[q]] = true
	}
	for q := range notOnTheOutbox {
		exempt[methods[q]] = true
		if !hot[methods[q]] {
			stale = append(stale, q)
		}
	}
	for q := range hot {
		if !measured[q] && !exempt[q] {
			unmeasured = append(unmeasured, q)
		}
	}
	slices.Sort(unmeasured)
	slices.Sort(stale)
	if diff := cmp.Diff([]string(nil), unmeasured); diff != "" {
		t.Errorf("hot-path queries that BenchmarkHotPathBuffersUnderAHeldSnapshot does not measure (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string(nil), stale); diff != "" {
		t.Errorf("queries listed as not on the outbox that the hot path no longer runs (-want +got):\n%s", diff)
	}
}
