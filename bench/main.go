// Command bench measures outboxgen against a bare INSERT and against its
// peers, River and watermill-sql, on one database in one process, and its
// JetStream relay against watermill's SQL-to-NATS forwarder.
//
// Every suite runs its contenders in alternating order for several rounds
// on freshly emptied tables and reports the median of each and the ratio
// of the medians, so machine noise hits every contender alike.
//
//	go run . -dsn postgres://postgres@127.0.0.1:5432/test -suite all
//
// The benchmark creates the schemas outboxbench, outboxbench_river and
// outboxbench_watermill, and drops them when it ends.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outboxgen/outboxgen/internal/localpg"
)

type options struct {
	dsn    string
	rounds int
	scale  float64
	out    io.Writer
	// statements profiles some suites with pg_stat_statements.
	statements bool
	// cluster runs the suites on a throwaway cluster (-cluster).
	cluster bool
	// busy keeps one core busy with a second process throughout (-busy).
	busy bool
	// watermillBatch and river are the peers' configurations the drain
	// suite runs, each as a contender of its own.
	watermillBatch []int
	river          []riverConfig
	// contenders, when set, keeps only the contenders whose names it
	// matches (suites that filter: drain, relay).
	contenders *regexp.Regexp
	// natsURL is the broker the relay suite publishes to, and
	// relayWatermillBatch the SubscribeBatchSize values it runs
	// watermill's forwarder at.
	natsURL             string
	relayWatermillBatch []int
}

// only returns the contenders of cs that o.contenders matches.
func (o options) only(cs []contender) []contender {
	if o.contenders == nil {
		return cs
	}
	var kept []contender
	for _, c := range cs {
		if o.contenders.MatchString(c.name) {
			kept = append(kept, c)
		}
	}
	return kept
}

// suite is one benchmark: it prints its own table.
type suite struct {
	name string
	run  func(ctx context.Context, env *benchEnv, o options) error
}

var suites = []suite{
	{"publish", runPublish},
	{"concurrent", runConcurrentPublish},
	{"batch", runBatch},
	{"drain", runDrain},
	{"ring", runRingDrain},
	{"ringturn", runRingTurn},
	{"ringturnkeyed", runRingTurnKeyed},
	{"latency", runLatency},
	{"scaleout", runScaleOut},
	{"ringscale", runRingScale},
	{"memory", runMemory},
	{"keyed", runKeyedDrain},
	{"hotkey", runHotKey},
	{"keyedpublish", runKeyedPublish},
	{"keyedbatch", runKeyedBatch},
	{"explain", runExplain},
	{"designs", runDesigns},
	{"relay", runRelay},
}

