// Command typesize measures what each distinct message type costs a
// program that uses outboxgen: binary size and warm build time.
//
// For each count N of -types it writes, in a temporary directory, a module
// whose main package declares N struct message types of different shapes
// and, for each, builds a Publisher and a Subscriber with a handler, runs
// the subscriber and publishes in a transaction, as a service does. The
// module replaces github.com/outboxgen/outboxgen with the -repo checkout
// and takes its requirements from the checkout's go.mod and go.sum.
//
// The first build warms the build cache and is not timed. Each round then
// edits a constant of the main package, so only the main package is
// compiled again and the program linked, and times go build. It prints
// the binary's size (as built, and stripped with -ldflags='-s -w'), the
// median build time per N, and the increment per type between the
// smallest and the largest N.
//
//	cd bench && go run ./cmd/typesize -repo .. -types 1,20 -rounds 5
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// libModule is the module path of the library under measure.
const libModule = "github.com/outboxgen/outboxgen"

// probeModule is the module path of the generated programs.
const probeModule = "typesizeprobe"

func main() {
	var (
		repo   string
		types  string
		rounds int
		keep   bool
	)
	flag.StringVar(&repo, "repo", "..", "path of an outboxgen checkout (the default suits a run from bench/)")
	flag.StringVar(&types, "types", "1,20", "comma-separated counts of message types, one program each")
	flag.IntVar(&rounds, "rounds", 5, "timed builds per count; the median is reported")
	flag.BoolVar(&keep, "keep", false, "keep the generated modules and print where they are")
	flag.Parse()
	if err := run(os.Stdout, repo, types, rounds, keep); err != nil {
		fmt.Fprintln(os.Stderr, "typesize:", err)
		os.Exit(1)
	}
}

// result is what one count of types measured.
type result struct {
	n        int
	size     int64
	stripped int64
	builds   []time.Duration
}

func (r result) median() time.Duration {
	s := slices.Clone(r.builds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func run(w io.Writer, repo, types string, rounds int, keep bool) error {
	counts, err := parseCounts(types)
	if err != nil {
		return err
	}
	if rounds < 1 {
		return errors.New("-rounds must be at least 1")
	}
	abs, err := filepath.Abs(repo)
	if err != nil {
		return err
	}
	gomod, err := os.ReadFile(filepath.Join(abs, "go.mod"))
	if err != nil {
		return err
	}
	if modulePath(gomod) != libModule {
		return fmt.Errorf("%s: not an outboxgen checkout (its go.mod declares %q)", abs, modulePath(gomod))
	}
	gosum, err := os.ReadFile(filepath.Join(abs, "go.sum"))
	if err != nil {
		return err
	}
	commit := gitCommit(abs)
	var results []result
	for _, n := range counts {
		r, err := measure(abs, gomod, gosum, n, rounds, keep)
		if err != nil {
			return fmt.Errorf("%d types: %w", n, err)
		}
		results = append(results, r)
	}
	report(w, abs, commit, rounds, results)
	return nil
}

// parseCounts reads comma-separated positive integers.
func parseCounts(v string) ([]int, error) {
	var ns []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-types %q: want comma-separated positive integers", v)
		}
		ns = append(ns, n)
	}
	return ns, nil
}

