package engine

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/pgtest"
	"github.com/outboxgen/outboxgen/internal/wakeup"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is one test's outbox (pgtest.NewOutbox).
type env struct {
	t   *testing.T
	ctx context.Context
	*pgtest.Outbox
}

func setup(t *testing.T) *env {
	t.Helper()
	o := pgtest.NewOutbox(t)
	return &env{t: t, ctx: t.Context(), Outbox: o}
}

// subscriber returns a subscriber of queues on e's pool, with the public
// defaults but a discarded log, a handler that succeeds and claims by
// lock only (MinLockedClaim 0).
func (e *env) subscriber(queues ...string) *Subscriber {
	return &Subscriber{
		Name: "test", Queues: queues, Workers: 4, FetchBatchSize: 100,
		MinFetchInterval: 50 * time.Millisecond, MaxFetchInterval: 5 * time.Second,
		LeaseTTL: 30 * time.Second, HeartbeatInterval: 10 * time.Second, LockWindow: time.Second,
		MaxDeliveries: 25, GracefulTimeout: 30 * time.Second, AckBatchSize: 1000, AckLinger: 5 * time.Millisecond,
		QueryTimeout: 30 * time.Second, ListenProbeInterval: 30 * time.Second, ListenProbeTimeout: 5 * time.Second,
		Retry: noRetry{}, Log: discard(),
		Pool: e.DB.Pool, Queries: e.Queries,
		Hubs: &wakeup.Hubs{}, HandoffChannel: e.Names.HandoffChannel(),
		Wake: &wakeup.Source{
			Dial: func(ctx context.Context, _ string, _ func(context.Context) (*pgx.Conn, error)) (*pgx.Conn, error) {
				return pgx.ConnectConfig(ctx, e.DB.Pool.Config().ConnConfig.Copy())
			},
			Queries: e.Queries, ProbeChannel: e.Names.ProbeChannel(),
			SendProbe: func(ctx context.Context) (string, error) { return "p", e.Q.NotifyProbe(ctx, "p") },
		},
		Calls: func() func(*db.ClaimRow) (Call, error) {
			return func(*db.ClaimRow) (Call, error) { return okCall{}, nil }
		},
	}
}

// noRetry ends every failed delivery.
type noRetry struct{}

func (noRetry) NextDelay(int, time.Duration, error) (time.Duration, bool, error) {
	return 0, false, nil
}
func (noRetry) Allow(int, time.Duration, time.Duration, error) (bool, error) { return false, nil }

// okCall is a delivery whose handler succeeds.
type okCall struct{}

func (okCall) Headers() map[string]string             { return nil }
func (okCall) Handle(context.Context) error           { return nil }
func (okCall) HandleTx(context.Context, pgx.Tx) error { return nil }
func testToken(b byte) pgtype.UUID                    { return pgtype.UUID{Bytes: [16]byte{b}, Valid: true} }
func discard() *slog.Logger                           { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
