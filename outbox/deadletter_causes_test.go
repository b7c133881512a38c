package outbox

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// DeadLetterCauses groups the newest dead letters by queue, reason and
// their last error with numbers and ids written as "#", the largest
// groups first, each with its newest dead letter; it groups only the
// newest Sample rows, and one queue's when asked.
func TestDeadLetterCausesGroupsTheNewestDeadLettersByWhyTheyFailed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.exec(`INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason, last_error)
		SELECT r.id, r.queue, '\x00', 1, 1, now(), r.reason, r.err FROM (VALUES
			(1, 'orders', 'retry_exhausted', 'payments: order 4211 timed out after 30s'),
			(2, 'orders', 'retry_exhausted', 'payments: order 977 timed out after 12s'),
			(3, 'orders', 'rejected', 'unknown customer 3e5e3c72-54aa-7da4-b492-3eabf6783e01'),
			(4, 'orders', 'retry_exhausted', 'payments: order 12 timed out after 5s'),
			(5, 'invoices', 'decode_error', NULL),
			(6, 'orders', 'rejected', 'unknown customer 0b1c2d3e-0000-4000-8000-000000000001')) AS r(id, queue, reason, err)`)
	causes, sampled, err := e.ob.DeadLetterCauses(e.ctx, nil)
	if err != nil {
		t.Fatalf("DeadLetterCauses: %v", err)
	}
	ignore := cmpopts.IgnoreFields(DeadLetterCause{}, "NewestFailedAt")
	want := []DeadLetterCause{
		{Queue: "orders", Reason: "retry_exhausted", Cause: "payments: order # timed out after #s", Rows: 3, NewestID: 4,
			NewestError: "payments: order 12 timed out after 5s"},
		{Queue: "orders", Reason: "rejected", Cause: "unknown customer #", Rows: 2, NewestID: 6,
			NewestError: "unknown customer 0b1c2d3e-0000-4000-8000-000000000001"},
		{Queue: "invoices", Reason: "decode_error", Cause: "", Rows: 1, NewestID: 5},
	}
	if diff := cmp.Diff(want, causes, ignore); diff != "" || sampled != 6 {
		t.Errorf("DeadLetterCauses (-want +got):\n%s(sampled %d, want 6)", diff, sampled)
	}
	// The newest three rows only; one queue's only.
	causes, sampled, err = e.ob.DeadLetterCauses(e.ctx, &DeadLetterCauseOptions{Sample: 3})
	if err != nil || sampled != 3 || len(causes) != 3 || causes[0].Rows != 1 {
		t.Errorf("DeadLetterCauses of the newest 3 = %+v, %d, %v", causes, sampled, err)
	}
	causes, _, err = e.ob.DeadLetterCauses(e.ctx, &DeadLetterCauseOptions{Queue: "invoices", Limit: 5})
	if diff := cmp.Diff(want[2:], causes, ignore); diff != "" || err != nil {
		t.Errorf("DeadLetterCauses of invoices (-want +got):\n%s%v", diff, err)
	}
	// A search within the sample, case-insensitive.
	causes, sampled, err = e.ob.DeadLetterCauses(e.ctx, &DeadLetterCauseOptions{Contains: "UNKNOWN customer"})
	if diff := cmp.Diff(want[1:2], causes, ignore); diff != "" || err != nil || sampled != 6 {
		t.Errorf("DeadLetterCauses containing %q (-want +got):\n%s%v (sampled %d)", "UNKNOWN customer", diff, err, sampled)
	}
	for _, o := range []DeadLetterCauseOptions{{Sample: -1}, {Sample: DeadLetterCauseSampleMax + 1}, {Limit: DeadLetterCauseLimitMax + 1},
		{Contains: "a\x00b"}} {
		var ie *InputError
		if _, _, err := e.ob.DeadLetterCauses(e.ctx, &o); !errors.As(err, &ie) {
			t.Errorf("DeadLetterCauses(%+v) = %v; want an *InputError", o, err)
		}
	}
}

