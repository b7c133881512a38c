// Package outboxjs relays the rows of outbox queues into NATS JetStream,
// each row stored in the stream once.
//
// A [Relay] is an [outbox.Subscriber] of raw payloads whose handler
// publishes each row to a subject and returns only when the broker has
// acknowledged the message, so the row is deleted from the outbox only
// after the stream holds it. Every message carries a Nats-Msg-Id made of
// the outbox's schema and table, the row's id and its creation time
// ([MsgID]): a row that is published again (its relay died after the
// publish, or the broker's ack was lost) has the same id, and JetStream
// drops the second copy as long as it arrives within the stream's
// duplicate window (StreamConfig.Duplicates, two minutes by default).
//
// [Relay.Run] first checks that window: it finds the streams that capture
// the relay's subjects and refuses to start, with a [*WindowError], when
// a row could be published again later than a stream remembers its
// message ids ([Relay.Redelivery] says how late). Set
// [Config.WarnOnly] to run anyway with a logged warning.
//
// A failed publish is retried by the subscriber's retry strategy, with
// no cap on attempts by default, unless the same message cannot be
// published again: a message the stream refuses for what it is (larger
// than its MaxMsgSize, say) ends in the outbox's dead-letter table at
// once, and its key's later rows are relayed ([Relay] lists the cases).
// [DefaultHeader] drops a row's headers named Nats-*, which JetStream
// would obey as directives (Nats-Rollup, Nats-Expected-Last-Sequence,
// ...): the only ones a message carries are the relay's own.
//
// Rows with the same ordering key are handed to the handler one at a
// time, in commit order, and the handler holds a row until its publish is
// acknowledged, so a key's messages enter the stream in the order their
// rows were committed. Rows of different keys, and rows without a key,
// are published in parallel, up to SubscriberConfig.Workers at once, each
// publish asynchronous with its acknowledgement awaited.
//
//	nc, err := nats.Connect(nats.DefaultURL)
//	if err != nil {
//		return err
//	}
//	relay, err := outboxjs.NewRelay(ob, nc, []string{"orders.created"}, &outboxjs.Config{
//		// Queue orders.created -> subject events.orders.created.
//		Subject:  func(m *outbox.Message[[]byte]) (string, error) { return "events." + m.Queue, nil },
//		Subjects: []string{"events.>"}, // what the stream check looks up
//	})
//	if err != nil {
//		return err
//	}
//	return relay.Run(ctx) // checks the streams' duplicate windows, then relays until ctx ends
//
// docs/relay.md in the repository explains what is and is not exactly
// once, and what happens when a relay is killed.
//
// It is a module of its own, so that the outbox package does not depend
// on the NATS client.
package outboxjs