// modulePath returns the path the module line of gomod declares.
func modulePath(gomod []byte) string {
	for _, line := range strings.Split(string(gomod), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}

// gitCommit names the checkout's last commit outside bench/ (the library
// as measured), or "" when git cannot tell.
func gitCommit(dir string) string {
	out, err := exec.Command("git", "-C", dir, "log", "-1", "--format=%h", "--", ".", ":(exclude)bench").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// probeGoMod turns the library's go.mod into the probe's: another module
// path, the library required and replaced by the checkout at repo.
func probeGoMod(gomod []byte, repo string) []byte {
	var b strings.Builder
	for _, line := range strings.Split(string(gomod), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			line = "module " + probeModule
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "\nrequire %s v0.0.0\n\nreplace %s => %s\n", libModule, libModule, strconv.Quote(repo))
	return []byte(b.String())
}

// measure generates the program of n types and times its builds.
func measure(repo string, gomod, gosum []byte, n, rounds int, keep bool) (result, error) {
	r := result{n: n}
	dir, err := os.MkdirTemp("", fmt.Sprintf("typesize-%d-", n))
	if err != nil {
		return r, err
	}
	if keep {
		fmt.Fprintf(os.Stderr, "typesize: %d types in %s\n", n, dir)
	} else {
		defer os.RemoveAll(dir)
	}
	files := map[string][]byte{
		"go.mod":  probeGoMod(gomod, repo),
		"go.sum":  gosum,
		"main.go": program(n, "warm"),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return r, err
		}
	}
	bin := filepath.Join(dir, "bin")
	if _, err := goBuild(dir, "-o", bin, "."); err != nil { // warms the cache
		return r, err
	}
	for i := range rounds {
		if err := os.WriteFile(filepath.Join(dir, "main.go"), program(n, fmt.Sprintf("round %d", i)), 0o644); err != nil {
			return r, err
		}
		d, err := goBuild(dir, "-o", bin, ".")
		if err != nil {
			return r, err
		}
		r.builds = append(r.builds, d)
	}
	if r.size, err = fileSize(bin); err != nil {
		return r, err
	}
	stripped := filepath.Join(dir, "bin.stripped")
	if _, err := goBuild(dir, "-ldflags=-s -w", "-o", stripped, "."); err != nil {
		return r, err
	}
	r.stripped, err = fileSize(stripped)
	return r, err
}

// goBuild runs go build in dir with args and returns how long it took.
func goBuild(dir string, args ...string) (time.Duration, error) {
	cmd := exec.Command("go", append([]string{"build"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("go build %s: %w\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return took, nil
}

func fileSize(path string) (int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

func report(w io.Writer, repo, commit string, rounds int, rs []result) {
	at := repo
	if commit != "" {
		at += ", library at " + commit
	}
	fmt.Fprintf(w, "# typesize\n\n%s, %s, %s/%s, %d CPUs; %d timed rounds per count (the warm-up build untimed)\n\n",
		at, runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), rounds)
	fmt.Fprintln(w, "| types | binary (bytes) | stripped (bytes) | median warm build | builds |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---|")
	for _, r := range rs {
		var each []string
		for _, d := range r.builds {
			each = append(each, ms(d))
		}
		fmt.Fprintf(w, "| %d | %d | %d | %s | %s |\n", r.n, r.size, r.stripped, ms(r.median()), strings.Join(each, ", "))
	}
	if len(rs) < 2 {
		return
	}
	lo, hi := rs[0], rs[0]
	for _, r := range rs {
		if r.n < lo.n {
			lo = r
		}
		if r.n > hi.n {
			hi = r
		}
	}
	if lo.n == hi.n {
		return
	}
	k := float64(hi.n - lo.n)
	fmt.Fprintf(w, "| **per type** (%d→%d)/%d | %.0f | %.0f | %s | |\n", lo.n, hi.n, hi.n-lo.n,
		float64(hi.size-lo.size)/k, float64(hi.stripped-lo.stripped)/k,
		ms(time.Duration(float64(hi.median()-lo.median())/k)))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// shapes are the field sets the message types cycle through, so that
// types differ in layout (and so in their generic instantiations) as a
// service's messages do.
var shapes = []string{
	"ID string `json:\"id\"`\n\tTotal int64 `json:\"total\"`",
	"ID string `json:\"id\"`\n\tAt time.Time `json:\"at\"`\n\tNote *string `json:\"note,omitempty\"`",
	"ID int `json:\"id\"`\n\tTags []string `json:\"tags\"`\n\tAttrs map[string]string `json:\"attrs\"`",
	"ID string `json:\"id\"`\n\tCustomer struct {\n\t\tName  string `json:\"name\"`\n\t\tEmail string `json:\"email\"`\n\t} `json:\"customer\"`\n\tLines []struct {\n\t\tSKU string `json:\"sku\"`\n\t\tQty int  `json:\"qty\"`\n\t} `json:\"lines\"`",
	"Seq uint32 `json:\"seq\"`\n\tOK bool `json:\"ok\"`\n\tRatio float64 `json:\"ratio\"`\n\tPrev *time.Time `json:\"prev,omitempty\"`",
	"Key string `json:\"key\"`\n\tCounts map[string]int64 `json:\"counts\"`\n\tRaw []byte `json:\"raw\"`",
	"ID string `json:\"id\"`\n\tAddr *struct {\n\t\tStreet, City string\n\t\tZip int\n\t} `json:\"addr\"`\n\tHistory []time.Time `json:\"history\"`",
}

// program is the probe's main package with n message types; stamp is the
// constant each round edits.
func program(n int, stamp string) []byte {
	var b strings.Builder
	b.WriteString(`// Command typesizeprobe is generated by bench/cmd/typesize.
package main

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/outboxgen/outboxgen/outbox"
)

var _ = time.Second

`)
	fmt.Fprintf(&b, "const stamp = %q\n\n", stamp)
	for i := range n {
		fmt.Fprintf(&b, "type Msg%d struct {\n\t%s\n\tV%d int `json:\"v%d\"`\n}\n\n", i, shapes[i%len(shapes)], i, i)
		fmt.Fprintf(&b, `func wire%[1]d(ctx context.Context, ob *outbox.Outbox, pool *pgxpool.Pool) error {
	pub, err := outbox.NewPublisher[Msg%[1]d](ob, "q%[1]d", nil)
	if err != nil {
		return err
	}
	sub, err := outbox.NewSubscriber(ob, []string{"q%[1]d"}, func(ctx context.Context, m *outbox.Message[Msg%[1]d]) error {
		log.Printf("q%[1]d: %%v", m.Payload)
		return nil
	}, nil)
	if err != nil {
		return err
	}
	go func() {
		if err := sub.Run(ctx); err != nil {
			log.Print(err)
		}
	}()
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := pub.Publish(ctx, tx, Msg%[1]d{V%[1]d: %[1]d}, nil)
		return err
	})
}

`, i)
	}
	b.WriteString(`func main() {
	ctx := context.Background()
	log.Print(stamp)
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
`)
	for i := range n {
		fmt.Fprintf(&b, "\tif err := wire%d(ctx, ob, pool); err != nil {\n\t\tlog.Fatal(err)\n\t}\n", i)
	}
	b.WriteString("}\n")
	return []byte(b.String())
}