func TestACauseSelectsEveryDeadLetterOfItToListCountReplayAndPurge(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// Ten dead letters: six of one cause (two beyond a sample of the
	// newest four), four of another, in the same queue and reason.
	e.exec(`INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason, last_error)
		SELECT i, 'orders', '\x00', 1, 1, now(), 'retry_exhausted',
		       CASE WHEN i % 5 IN (1, 2) OR i IN (3, 10) THEN format('payments: order %s timed out after %ss', 4200 + i, i)
		            ELSE format('stock: sku %s missing', md5(i::text)) END
		FROM generate_series(1, 10) AS i`)
	causes, _, err := e.ob.DeadLetterCauses(e.ctx, &DeadLetterCauseOptions{Sample: 4})
	if err != nil || len(causes) == 0 {
		t.Fatalf("DeadLetterCauses = %+v, %v", causes, err)
	}
	var timedOut DeadLetterCause
	for _, c := range causes {
		if strings.HasPrefix(c.Cause, "payments:") {
			timedOut = c
		}
	}
	if timedOut.Cause != "payments: order # timed out after #s" {
		t.Fatalf("causes of the newest 4 = %+v; want the timeouts' among them", causes)
	}
	f := DeadLetterFilter{Queue: "orders", Reason: ReasonRetryExhausted, Cause: &timedOut.Cause}
	want := []int64{1, 2, 3, 6, 7, 10} // not only the sample's
	rows, err := e.ob.DeadLetters(e.ctx, f, 0, 100)
	if err != nil {
		t.Fatalf("DeadLetters: %v", err)
	}
	var got []int64
	for _, r := range rows {
		got = append(got, r.ID)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("DeadLetters of the cause (-want +got):\n%s", diff)
	}
	if n, err := e.ob.CountDeadLetters(e.ctx, f); n != 6 || err != nil {
		t.Errorf("CountDeadLetters of the cause = %d, %v; want 6", n, err)
	}
	dry, err := e.ob.ReplayDeadLetters(e.ctx, f, &ReplayOpts{DryRun: true})
	if err != nil || dry.Matched != 6 || dry.UpToID != 10 || dry.Replayed != 6 {
		t.Errorf("dry run of the cause's replay = %+v, %v; want 6 matched up to id 10", dry, err)
	}
	f.UpToID = &dry.UpToID
	res, err := e.ob.ReplayDeadLetters(e.ctx, f, nil)
	if err != nil || res.Replayed != 6 {
		t.Errorf("replay of the cause = %+v, %v; want 6 replayed", res, err)
	}
	if n := e.countWhere("queue = 'orders'"); n != 6 {
		t.Errorf("the outbox holds %d rows of orders after the replay; want the cause's 6", n)
	}
	// The other cause is left, and a purge by its cause takes it whole.
	left, err := e.ob.DeadLetters(e.ctx, DeadLetterFilter{}, 0, 100)
	if err != nil || len(left) != 4 {
		t.Fatalf("dead letters left = %d, %v; want the other cause's 4", len(left), err)
	}
	purged, err := e.ob.PurgeDeadLetters(e.ctx, DeadLetterFilter{Cause: new("stock: sku # missing")}, nil)
	if err != nil || purged.Deleted != 4 {
		t.Errorf("purge of the other cause = %+v, %v; want 4 deleted", purged, err)
	}
	// The empty cause is the dead letters without a last error.
	e.exec(`INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason)
		VALUES (11, 'orders', '\x00', 1, 1, now(), 'decode_error')`)
	if n, err := e.ob.CountDeadLetters(e.ctx, DeadLetterFilter{Cause: new("")}); n != 1 || err != nil {
		t.Errorf("CountDeadLetters of the empty cause = %d, %v; want the 1 without a last error", n, err)
	}
	var ie *InputError
	if _, err := e.ob.CountDeadLetters(e.ctx, DeadLetterFilter{Cause: new("a\x00b")}); !errors.As(err, &ie) || ie.Field != "DeadLetterFilter.Cause" {
		t.Errorf("CountDeadLetters with a NUL in the cause = %v; want an *InputError for DeadLetterFilter.Cause", err)
	}
}
