package outboxjs

import (
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// permanentCodes lists the JetStream API error codes with which a stream
// refuses a message for what the message is: its size, or a directive
// in its headers that cannot hold. Publishing the same message to the
// same stream again gets the same answer, so retrying only holds back
// the rows after it.
//
// Refusals about the stream rather than the message (another stream
// expected, a sealed or missing stream, storage or account limits, a
// leader election) are not listed: every row would meet them, and they
// end when the stream or the cluster is mended, as an outage does.
var permanentCodes = map[jetstream.ErrorCode]string{
	10003: "bad request",
	10054: "message size exceeds maximum allowed",
	10097: "header size exceeds maximum allowed",
	10070: "wrong last msg ID (Nats-Expected-Last-Msg-Id)",
	10071: "wrong last sequence (Nats-Expected-Last-Sequence, Nats-Expected-Last-Subject-Sequence)",
	10164: "wrong last sequence, on a replicated stream",
	10193: "missing sequence for expected last sequence per subject",
	10111: "rollup refused (Nats-Rollup)",
	10165: "invalid per-message TTL (Nats-TTL)",
	10166: "per-message TTL is disabled",
	10168: "message counters are disabled (Nats-Incr)",
	10169: "message counter increment is missing",
	10170: "message counter has a payload",
	10171: "message counter increment is invalid",
	10172: "message counter is broken",
	10174: "atomic publish is disabled (Nats-Batch-Id)",
	10175: "atomic publish sequence is missing",
	10176: "atomic publish batch is incomplete",
	10177: "atomic publish unsupported header",
	10179: "atomic publish batch ID is invalid",
	10199: "atomic publish batch is too large",
	10200: "atomic publish batch commit is invalid",
	10201: "atomic publish batch contains a duplicate message id",
	10185: "JetStream minimum API level required (Nats-Required-Api-Level)",
	10188: "message schedules are disabled (Nats-Schedule)",
	10189: "message schedule pattern is invalid",
	10190: "message schedule target is invalid",
	10191: "message schedule per-message TTL is invalid",
	10192: "message schedule rollup is invalid",
	10203: "message schedule source is invalid",
}

// permanent reports whether a publish failed in a way that
// publishing the same message again cannot mend: the client refuses it
// (a payload above the server's max_payload, a header NATS cannot
// carry), or the stream refuses it with an error code of
// [permanentCodes]. Every other failure is transient for the relay:
// timeouts, no responders (no stream for the subject), a connection
// that is down or closed, and refusals about the stream rather than the
// message.
func permanent(err error) bool {
	if errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadHeaderMsg) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		_, ok := permanentCodes[apiErr.ErrorCode]
		return ok
	}
	return false
}
