package wakeup

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/naming"
	"github.com/outboxgen/outboxgen/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// member records what its hub tells it.
type member struct {
	mu        sync.Mutex
	payloads  []string
	listening int
	deaf      bool
}

func (m *member) Notified(_, payload string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.payloads = append(m.payloads, payload)
}

func (m *member) Listening() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.listening++
}

func (m *member) SetDeaf(_ context.Context, deaf bool, _ time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.deaf = deaf
}

func (m *member) Lost(context.Context, error, time.Duration) {}

func (m *member) ListenSettings() (time.Duration, time.Duration, time.Duration) {
	return 30 * time.Second, time.Second, 5 * time.Second
}

func (m *member) Logger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func (m *member) listened() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.listening > 0
}

func (m *member) heard() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.payloads...)
}

// Members that connect alike share one hub, which hands every
// notification to each of them; a member with a connect function of its
// own gets a hub of its own; the hub stops when its last member leaves,
// and the next member starts a new one.
func TestMembersConnectingAlikeShareAHub(t *testing.T) {
	t.Parallel()
	d := pgtest.New(t)
	names := naming.Names{Schema: d.Schema, Table: naming.DefaultTable}
	cache := naming.NewCache(names)
	queries := func(c db.DBTX) *db.Queries { return db.New(naming.DBTX{Inner: c, Cache: cache}) }
	dial := func(ctx context.Context, _ string, connect func(context.Context) (*pgx.Conn, error)) (*pgx.Conn, error) {
		if connect != nil {
			return connect(ctx)
		}
		return pgx.ConnectConfig(ctx, d.Pool.Config().ConnConfig.Copy())
	}
	src := &Source{Dial: dial, Queries: queries, ProbeChannel: names.ProbeChannel(),
		SendProbe: func(ctx context.Context) (string, error) { return "probe", queries(d.Pool).NotifyProbe(ctx, "probe") }}
	var hubs Hubs
	ctx := t.Context()
	a, b, own := &member{}, &member{}, &member{}
	ha := hubs.Join(ctx, src, a, "", nil)
	hb := hubs.Join(ctx, src, b, "", nil)
	connect := func(ctx context.Context) (*pgx.Conn, error) { return dial(ctx, "", nil) }
	hown := hubs.Join(ctx, src, own, "", connect)
	if ha != hb {
		t.Error("two members connecting alike got two hubs")
	}
	if hown == ha {
		t.Error("a member with a connect function of its own shares a hub")
	}
	waitFor(t, "every member listening", func() bool {
		return a.listened() && b.listened() && own.listened()
	})
	if _, err := d.Pool.Exec(ctx, "SELECT pg_notify($1, 'q')", names.Channel()); err != nil {
		t.Fatal(err)
	}
	for name, m := range map[string]*member{"a": a, "b": b, "own": own} {
		waitFor(t, name+" notified", func() bool { return len(m.heard()) == 1 })
	}
	ha.Leave(a)
	x := &member{}
	if got := hubs.Join(ctx, src, x, "", nil); got != hb {
		t.Error("a member joining while b stays got a new hub")
	}
	hb.Leave(x)
	hb.Leave(b)
	hown.Leave(own)
	select {
	case <-hb.done:
	default:
		t.Error("the hub runs on after its last member left")
	}
	c := &member{}
	hc := hubs.Join(ctx, src, c, "", nil)
	defer hc.Leave(c)
	if hc == hb {
		t.Error("a member joining after the last left rejoined the stopped hub")
	}
}

// waitFor polls cond for 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
