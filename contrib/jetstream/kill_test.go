package outboxjs_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	outboxjs "github.com/outboxgen/outboxgen/contrib/jetstream"
	"github.com/outboxgen/outboxgen/internal/childtest"
	"github.com/outboxgen/outboxgen/outbox"
)

// The variables that make the test binary a relay process.
const (
	childEnv       = "OUTBOXJS_TEST_CHILD" // set: run a relay
	childDSNEnv    = "OUTBOXJS_TEST_DSN"
	childSchemaEnv = "OUTBOXJS_TEST_SCHEMA"
	childPrefixEnv = "OUTBOXJS_TEST_PREFIX"
)

// childLeaseTTL is the child relays' lease: a killed relay's rows are
// published again this long after their claim.
const childLeaseTTL = 2 * time.Second

// runChild relays the kill test's queue until the process is killed,
// logging each duplicate the stream drops to stderr.
func runChild() error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(childDSNEnv))
	if err != nil {
		return err
	}
	ob, err := outbox.New(pool, &outbox.Config{Schema: os.Getenv(childSchemaEnv)})
	if err != nil {
		return err
	}
	nc, err := nats.Connect(natsURL())
	if err != nil {
		return err
	}
	prefix := os.Getenv(childPrefixEnv)
	e := &env{prefix: prefix}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	relay, err := outboxjs.NewRelay(ob, nc, []string{"orders"}, &outboxjs.Config{
		Subject: e.subject, Subjects: []string{prefix + ".>"}, Logger: log,
		Subscriber: &outbox.SubscriberConfig[[]byte]{
			LeaseTTL: childLeaseTTL, MinFetchInterval: 5 * time.Millisecond, MaxFetchInterval: 100 * time.Millisecond,
		},
	})
	if err != nil {
		return err
	}
	return relay.Run(ctx)
}

// startChild runs the test binary as a relay of e's outbox.
func startChild(t *testing.T, e *env) *childtest.Child {
	t.Helper()
	return childtest.Start(t, childEnv+"=1", childDSNEnv+"="+e.f.Pool.Config().ConnString(),
		childSchemaEnv+"="+e.f.Schema, childPrefixEnv+"="+e.prefix)
}

// kill ends the relay with SIGKILL and returns how many duplicates the
// stream dropped for it.
func kill(t *testing.T, c *childtest.Child) int {
	t.Helper()
	c.Kill(t)
	return strings.Count(c.Stderr(), "dropped as a duplicate")
}

// 10,000 rows (eight ordering keys and unkeyed rows) relayed by a relay
// process that is killed with SIGKILL twice mid-run and replaced: the
// stream ends with exactly 10,000 messages, each once, every key's in
// commit order, and the outbox empty.
func TestKilledRelayPublishesEveryRowOnceInKeyOrder(t *testing.T) {
	if testing.Short() {
		t.Skip("runs relay processes")
	}
	t.Parallel()
	e := setup(t)
	s := e.stream(t, 0) // the default window, 2 min
	const (
		total   = 10000
		keys    = 8
		groups  = keys + 2 // the last two groups are unkeyed
		perCall = 100
	)
	pub, err := outbox.NewPublisher[[]byte](e.f.Outbox, "orders", nil)
	if err != nil {
		t.Fatal(err)
	}
	// Each call publishes perCall rows of one group; each group's rows are
	// numbered in commit order.
	next := make([]int, groups)
	publish := func(calls int) {
		for range calls {
			for g := range groups {
				var opts *outbox.PublishOpts
				name := fmt.Sprintf("u%d", g-keys)
				if g < keys {
					name = fmt.Sprintf("k%d", g)
					opts = &outbox.PublishOpts{OrderingKey: name}
				}
				batch := make([][]byte, perCall)
				for i := range batch {
					batch[i] = fmt.Appendf(nil, "%s/%05d", name, next[g])
					next[g]++
				}
				if _, err := pub.PublishBatch(t.Context(), e.f.Pool, batch, opts); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}
	callsPerRound := total / (groups * perCall)
	publish(callsPerRound / 2)

	start := time.Now()
	first := startChild(t, e)
	publish(callsPerRound - callsPerRound/2) // while the first relay runs
	count := func() uint64 { return msgs(t, s) }
	waitProgress(t, 30*time.Second, "the first relay stopped storing", count, 2500)
	dups := kill(t, first)
	t.Logf("killed the first relay at %d messages, after %v", msgs(t, s), time.Since(start).Round(time.Millisecond))

	second := startChild(t, e)
	waitProgress(t, 30*time.Second, "the second relay got stuck", count, 6000)
	dups += kill(t, second)
	t.Logf("killed the second relay at %d messages, after %v", msgs(t, s), time.Since(start).Round(time.Millisecond))

	third := startChild(t, e)
	relayed := func() uint64 { return uint64(total - e.rows(t)) }
	waitProgress(t, 30*time.Second, "the third relay did not finish", relayed, total)
	dups += kill(t, third)
	t.Logf("the outbox was empty after %v; the stream dropped %d duplicates", time.Since(start).Round(time.Millisecond), dups)

	if n := msgs(t, s); n != total {
		t.Fatalf("the stream holds %d messages; want %d", n, total)
	}
	got := make([][]int, groups)
	ids := map[string]bool{}
	for _, m := range stored(t, s) {
		name, num, _ := strings.Cut(string(m.Data), "/")
		n, err := strconv.Atoi(num)
		if err != nil {
			t.Fatalf("payload %q", m.Data)
		}
		g := int(name[1] - '0')
		if name[0] == 'u' {
			g += keys
		} else if m.Header.Get(outboxjs.HeaderOrderingKey) != name {
			t.Errorf("message %q has ordering key %q", m.Data, m.Header.Get(outboxjs.HeaderOrderingKey))
		}
		got[g] = append(got[g], n)
		id := m.Header.Get(nats.MsgIdHdr)
		if ids[id] {
			t.Errorf("message id %s stored twice", id)
		}
		ids[id] = true
	}
	for g := range groups {
		want := make([]int, total/groups)
		for i := range want {
			want[i] = i
		}
		if g >= keys {
			// Unkeyed rows keep no order.
			slices.Sort(got[g])
		}
		if diff := cmp.Diff(want, got[g]); diff != "" {
			t.Errorf("group %d in stream order (-want +got):\n%s", g, diff)
		}
	}
}
