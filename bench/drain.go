package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	gojson "github.com/goccy/go-json"
	"github.com/jackc/pgx/v5"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/outboxgen/outboxgen/bench/internal/benchpb"
	outboxgojson "github.com/outboxgen/outboxgen/contrib/gojson"
	"github.com/outboxgen/outboxgen/contrib/protocodec"
	"github.com/outboxgen/outboxgen/outbox"
)

// drainBatch is the rows per backlog insert call.
const drainBatch = 1000

// runDrain measures how fast each contender empties a backlog with a no-op
// handler. The backlog is written before the clock starts; the clock stops
// when the handler has seen every row and every row is gone (the outbox's
// and watermill's tables are empty, River's jobs are all completed), so
// acknowledgements still in flight are timed too.
//
// Peers run at each configuration o lists (-watermill-batch, -river), so
// a sweep finds their fastest; the ratios are against the typed
// Subscriber at its default configuration.
func runDrain(ctx context.Context, env *benchEnv, o options) error {
	n := max(int(100000*o.scale)/drainBatch, 1) * drainBatch
	cs := []contender{
		{drainDefault, func(n int) (time.Duration, error) { return drainOutbox(ctx, env, n, defaultConfig[order]()) }},
		{"outbox Subscriber, default config, claims by lease", func(n int) (time.Duration, error) {
			return drainOutbox(ctx, env, n, leasing(defaultConfig[order]()))
		}},
		{"outbox Subscriber, bench config", func(n int) (time.Duration, error) { return drainOutbox(ctx, env, n, drainConfig[order]()) }},
		{"outbox Subscriber, bench config, claims by lease", func(n int) (time.Duration, error) {
			return drainOutbox(ctx, env, n, leasing(drainConfig[order]()))
		}},
		{drainRaw, func(n int) (time.Duration, error) { return drainOutboxRaw(ctx, env, n) }},
		{drainGoJSON, func(n int) (time.Duration, error) {
			return drainOutbox(ctx, env, n, withCodec(defaultConfig[order](), outboxgojson.Codec[order]{}))
		}},
		{drainProtobuf, func(n int) (time.Duration, error) {
			return drainTyped(ctx, env, n, sampleOrderPB, withCodec(defaultConfig[*benchpb.Order](), protocodec.Codec[*benchpb.Order]{}))
		}},
		{drainProtoJSON, func(n int) (time.Duration, error) {
			return drainTyped(ctx, env, n, sampleOrderPB, withCodec(defaultConfig[*benchpb.Order](), protocodec.Codec[*benchpb.Order]{JSON: true}))
		}},
		{drainDefault + eachID, func(n int) (time.Duration, error) {
			cfg := defaultConfig[order]()
			return drainTypedFrom(ctx, env, n, cfg, func() error { return publishEach(ctx, env, n, cfg.Codec, sampleOrder) })
		}},
		{drainGoJSON + eachID, func(n int) (time.Duration, error) {
			cfg := withCodec(defaultConfig[order](), outboxgojson.Codec[order]{})
			return drainTypedFrom(ctx, env, n, cfg, func() error { return publishEach(ctx, env, n, cfg.Codec, sampleOrder) })
		}},
		{"outbox Subscriber of two queues, default config", func(n int) (time.Duration, error) {
			// A claim of several queues ranks its rows across them.
			return drainOutbox(ctx, env, n, defaultConfig[order](), topic, topic+".2")
		}},
	}
	cs = append(cs, txContenders(ctx, env)...)
	var rivers, watermills, decoding, goccyDecoding, decodingEach, goccyDecodingEach []string
	for _, rc := range o.river {
		name := "river, " + rc.String()
		rivers = append(rivers, name)
		cs = append(cs, contender{name, func(n int) (time.Duration, error) { return drainRiver(ctx, env, n, rc) }})
	}
	for _, b := range o.watermillBatch {
		pgxName, stdName := fmt.Sprintf("watermill-sql pgx, batch %d", b), fmt.Sprintf("watermill-sql database/sql, batch %d", b)
		watermills = append(watermills, pgxName, stdName)
		decoding = append(decoding, decodingName(b))
		goccyDecoding = append(goccyDecoding, goccyDecodingName(b))
		decodingEach = append(decodingEach, decodingName(b)+eachID)
		goccyDecodingEach = append(goccyDecodingEach, goccyDecodingName(b)+eachID)
		cs = append(cs,
			contender{pgxName, func(n int) (time.Duration, error) {
				return drainWatermill(ctx, env, n, wsql.BeginnerFromPgx(env.pool), b, nil, false)
			}},
			contender{decodingName(b), func(n int) (time.Duration, error) {
				return drainWatermill(ctx, env, n, wsql.BeginnerFromPgx(env.pool), b, json.Unmarshal, false)
			}},
			contender{goccyDecodingName(b), func(n int) (time.Duration, error) {
				return drainWatermill(ctx, env, n, wsql.BeginnerFromPgx(env.pool), b, gojson.Unmarshal, false)
			}},
			contender{decodingName(b) + eachID, func(n int) (time.Duration, error) {
				return drainWatermill(ctx, env, n, wsql.BeginnerFromPgx(env.pool), b, json.Unmarshal, true)
			}},
			contender{goccyDecodingName(b) + eachID, func(n int) (time.Duration, error) {
				return drainWatermill(ctx, env, n, wsql.BeginnerFromPgx(env.pool), b, gojson.Unmarshal, true)
			}},
			contender{stdName, func(n int) (time.Duration, error) {
				return drainWatermill(ctx, env, n, wsql.BeginnerFromStdSQL(env.stdDB), b, nil, false)
			}})
	}
	cs = o.only(cs)
	s, stats, err := o.measureStatements(ctx, env, n, cs)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.out, "%d-row backlog, no-op handler; clock stops at an empty table (River: every job completed)\n", n)
	var names []string
	for _, c := range cs {
		names = append(names, c.name)
	}
	base := drainDefault
	if s[base] == nil {
		base = names[0]
	}
	report(o.out, s, names, n, "msg", base)
	for _, peer := range [][]string{rivers, watermills, decoding, goccyDecoding} {
		if best := fastest(s, peer); best != "" {
			fmt.Fprintf(o.out, "fastest %s: %.0f msgs/s; %s / it = %.2fx\n", best, rate(median(s[best]), n), base,
				rate(median(s[base]), n)/rate(median(s[best]), n))
		}
	}
	reportCodecs(o.out, s, n, decoding, goccyDecoding)
	reportEach(o.out, s, n, decodingEach, goccyDecodingEach)
	stats.report(o.out, names, o.rounds, n)
	return nil
}

