// Package outbox is a transactional outbox for PostgreSQL.
//
// A service writes its business rows and an outbox row in one transaction;
// the outbox delivers every committed row to a handler at least once. This
// package holds the runtime: [Outbox] is one outbox table (and its
// dead-letter table) in one database.
//
// It runs on PostgreSQL 14 or later (CI tests 14 to 18), as roles with
// only the privileges [Grants] lists, through PgBouncer in session or
// transaction mode, and under the server settings DBAs set; the README's
// "Where it runs" names the test that proves each.
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
// has its own tables, channel and migration history. The schema records
// its own version, so migrations applied by another tool (a repository's
// own goose running the files of `outboxgen migrations`) count as applied:
// Migrate then does nothing, and [Outbox.Check] tells a service at start
// whether the schema is missing or behind, naming the fix. Migrate can
// run beside the live service: each step waits at most
// [MigrateLockTimeout] for a lock before it is rolled back and retried,
// so publishers never queue long behind a step that waits for a long
// transaction, and the sessions holding the lock are logged.
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
// Messages with the same [PublishOpts].OrderingKey in one queue are handled
// one at a time, in the commit order of their transactions, by every
// subscriber in every process; the database enforces it for rows from any
// writer (see the README's per-key order and migration 5).
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
// A row published as one type is never silently decoded as another: the
// publisher records the message type in the row's message-type header
// ([HeaderMessageType]), and a subscriber of another type dead-letters the
// row with reason decode_error. The message type is the Go type's name
// without its package path ("OrderCreated"), so it survives moving the
// type to another package, and a service that decodes the message into a
// copy of the type with the same name reads the rows: types of one name
// are one contract. [MessageTyper] chooses another name, to keep two
// types of one name apart. Subscribers of []byte, and rows written without
// the header, accept any row.
//
// [NewTxSubscriber] runs a [TxHandler] in a transaction the subscriber
// begins and acknowledges the message in that transaction: the handler's
// writes, the messages it publishes through the transaction and the
// acknowledgement commit together, so its effects in the database happen
// once.
//
// A handler's error is retried by the [RetryStrategy] (by default
// exponential: 1 s doubling to 5 min, 10 attempts); [RetryAfter] picks the
// delay and [Reject] ends the delivery at once. Rows that end without
// success move to the dead-letter table <table>_dlq with their reason:
// max_deliveries, retry_exhausted, rejected or decode_error.
//
// An idle subscriber wakes within milliseconds of a commit through
// LISTEN/NOTIFY on a dedicated connection, which the running subscribers
// of one [Outbox] share, and polls (with backoff) when that connection is
// down. Writers notify only while a subscriber of the
// queue sleeps, so busy subscribers do not make publishers' commits wait
// for one another (docs/wakeups.md). Scheduled rows are claimed on time. Any number
// of subscribers, in one process or many, can serve the same queues.
//
// # Claiming, row locks and leases
//
// A row is available when its next_attempt_at has come and its lease is
// unset or expired. Claiming stamps the rows it takes with a fresh lease
// token (one per claim, so a row claimed again always gets another) and an
// expiry [SubscriberConfig].LeaseTTL ahead; the expiry is the holder's,
// stored on the row, so subscribers with different lease TTLs never take
// each other's live rows. Every statement that deletes, retries or
// dead-letters a row is filtered by its id and that token, so a handler
// whose lease was reclaimed can never overwrite the newer delivery's
// outcome. Claims use FOR UPDATE SKIP LOCKED, so any number of processes
// can claim from one table without a coordinator, and a subscriber of
// several queues shares each claim among them, so one queue's backlog does
// not hold back another's rows.
//
// By default a subscriber claims by row lock instead, which costs the
// database a fraction of a lease write: a claim locks its rows in a
// transaction of its own and writes nothing to them, and when their
// handlers have run, one statement in that transaction deletes the handled
// rows and it commits. A claim's writes land only in its own transaction,
// so a claim whose connection died writes nothing. Each claim is recorded
// before its handlers run: a claim that aborts (a crash, a dead
// connection) still counts towards MaxDeliveries, and its record holds its
// rows until LeaseTTL after the claim, as an unextended lease would; a
// stalled connection frees them after LeaseTTL too, when the server ends
// the idle transaction. A
// claim ends within [SubscriberConfig].LockWindow (1 s): rows whose
// handlers still run then get a written lease, and rows no worker started
// are given back. Each claim in flight holds a pool connection (at most
// two per subscriber); with a pool of fewer than four connections, or a
// negative LockWindow, every claim writes leases (docs/claims.md).
//
// While a handler runs, a heartbeat extends its lease; if the lease is lost
// anyway, the handler's context is cancelled with cause [ErrLeaseLost].
// A retried or released row wakes the listening subscribers when it is
// due, as a new row does.
//
// One bad outcome never holds back the others: error text is made storable
// (valid UTF-8, no NUL, at most 2,048 characters), a handler error whose
// Error method panics is described instead, and an outcome the database
// still refuses is given up alone, its row left to lease expiry.
//
// When a subscriber stops, rows it claimed but never started are handed
// back at once, and everything else is bounded by the graceful timeout:
// running handlers get until then to finish, and outcomes not written by
// then are given up. A row whose handler or outcome was given up keeps its
// lease: it is delivered again after the lease expires, never deleted
// unhandled. [Subscriber.Run] returns within GracefulTimeout plus
// [StopSlack] after its context ends, whatever the database does.
//
// # Metrics
//
// A [MetricsRecorder] receives [MetricEvent]s: published, fetched,
// dispatched, acked, retried, dead_lettered, terminal, lease_lost,
// write_refused and drain_timeout. Bursts of retries and dead letters are
// logged as one full line (with the handler's context) and a count per
// queue and outcome every ten seconds. Each outcome's event is emitted after its write landed.
package outbox
