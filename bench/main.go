// Command bench measures outboxgen against a bare INSERT and against its
// peers, River and watermill-sql, on one database in one process.
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
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"time"
)

type options struct {
	dsn    string
	rounds int
	scale  float64
	out    io.Writer
	// statements profiles some suites with pg_stat_statements.
	statements bool
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
	{"latency", runLatency},
	{"scaleout", runScaleOut},
	{"memory", runMemory},
	{"keyed", runKeyedDrain},
	{"hotkey", runHotKey},
	{"keyedpublish", runKeyedPublish},
	{"keyedbatch", runKeyedBatch},
	{"explain", runExplain},
}

func main() {
	var (
		o     options
		which string
	)
	flag.StringVar(&o.dsn, "dsn", os.Getenv("DATABASE_URL"), "database to benchmark on (default $DATABASE_URL)")
	flag.IntVar(&o.rounds, "rounds", 7, "rounds per suite; medians are taken over rounds")
	flag.Float64Var(&o.scale, "scale", 1, "multiplies the work per round (0.1 for a smoke run)")
	flag.BoolVar(&o.statements, "statements", false, "profile the keyed suites' statements with pg_stat_statements (it must be loaded)")
	flag.BoolVar(&showSamples, "samples", false, "print every round's figure after each table")
	flag.StringVar(&which, "suite", "all", "comma-separated suites to run: "+suiteNames()+", or all")
	flag.Parse()
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
	if err := run(o, which); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func suiteNames() string {
	var names []string
	for _, s := range suites {
		names = append(names, s.name)
	}
	return strings.Join(names, ",")
}

func run(o options, which string) error {
	if o.dsn == "" {
		return errors.New("no database: set DATABASE_URL or pass -dsn")
	}
	if o.rounds < 1 || o.scale <= 0 {
		return errors.New("-rounds must be at least 1 and -scale positive")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	env, err := newBenchEnv(ctx, o.dsn)
	if err != nil {
		return err
	}
	defer env.close()
	fmt.Fprintf(o.out, "outboxgen benchmarks, %s, %d rounds, scale %g\n", time.Now().UTC().Format(time.DateOnly), o.rounds, o.scale)
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

func jsonOrder(i int) ([]byte, error) { return json.Marshal(sampleOrder(i)) }