// The drain's contenders of each codec besides encoding/json, the
// default.
const (
	drainGoJSON    = "outbox Subscriber[order], default config, gojson codec"
	drainProtobuf  = "outbox Subscriber[*benchpb.Order], default config, protobuf codec"
	drainProtoJSON = "outbox Subscriber[*benchpb.Order], default config, protojson codec"
	drainRaw       = "outbox Subscriber[[]byte], default config"
)

// reportCodecs prints the ratios the codecs are judged on: the typed
// drain with the gojson codec against the fastest watermill-sql whose
// consumer decodes with encoding/json (decoding) and with goccy/go-json
// (goccyDecoding), and against Subscriber[[]byte]; then each codec's rate
// against the typed drain with encoding/json. A ratio whose contenders
// did not run is left out.
func reportCodecs(w io.Writer, s samples, n int, decoding, goccyDecoding []string) {
	printRatio(w, s, n, drainGoJSON, fastest(s, decoding))
	printRatio(w, s, n, drainGoJSON, fastest(s, goccyDecoding))
	printRatio(w, s, n, drainGoJSON, drainRaw)
	for _, c := range []string{drainGoJSON, drainProtobuf, drainProtoJSON, drainRaw} {
		printRatio(w, s, n, c, drainDefault)
	}
}