func main() {
	var (
		o          options
		which      string
		cpuProfile string
		memProfile string
	)
	flag.StringVar(&o.dsn, "dsn", os.Getenv("DATABASE_URL"), "database to benchmark on (default $DATABASE_URL)")
	flag.IntVar(&o.rounds, "rounds", 7, "rounds per suite; medians are taken over rounds")
	flag.Float64Var(&o.scale, "scale", 1, "multiplies the work per round (0.1 for a smoke run)")
	flag.BoolVar(&o.statements, "statements", false, "profile the keyed suites' statements with pg_stat_statements (it must be loaded)")
	flag.BoolVar(&measureCPU, "cpu", false, "report the client's and the local PostgreSQL server's CPU time (reads /proc; a server on this machine only) and the server's WAL bytes per operation of each timed run")
	flag.BoolVar(&o.busy, "busy", false, "keep one core busy with a second process while the suites run, as another service on the machine would")
	flag.BoolVar(&o.cluster, "cluster", false, "run on a throwaway cluster of this machine's PostgreSQL with pg_stat_statements loaded and autovacuum on, instead of -dsn")
	flag.BoolVar(&showSamples, "samples", false, "print every round's figure after each table")
	flag.StringVar(&which, "suite", "all", "comma-separated suites to run: "+suiteNames()+", or all")
	flag.Func("watermill-batch", "comma-separated SubscribeBatchSize values the drain suite runs watermill-sql at (default "+
		defaultWatermillBatch+")", func(v string) (err error) {
		o.watermillBatch, err = parseInts(v)
		return err
	})
	flag.Func("river", "comma-separated workers/FetchCooldown/FetchPollInterval the drain suite runs River at (default "+
		defaultRiver+")", func(v string) (err error) {
		o.river, err = parseRiverConfigs(v)
		return err
	})
	flag.StringVar(&o.natsURL, "nats", cmp.Or(os.Getenv("NATS_URL"), "nats://127.0.0.1:4222"), "NATS server with JetStream the relay suite publishes to (default $NATS_URL, else 127.0.0.1:4222); the suite is skipped when none answers")
	flag.Func("relay-watermill-batch", "comma-separated SubscribeBatchSize values the relay suite runs watermill's forwarder at (default "+
		defaultRelayWatermillBatch+")", func(v string) (err error) {
		o.relayWatermillBatch, err = parseInts(v)
		return err
	})
	flag.Func("contenders", "regular expression: the drain, relay and designs suites run only the contenders whose names match", func(v string) (err error) {
		o.contenders, err = regexp.Compile(v)
		return err
	})
	flag.StringVar(&perfFIFO, "perf-control", "", "control FIFO of a perf record started disabled (perf record -D -1 --control fifo:FIFO): timed runs enable it while their clock runs")
	flag.StringVar(&memProfile, "memprofile", "", "write an allocation profile of the benchmark process to this file when it ends")
	flag.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the benchmark process (peers and subscribers alike) to this file")
	flag.Parse()
	if o.watermillBatch == nil {
		o.watermillBatch, _ = parseInts(defaultWatermillBatch)
	}
	if o.relayWatermillBatch == nil {
		o.relayWatermillBatch, _ = parseInts(defaultRelayWatermillBatch)
	}
	if o.river == nil {
		o.river, _ = parseRiverConfigs(defaultRiver)
	}
	if os.Getenv(busyEnv) != "" {
		runBusy()
	}
	if subs := os.Getenv(childEnv); subs != "" {
		n, err := strconv.Atoi(subs)
		if err == nil {
			err = runChild(o.dsn, n)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench child:", err)
			os.Exit(1)
		}
		return
	}
	o.out = os.Stdout
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f) // the file closes when the process exits
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: -cpuprofile:", err)
			os.Exit(1)
		}
	}
	err := run(o, which)
	if cpuProfile != "" {
		pprof.StopCPUProfile()
	}
	if memProfile != "" {
		if perr := writeHeapProfile(memProfile); perr != nil {
			fmt.Fprintln(os.Stderr, "bench: -memprofile:", perr)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// The peers' drain configurations by default: the fastest of the sweeps in
// README.md.
const (
	defaultWatermillBatch = "10000"
	defaultRiver          = "2000/2ms/20ms"
)

// parseInts reads comma-separated positive integers.
func parseInts(v string) ([]int, error) {
	var ns []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: want positive integers", v)
		}
		ns = append(ns, n)
	}
	return ns, nil
}

// parseRiverConfigs reads comma-separated River configurations.
func parseRiverConfigs(v string) ([]riverConfig, error) {
	var cs []riverConfig
	for _, f := range strings.Split(v, ",") {
		c, err := parseRiverConfig(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		cs = append(cs, c)
	}
	return cs, nil
}

func suiteNames() string {
	var names []string
	for _, s := range suites {
		names = append(names, s.name)
	}
	return strings.Join(names, ",")
}

func run(o options, which string) error {
	if o.rounds < 1 || o.scale <= 0 {
		return errors.New("-rounds must be at least 1 and -scale positive")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if o.cluster {
		srv, err := localpg.StartCluster(ctx,
			"shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=all",
			"pg_stat_statements.track_planning=on", "autovacuum=on", "max_connections=200")
		if err != nil {
			return fmt.Errorf("-cluster: %w", err)
		}
		defer srv.Stop()
		o.dsn = srv.URL
		fmt.Fprintf(o.out, "on %s\n", srv.How)
	}
	if o.dsn == "" {
		return errors.New("no database: set DATABASE_URL or pass -dsn")
	}
	env, err := newBenchEnv(ctx, o.dsn)
	if err != nil {
		return err
	}
	defer env.close()
	if o.cluster {
		if _, err := env.pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
			return err
		}
	}
	if measureCPU {
		walPool = env.pool
	}
	if o.busy {
		stopBusy, err := startBusy()
		if err != nil {
			return err
		}
		defer stopBusy()
		fmt.Fprintln(o.out, "a second process keeps one core busy throughout (-busy)")
	}
	fmt.Fprintf(o.out, "outboxgen benchmarks, %s, %d rounds, scale %g, load average %s\n",
		time.Now().UTC().Format(time.DateOnly), o.rounds, o.scale, loadAverage())
	for _, s := range suites {
		if which != "all" && !slices.Contains(strings.Split(which, ","), s.name) {
			continue
		}
		fmt.Fprintf(o.out, "\n== %s\n", s.name)
		if err := s.run(ctx, env, o); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return nil
}

// loadAverage is the machine's 1-, 5- and 15-minute load averages, or
// "unknown".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}

func jsonOrder(i int) ([]byte, error) { return json.Marshal(sampleOrder(i)) }

// writeHeapProfile writes the allocations so far (pprof's allocs profile)
// to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
