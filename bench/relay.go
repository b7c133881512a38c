package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	outboxjs "github.com/outboxgen/outboxgen/contrib/jetstream"
	"github.com/outboxgen/outboxgen/outbox"
)

const (
	// relayStream captures relaySubject; both relays publish into it.
	relayStream  = "OUTBOXBENCH"
	relaySubject = "outboxbench.orders"
	// relayForwarderTopic is watermill's forwarder topic: its SQL table
	// holds the enveloped messages.
	relayForwarderTopic = "relay"
)

// defaultRelayWatermillBatch are the SubscribeBatchSize values the relay
// suite runs watermill's forwarder at by default.
const defaultRelayWatermillBatch = "10,100,1000,10000"

// runRelay measures how fast a backlog in PostgreSQL reaches a JetStream
// stream: the outbox's relay (contrib/jetstream) against watermill's
// forwarder (watermill-sql subscriber -> watermill-nats JetStream
// publisher), on the same database and broker. Each contender starts with
// its backlog written and an empty stream; its clock stops when the
// stream holds every message and its table is empty, and a stream that
// holds more messages than were written fails the run.
func runRelay(ctx context.Context, env *benchEnv, o options) error {
	nc, err := nats.Connect(o.natsURL, nats.Timeout(2*time.Second))
	if err != nil {
		fmt.Fprintf(o.out, "skipped: no NATS server at %s (%v); -nats names one\n", o.natsURL, err)
		return nil
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: relayStream, Subjects: []string{"outboxbench.>"}, Storage: jetstream.FileStorage,
	})
	if err != nil {
		return fmt.Errorf("create stream %s: %w", relayStream, err)
	}
	defer func() { _ = js.DeleteStream(context.Background(), relayStream) }()
	// watermill's forwarder table comes into being at its first publish.
	fwd := forwarder.NewPublisher(env.watermill, forwarder.PublisherConfig{ForwarderTopic: relayForwarderTopic})
	if err := fwd.Publish(relaySubject, message.NewMessage(watermill.NewUUID(), []byte(`{}`))); err != nil {
		return err
	}
	fwdTable := watermillSchema().GenerateMessagesTableName(relayForwarderTopic)
	reset := func() error {
		if err := env.reset(ctx); err != nil {
			return err
		}
		if _, err := env.pool.Exec(ctx, "TRUNCATE "+fwdTable); err != nil {
			return err
		}
		return stream.Purge(ctx)
	}

	n := max(int(20000*o.scale)/drainBatch, 1) * drainBatch
	var ours, theirs []string
	var cs []contender
	for _, workers := range []int{outbox.WorkersDefault, 64} {
		name := fmt.Sprintf("outboxjs Relay, %d workers", workers)
		if workers == outbox.WorkersDefault {
			name += " (default)"
		}
		ours = append(ours, name)
		cs = append(cs, contender{name, func(n int) (time.Duration, error) {
			return relayOutbox(ctx, env, nc, stream, n, workers)
		}})
	}
	for _, b := range o.relayWatermillBatch {
		name := fmt.Sprintf("watermill forwarder, SQL batch %d", b)
		theirs = append(theirs, name)
		cs = append(cs, contender{name, func(n int) (time.Duration, error) {
			return relayWatermill(ctx, env, nc, stream, fwd, fwdTable, n, b)
		}})
	}
	cs = o.only(cs)
	s, err := measure(o.rounds, n, reset, cs)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "%d-row backlog relayed into a JetStream stream (file storage, Nats-Msg-Id on every message); "+
		"clock stops when the stream holds every message and the table is empty\n", n)
	var names []string
	for _, c := range cs {
		names = append(names, c.name)
	}
	base := ours[0] // the relay at its default configuration
	if s[base] == nil {
		base = names[0]
	}
	report(o.out, s, names, n, "msg", base)
	if peer := fastest(s, theirs); peer != "" {
		for _, name := range ours {
			if s[name] != nil {
				fmt.Fprintf(o.out, "%s: %.0f msgs/s = %.2fx the fastest watermill forwarder (%s, %.0f msgs/s)\n",
					name, rate(median(s[name]), n), rate(median(s[name]), n)/rate(median(s[peer]), n), peer, rate(median(s[peer]), n))
			}
		}
	}
	return nil
}

// relayOutbox relays a backlog of n orders with an outboxjs.Relay of
// workers workers.
func relayOutbox(ctx context.Context, env *benchEnv, nc *nats.Conn, stream jetstream.Stream, n, workers int) (time.Duration, error) {
	if err := outboxBacklog(ctx, env, n); err != nil {
		return 0, err
	}
	cfg := defaultConfig[[]byte]()
	cfg.Workers = workers
	relay, err := outboxjs.NewRelay(env.ob, nc, []string{topic}, &outboxjs.Config{
		Subject:    func(*outbox.Message[[]byte]) (string, error) { return relaySubject, nil },
		Subjects:   []string{relaySubject},
		Subscriber: cfg,
	})
	if err != nil {
		return 0, err
	}
	return timeRun(ctx, relay, func() error {
		return relayed(ctx, env, stream, n, pgx.Identifier{schemaOurs, "outbox"}.Sanitize())
	})
}

// relayWatermill relays a backlog of n orders, published through
// watermill's forwarder publisher into its SQL table, with watermill's
// forwarder: a watermill-sql subscriber (pgx, DeleteOnAck, batch rows per
// query) feeding a watermill-nats publisher in JetStream mode with
// TrackMsgId (Nats-Msg-Id from the message's UUID).
func relayWatermill(ctx context.Context, env *benchEnv, nc *nats.Conn, stream jetstream.Stream,
	fwd *forwarder.Publisher, table string, n, batch int) (time.Duration, error) {
	if err := watermillBacklog(fwd, relaySubject, n, false); err != nil {
		return 0, err
	}
	sub, err := watermillSubscriber(wsql.BeginnerFromPgx(env.pool), batch)
	if err != nil {
		return 0, err
	}
	pub, err := wmnats.NewPublisherWithNatsConn(nc, wmnats.PublisherPublishConfig{
		Marshaler:         &wmnats.NATSMarshaler{},
		SubjectCalculator: wmnats.DefaultSubjectCalculator,
		JetStream:         wmnats.JetStreamConfig{TrackMsgId: true},
	}, watermill.NopLogger{})
	if err != nil {
		return 0, err
	}
	f, err := forwarder.NewForwarder(sub, pub, watermill.NopLogger{}, forwarder.Config{ForwarderTopic: relayForwarderTopic})
	if err != nil {
		return 0, err
	}
	return timeRun(ctx, runFunc(func(ctx context.Context) error {
		err := f.Run(ctx)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}), func() error { return relayed(ctx, env, stream, n, table) })
}

// runFunc makes a function a runner.
type runFunc func(ctx context.Context) error

func (f runFunc) Run(ctx context.Context) error { return f(ctx) }

// relayed polls until stream holds n messages and table is empty, and
// fails when the stream holds more than n.
func relayed(ctx context.Context, env *benchEnv, stream jetstream.Stream, n int, table string) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		info, err := stream.Info(ctx)
		if err != nil {
			return err
		}
		if got := info.State.Msgs; got > uint64(n) {
			return fmt.Errorf("the stream holds %d messages; %d were written", got, n)
		} else if got == uint64(n) {
			var empty bool
			if err := env.pool.QueryRow(ctx, "SELECT NOT EXISTS (SELECT 1 FROM "+table+")").Scan(&empty); err != nil {
				return err
			}
			if empty {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.New("the backlog was not relayed within 5 minutes")
		}
		time.Sleep(2 * time.Millisecond)
	}
}