// printRatio prints a's rate over b's, of their medians and round by
// round, unless either did not run.
func printRatio(w io.Writer, s samples, n int, a, b string) {
	if s[a] == nil || s[b] == nil {
		return
	}
	med, lo, hi, _ := pairedRatio(s, a, b)
	fmt.Fprintf(w, "%s / %s = %.2fx (of medians); by round %.2fx (median), %.2f to %.2fx\n",
		a, b, rate(median(s[a]), n)/rate(median(s[b]), n), med, lo, hi)
}

// eachID ends the names of the contenders whose backlog is written as
// services write rows, one message at a time, each with a correlation id
// of its own, so that no two rows share their headers (watermill-sql:
// its correlation_id metadata): the subscriber reads every row's headers
// rather than the last row's again.
const eachID = ", a correlation id per message"

// reportEach prints the ratios of the typed drains of rows that each
// have their own correlation id (see eachID): with the gojson codec, to
// watermill-sql decoding the same rows with encoding/json (decodingEach)
// and with goccy/go-json (goccyDecodingEach), and each against its drain
// of rows written in batches.
func reportEach(w io.Writer, s samples, n int, decodingEach, goccyDecodingEach []string) {
	for _, r := range [][2]string{
		{drainGoJSON + eachID, fastest(s, decodingEach)},
		{drainGoJSON + eachID, fastest(s, goccyDecodingEach)},
		{drainGoJSON + eachID, drainGoJSON},
		{drainDefault + eachID, drainDefault},
	} {
		printRatio(w, s, n, r[0], r[1])
	}
}

// decodingName names the watermill-sql contender whose consumer decodes
// each payload into an order, as the typed Subscriber does before its
// handler runs: the same work for the same result. The goal is judged
// against the fastest watermill-sql that decodes nothing.
func decodingName(batch int) string {
	return fmt.Sprintf("watermill-sql pgx, batch %d, consumer decodes JSON", batch)
}

// goccyDecodingName names the watermill-sql contender whose consumer
// decodes each payload into an order with goccy/go-json, the decoder of
// the gojson codec: the equal-work peer of the typed Subscriber with that
// codec.
func goccyDecodingName(batch int) string {
	return fmt.Sprintf("watermill-sql pgx, batch %d, consumer decodes JSON with goccy/go-json", batch)
}

// drainDefault names the contender the drain's goal is judged on.
const drainDefault = "outbox Subscriber, default config"

// fastest returns the contender of names with the shortest median in s, or
// "" when s holds none of them.
func fastest(s samples, names []string) string {
	best := ""
	for _, name := range names {
		if s[name] != nil && (best == "" || median(s[name]) < median(s[best])) {
			best = name
		}
	}
	return best
}

