package outboxjs

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Only failures that publishing the same message again cannot mend are
// permanent; everything about the stream, the cluster or the connection
// is retried.
func TestPermanentClassifiesPublishErrors(t *testing.T) {
	t.Parallel()
	api := func(code int, errCode jetstream.ErrorCode, desc string) error {
		return &jetstream.APIError{Code: code, ErrorCode: errCode, Description: desc}
	}
	cases := []struct {
		name string
		err  error
		want bool
	}{
		// The client refuses the message.
		{"above max_payload", nats.ErrMaxPayload, true},
		{"a header NATS cannot carry", nats.ErrBadHeaderMsg, true},
		// The stream refuses the message for what it is.
		{"above the stream's MaxMsgSize", api(400, 10054, "message size exceeds maximum allowed"), true},
		{"the client's sentinel of MaxMsgSize", jetstream.ErrStreamMessageExceedsMaximum, true},
		{"headers above the limit", api(400, 10097, "header size exceeds maximum allowed of 64k"), true},
		{"wrong last sequence", api(400, 10071, "wrong last sequence: 3"), true},
		{"wrong last sequence, replicated", api(400, 10164, "wrong last sequence"), true},
		{"wrong last msg id", api(400, 10070, "wrong last msg ID: a"), true},
		{"missing sequence per subject", api(400, 10193, "missing sequence for expected last sequence per subject"), true},
		{"rollup not permitted", api(500, 10111, "rollup not permitted"), true},
		{"invalid TTL", api(400, 10165, "invalid per-message TTL"), true},
		{"TTL disabled", api(400, 10166, "per-message TTL is disabled"), true},
		{"counters disabled", api(400, 10168, "message counters is disabled"), true},
		{"atomic publish disabled", api(400, 10174, "atomic publish is disabled"), true},
		{"schedules disabled", api(400, 10188, "message schedules is disabled"), true},
		{"API level required", api(412, 10185, "JetStream minimum api level required"), true},
		{"bad request", api(400, 10003, "bad request"), true},
		{"wrapped", fmt.Errorf("outboxjs: publish x to y: %w", api(400, 10054, "message size exceeds maximum allowed")), true},
		// The stream, the cluster or the connection fails.
		{"no ack in time", jetstream.ErrAsyncPublishTimeout, false},
		{"no stream for the subject", jetstream.ErrNoStreamResponse, false},
		{"no responders", nats.ErrNoResponders, false},
		{"request timeout", nats.ErrTimeout, false},
		{"connection closed", nats.ErrConnectionClosed, false},
		{"reconnecting", nats.ErrConnectionReconnecting, false},
		{"too many publishes stalled", jetstream.ErrTooManyStalledMsgs, false},
		{"an ack that is no ack", jetstream.ErrInvalidJSAck, false},
		{"context deadline", context.DeadlineExceeded, false},
		{"another stream expected", api(400, 10060, "expected stream does not match"), false},
		{"stream not found", api(404, 10059, "stream not found"), false},
		{"sealed stream", api(400, 10109, "invalid operation on sealed stream"), false},
		{"store failed (DiscardNew at MaxMsgs)", api(503, 10077, "maximum messages exceeded"), false},
		{"insufficient resources", api(503, 10023, "insufficient resources"), false},
		{"storage resources exceeded", api(500, 10047, "insufficient storage resources available"), false},
		{"account resources exceeded", api(400, 10002, "resource limits exceeded for account"), false},
		{"cluster unavailable", api(503, 10008, "JetStream system temporarily unavailable"), false},
		{"no leader", api(500, 10009, "JetStream cluster can not handle request"), false},
		{"stream offline", api(500, 10118, "stream is offline"), false},
		{"duplicate in process", api(409, 10158, "duplicate message id is in process"), false},
		{"expected sequence not ready", api(503, 10163, "expected last sequence per subject temporarily unavailable"), false},
		{"too many requests", api(429, 10167, "too many requests"), false},
		{"a code this package does not know", api(400, 19999, "something new"), false},
	}
	want := map[string]bool{}
	got := map[string]bool{}
	for _, tc := range cases {
		want[tc.name] = tc.want
		got[tc.name] = permanent(tc.err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("permanent (-want +got):\n%s", diff)
	}
}
