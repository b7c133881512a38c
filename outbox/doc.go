// Package outbox is a transactional outbox for PostgreSQL.
//
// A service writes its business rows and an outbox row in one transaction;
// the outbox delivers every committed row to a handler at least once. This
// package holds the runtime: [Outbox] is one outbox table (and its
// dead-letter table) in one database.
//
// # Tables and names
//
// [New] takes a [Config] naming the schema and table (default public.outbox)
// and validates them once. From the table name it derives the names of the
// dead-letter table (<table>_dlq), indexes, constraints, the NOTIFY trigger
// and function, goose's version table (<table>_goose_version) and the
// NOTIFY channel ([Outbox.Channel]); all must fit PostgreSQL's 63-byte
// identifier limit, or New returns a *[ConfigError] naming the field and the
// rule. Names are quoted wherever they reach SQL.
//
// [Outbox.Migrate] applies the embedded goose migrations for that table.
// Several outboxes, in one schema or in many, can share a database: each
// has its own tables, channel and migration history.
//
// # Publishing
//
// A [Publisher] writes typed messages through the caller's transaction:
// the message exists if and only if the transaction commits.
//
//	pub, err := outbox.NewPublisher[OrderCreated](ob, "orders.created", nil)
//	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		// ... write the order with tx ...
//		_, err := pub.Publish(ctx, tx, OrderCreated{ID: id}, nil)
//		return err
//	})
//
// [Publisher.PublishBatch] writes many messages in one statement; options
// schedule messages ([PublishOpts].Delay, At), name them for cancellation
// ([PublishOpts].TimerID, [Outbox.CancelTimer]) and attach headers.
//
// # Subscribing
//
// A [Subscriber] delivers each committed message to a typed [Handler] at
// least once:
//
//	sub, err := outbox.NewSubscriber(ob, []string{"orders.created"},
//		func(ctx context.Context, m *outbox.Message[OrderCreated]) error {
//			return ship(ctx, m.Payload) // nil acks; an error retries
//		}, &outbox.SubscriberConfig[OrderCreated]{Workers: 16})
//	err = sub.Run(ctx) // until ctx is done, then a graceful drain
//
// A handler's error is retried by the [RetryStrategy] (by default
// exponential: 1 s doubling to 5 min, 10 attempts); [RetryAfter] picks the
// delay and [Reject] ends the delivery at once. Rows that end without
// success move to the dead-letter table <table>_dlq with their reason:
// max_deliveries, retry_exhausted, rejected or decode_error.
//
// An idle subscriber wakes within milliseconds of a commit through
// LISTEN/NOTIFY on a dedicated connection, and polls (with backoff) when
// that connection is down. Scheduled rows are claimed on time. Any number
// of subscribers, in one process or many, can serve the same queues.
//
// # Claiming and leases
//
// A row is available when its next_attempt_at has come and its lease is
// unset or expired. Claiming sets a fresh lease token on each row; every
// statement that deletes, retries or dead-letters a row is filtered by that
// token, so a handler whose lease was reclaimed can never overwrite the
// newer delivery's outcome. Claims use FOR UPDATE SKIP LOCKED, so any number
// of processes can claim from one table without a coordinator.
//
// While a handler runs, a heartbeat extends its lease; if the lease is lost
// anyway, the handler's context is cancelled with cause [ErrLeaseLost].
// When a subscriber stops, rows it claimed but never started are handed
// back at once, running handlers get the graceful timeout to finish, and a
// handler still running after that keeps its row's lease: the row is
// delivered again after the lease expires, never deleted unhandled.
//
// # Metrics
//
// A [MetricsRecorder] receives [MetricEvent]s: published, fetched,
// dispatched, acked, retried, dead_lettered, terminal, lease_lost and
// drain_timeout. Each outcome's event is emitted after its write landed.
package outbox