// waitFor polls done until it reports n or a minute passes.
func waitFor(ctx context.Context, done *atomic.Int64, n int) error {
	deadline := time.Now().Add(time.Minute)
	for done.Load() < int64(n) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("handled %d of %d", done.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// outboxBacklog publishes n orders to topic, or split evenly between
// queues when it is given some, with the default codec.
func outboxBacklog(ctx context.Context, env *benchEnv, n int, queues ...string) error {
	return publishBacklog(ctx, env, n, nil, sampleOrder, queues...)
}

// publishBacklog publishes sample(0) to sample(n-1) to topic, or split
// evenly between queues when it is given some, drainBatch at a time,
// encoded by codec (nil: T's default codec).
func publishBacklog[T any](ctx context.Context, env *benchEnv, n int, codec outbox.Codec[T], sample func(int) T, queues ...string) error {
	if len(queues) == 0 {
		queues = []string{topic}
	}
	msgs := make([]T, drainBatch)
	next := 0
	for q, queue := range queues {
		pub, err := outbox.NewPublisher(env.ob, queue, &outbox.PublisherConfig[T]{Codec: codec})
		if err != nil {
			return err
		}
		for end := n * (q + 1) / len(queues); next < end; next += len(msgs) {
			msgs = msgs[:min(drainBatch, end-next)]
			for i := range msgs {
				msgs[i] = sample(next + i)
			}
			if _, err := pub.PublishBatch(ctx, env.pool, msgs, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// publishEach writes the backlog of topic as services write their rows:
// one Publish per message, each with a correlation id of its own
// (drainBatch messages a transaction, so that it is written sooner).
func publishEach[T any](ctx context.Context, env *benchEnv, n int, codec outbox.Codec[T], sample func(int) T) error {
	pub, err := outbox.NewPublisher(env.ob, topic, &outbox.PublisherConfig[T]{Codec: codec})
	if err != nil {
		return err
	}
	for first := 0; first < n; first += drainBatch {
		if err := pgx.BeginFunc(ctx, env.pool, func(tx pgx.Tx) error {
			for i := first; i < min(first+drainBatch, n); i++ {
				if _, err := pub.Publish(ctx, tx, sample(i), nil); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// drainConfig is the subscriber the keyed suites run.
func drainConfig[T any]() *outbox.SubscriberConfig[T] {
	return &outbox.SubscriberConfig[T]{
		Workers: 16, FetchBatchSize: 250, AckBatchSize: 250,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// leasing makes cfg claim by lease instead of by row lock.
func leasing[T any](cfg *outbox.SubscriberConfig[T]) *outbox.SubscriberConfig[T] {
	cfg.LockWindow = -1
	return cfg
}

// defaultConfig is a subscriber at its defaults, its logs silenced.
func defaultConfig[T any]() *outbox.SubscriberConfig[T] {
	return &outbox.SubscriberConfig[T]{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// withCodec makes cfg decode with codec.
func withCodec[T any](cfg *outbox.SubscriberConfig[T], codec outbox.Codec[T]) *outbox.SubscriberConfig[T] {
	cfg.Codec = codec
	return cfg
}

// drainOutbox drains into a Subscriber[order] configured by cfg, of
// topic or of queues (the backlog split between them): each payload is
// decoded into the typed message, as River decodes its job args.
func drainOutbox(ctx context.Context, env *benchEnv, n int, cfg *outbox.SubscriberConfig[order], queues ...string) (time.Duration, error) {
	return drainTyped(ctx, env, n, sampleOrder, cfg, queues...)
}

// drainTyped drains into a Subscriber[T] configured by cfg, of topic or of
// queues (the backlog split between them). The backlog holds sample(0) to
// sample(n-1), written by a publisher with cfg's codec (T's default when
// cfg has none), and the subscriber decodes each payload with the same
// codec into the typed message.
func drainTyped[T any](ctx context.Context, env *benchEnv, n int, sample func(int) T, cfg *outbox.SubscriberConfig[T], queues ...string) (time.Duration, error) {
	return drainTypedFrom(ctx, env, n, cfg, func() error { return publishBacklog(ctx, env, n, cfg.Codec, sample, queues...) }, queues...)
}

// drainTypedFrom is drainTyped of the backlog backlog writes.
func drainTypedFrom[T any](ctx context.Context, env *benchEnv, n int, cfg *outbox.SubscriberConfig[T], backlog func() error, queues ...string) (time.Duration, error) {
	subscribed := queues
	if len(subscribed) == 0 {
		subscribed = []string{topic}
	}
	var done atomic.Int64
	sub, err := outbox.NewSubscriber(env.ob, subscribed, func(context.Context, *outbox.Message[T]) error {
		done.Add(1)
		return nil
	}, cfg)
	if err != nil {
		return 0, err
	}
	if err := backlog(); err != nil {
		return 0, err
	}
	return runUntilEmpty(ctx, env, n, sub, &done)
}

// drainOutboxRaw drains into a Subscriber[[]byte] at its default
// configuration: payloads are handed over undecoded, as watermill hands
// over its messages.
func drainOutboxRaw(ctx context.Context, env *benchEnv, n int) (time.Duration, error) {
	var done atomic.Int64
	sub, err := outbox.NewSubscriber(env.ob, []string{topic}, func(context.Context, *outbox.Message[[]byte]) error {
		done.Add(1)
		return nil
	}, defaultConfig[[]byte]())
	if err != nil {
		return 0, err
	}
	return drainWith(ctx, env, n, sub, &done)
}

// runner is a Subscriber of any message type.
type runner interface{ Run(context.Context) error }

// drainWith writes the backlog (to topic, or split between queues), then
// times sub until done reaches n and the outbox is empty.
func drainWith(ctx context.Context, env *benchEnv, n int, sub runner, done *atomic.Int64, queues ...string) (time.Duration, error) {
	if err := outboxBacklog(ctx, env, n, queues...); err != nil {
		return 0, err
	}
	return runUntilEmpty(ctx, env, n, sub, done)
}

// timeRun starts sub and times it until finished returns, then stops it.
// An error of Run comes first, then finished's.
func timeRun(ctx context.Context, sub runner, finished func() error) (time.Duration, error) {
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 1)
	clock := startClock()
	go func() { errc <- sub.Run(rctx) }()
	werr := finished()
	took := clock.stop()
	stop()
	if err := <-errc; err != nil {
		return 0, err
	}
	return took, werr
}

// riverConfig is one configuration of River's drain: its queue's
// MaxWorkers, FetchCooldown and FetchPollInterval.
type riverConfig struct {
	workers        int
	cooldown, poll time.Duration
}

// String formats c as the -river flag takes it.
func (c riverConfig) String() string {
	return fmt.Sprintf("%d/%v/%v", c.workers, c.cooldown, c.poll)
}

// parseRiverConfig reads workers/cooldown/poll, e.g. 2000/2ms/20ms.
func parseRiverConfig(s string) (riverConfig, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 {
		return riverConfig{}, fmt.Errorf("%q: want workers/cooldown/poll", s)
	}
	var c riverConfig
	var err error
	if c.workers, err = strconv.Atoi(parts[0]); err != nil || c.workers < 1 {
		return riverConfig{}, fmt.Errorf("%q: workers must be a positive integer", s)
	}
	if c.cooldown, err = time.ParseDuration(parts[1]); err != nil {
		return riverConfig{}, fmt.Errorf("%q: %w", s, err)
	}
	if c.poll, err = time.ParseDuration(parts[2]); err != nil {
		return riverConfig{}, fmt.Errorf("%q: %w", s, err)
	}
	return c, nil
}

// drainRiver drains River's jobs with configuration rc; the clock stops
// when the worker has run every job and every job is completed.
func drainRiver(ctx context.Context, env *benchEnv, n int, rc riverConfig) (time.Duration, error) {
	params := make([]river.InsertManyParams, drainBatch)
	for first := 0; first < n; first += drainBatch {
		for i := range params {
			params[i] = river.InsertManyParams{Args: sampleOrder(first + i)}
		}
		if _, err := env.river.InsertManyFast(ctx, params); err != nil {
			return 0, err
		}
	}
	var done atomic.Int64
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[order]) error {
		done.Add(1)
		return nil
	}))
	client, err := river.NewClient(riverpgxv5.New(env.pool), &river.Config{
		Schema: schemaRiver, Workers: workers, Logger: discardLogger(),
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: rc.workers}},
		FetchCooldown: rc.cooldown, FetchPollInterval: rc.poll,
	})
	if err != nil {
		return 0, err
	}
	clock := startClock()
	if err := client.Start(ctx); err != nil {
		return 0, err
	}
	werr := waitFor(ctx, &done, n)
	if werr == nil {
		werr = waitTable(ctx, env, "SELECT count(*) = $1 FROM "+pgx.Identifier{schemaRiver, "river_job"}.Sanitize()+
			" WHERE state = 'completed'", n)
	}
	took := clock.stop()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := client.Stop(sctx); err != nil {
		return 0, err
	}
	return took, werr
}

// waitTable polls query, which takes n as $1, until it returns true.
func waitTable(ctx context.Context, env *benchEnv, query string, n int) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var ok bool
		if err := env.pool.QueryRow(ctx, query, n).Scan(&ok); err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("rows left after 2 minutes: " + query)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// watermillBacklog publishes n orders to topic through pub, drainBatch
// at a time.
func watermillBacklog(pub message.Publisher, topic string, n int, each bool) error {
	msgs := make([]*message.Message, drainBatch)
	for first := 0; first < n; first += drainBatch {
		for i := range msgs {
			payload, err := jsonOrder(first + i)
			if err != nil {
				return err
			}
			msgs[i] = message.NewMessage(watermill.NewUUID(), payload)
			if each {
				middleware.SetCorrelationID(watermill.NewUUID(), msgs[i])
			}
		}
		if err := pub.Publish(topic, msgs...); err != nil {
			return err
		}
	}
	return nil
}

// watermillSubscriber is watermill-sql's subscriber of its queue schema
// through db, taking batch rows per query and deleting rows on ack,
// polling every 20 ms.
func watermillSubscriber(db wsql.Beginner, batch int) (*wsql.Subscriber, error) {
	schema := watermillSchema()
	schema.SubscribeBatchSize = batch
	return wsql.NewSubscriber(db, wsql.SubscriberConfig{
		SchemaAdapter: schema,
		OffsetsAdapter: wsql.PostgreSQLQueueOffsetsAdapter{
			DeleteOnAck:               true,
			GenerateMessagesTableName: schema.GenerateMessagesTableName,
		},
		PollInterval: 20 * time.Millisecond,
	}, watermill.NopLogger{})
}

// drainWatermill drains with watermill-sql's queue schema and DeleteOnAck,
// taking batch rows per query, through db: its pgx adapter or
// database/sql (what its documentation shows). Its consumer decodes each
// payload into an order with unmarshal, or decodes nothing when unmarshal
// is nil. The clock stops when every message was acknowledged and the
// table is empty.
func drainWatermill(ctx context.Context, env *benchEnv, n int, db wsql.Beginner, batch int, unmarshal func([]byte, any) error, each bool) (time.Duration, error) {
	if err := watermillBacklog(env.watermill, topic, n, each); err != nil {
		return 0, err
	}
	sub, err := watermillSubscriber(db, batch)
	if err != nil {
		return 0, err
	}
	defer sub.Close()
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	var done atomic.Int64
	clock := startClock()
	ch, err := sub.Subscribe(rctx, topic)
	if err != nil {
		return 0, err
	}
	decoded := make(chan error, 1)
	go func() {
		for m := range ch {
			if unmarshal != nil {
				// What a handler that wants the typed message must do:
				// a new order for each message, as a codec's Decode
				// returns, which a handler may keep or pass on.
				o := new(order)
				if err := unmarshal(m.Payload, o); err != nil {
					select {
					case decoded <- err:
					default:
					}
				}
			}
			done.Add(1)
			m.Ack()
		}
	}()
	werr := waitFor(ctx, &done, n)
	select {
	case err := <-decoded:
		werr = errors.Join(werr, err)
	default:
	}
	if werr == nil {
		werr = waitTable(ctx, env, "SELECT NOT EXISTS (SELECT 1 FROM "+watermillSchema().GenerateMessagesTableName(topic)+") AND $1 > 0", n)
	}
	return clock.stop(), werr
}
