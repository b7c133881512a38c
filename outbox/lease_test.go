package outbox

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxgen/outboxgen/db"
	"github.com/outboxgen/outboxgen/internal/lease"
)

// leased publishes n rows to queue q and claims them.
func (e *env) leased(n int) []claimed {
	e.t.Helper()
	for range n {
		e.publish("q")
	}
	rows := e.claim(int32(n), "q")
	if len(rows) != n {
		e.t.Fatalf("claimed %d rows, want %d", len(rows), n)
	}
	return rows
}

func TestDeleteWithLeaseNeedsTheToken(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.leased(1)[0]
	unleased := e.publish("other")

	for name, p := range map[string]db.DeleteWithLeaseParams{
		"wrong token":  {ID: r.ID, Token: newToken()},
		"unleased row": {ID: unleased, Token: token(t, r)},
	} {
		n, err := e.q.DeleteWithLease(e.ctx, p)
		if err != nil || n != 0 {
			t.Errorf("%s: deleted %d, err %v; want 0, nil", name, n, err)
		}
	}
	if _, ok := e.row(r.ID); !ok {
		t.Fatalf("row %d gone after deletes with the wrong token", r.ID)
	}
	n, err := e.q.DeleteWithLease(e.ctx, db.DeleteWithLeaseParams{ID: r.ID, Token: token(t, r)})
	if err != nil || n != 1 {
		t.Fatalf("delete with the token: %d, %v; want 1, nil", n, err)
	}
	if _, ok := e.row(r.ID); ok {
		t.Errorf("row %d still there", r.ID)
	}
	if _, ok := e.row(unleased); !ok {
		t.Errorf("unleased row %d deleted", unleased)
	}
}

func TestDeleteBatchReturnsOnlyDeletedIDs(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rows := e.leased(3)
	// Row 1 lost its lease to a newer claim.
	e.exec("UPDATE outbox SET acquired_token = gen_random_uuid() WHERE id = $1", rows[1].ID)

	got, err := e.q.DeleteBatchWithLease(e.ctx, db.DeleteBatchWithLeaseParams{
		Ids:    ids(rows),
		Tokens: []pgtype.UUID{token(t, rows[0]), token(t, rows[1]), token(t, rows[2])},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := lease.LeasesOf(got, func(r db.DeleteBatchWithLeaseRow) (int64, pgtype.UUID) { return r.ID, r.Token })
	if !sameLeases(done, leasesOfRows(rows[0], rows[2])) {
		t.Errorf("deleted %v, want the leases of rows %d and %d", done, rows[0].ID, rows[2].ID)
	}
	if _, ok := e.row(rows[1].ID); !ok {
		t.Errorf("row %d with a newer lease was deleted", rows[1].ID)
	}
}

func TestMarkPendingClearsLeaseAndSchedulesOnServerClock(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.leased(1)[0]

	n, err := e.q.MarkPendingWithLease(e.ctx, db.MarkPendingWithLeaseParams{ID: r.ID, Token: newToken(), DelaySeconds: 30})
	if err != nil || n != 0 {
		t.Fatalf("mark pending with a wrong token: %d, %v; want 0, nil", n, err)
	}

	before := e.serverNow()
	n, err = e.q.MarkPendingWithLease(e.ctx, db.MarkPendingWithLeaseParams{ID: r.ID, Token: token(t, r), DelaySeconds: 30})
	after := e.serverNow()
	if err != nil || n != 1 {
		t.Fatalf("mark pending: %d, %v; want 1, nil", n, err)
	}
	got, _ := e.row(r.ID)
	if got.AcquiredToken.Valid || got.AcquiredAt != nil {
		t.Errorf("lease not cleared: token %v at %v", got.AcquiredToken, got.AcquiredAt)
	}
	if got.AttemptsCount != 1 || got.DeliveriesCount != 1 {
		t.Errorf("attempts %d deliveries %d, want 1 and 1", got.AttemptsCount, got.DeliveriesCount)
	}
	lo, hi := before.Add(30*time.Second), after.Add(30*time.Second)
	if got.NextAttemptAt.Before(lo) || got.NextAttemptAt.After(hi) {
		t.Errorf("next_attempt_at %v not in [%v, %v]", got.NextAttemptAt, lo, hi)
	}
	if got.FirstAttemptAt == nil || got.LastAttemptAt == nil || !got.FirstAttemptAt.Equal(*got.LastAttemptAt) {
		t.Errorf("first/last attempt at = %v/%v, want equal and set", got.FirstAttemptAt, got.LastAttemptAt)
	}
	if rows := e.claim(1, "q"); len(rows) != 0 {
		t.Errorf("row claimable before its retry delay: %v", ids(rows))
	}
}

func TestMarkPendingBatch(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rows := e.leased(3)
	got, err := e.q.MarkPendingBatchWithLease(e.ctx, db.MarkPendingBatchWithLeaseParams{
		Ids:          ids(rows),
		Tokens:       []pgtype.UUID{token(t, rows[0]), newToken(), token(t, rows[2])},
		DelaySeconds: []float64{0, 0, 3600},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := lease.LeasesOf(got, func(r db.MarkPendingBatchWithLeaseRow) (int64, pgtype.UUID) { return r.ID, r.Token })
	if !sameLeases(done, leasesOfRows(rows[0], rows[2])) {
		t.Errorf("updated %v, want the leases of rows %d and %d", done, rows[0].ID, rows[2].ID)
	}
	// Row 0 is due again, row 1 still leased, row 2 scheduled an hour out.
	if diff := cmp.Diff([]int64{rows[0].ID}, ids(e.claim(10, "q"))); diff != "" {
		t.Errorf("claimable after batch retry (-want +got):\n%s", diff)
	}
	if r, _ := e.row(rows[1].ID); !r.AcquiredToken.Valid || r.AcquiredToken != token(t, rows[1]) {
		t.Errorf("row with the wrong token lost its lease: %v", r.AcquiredToken)
	}
}

func TestExtendLeases(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rows := e.leased(2)
	e.exec("UPDATE outbox SET lease_expires_at = now() + interval '10 seconds'")

	got, err := e.q.ExtendLeases(e.ctx, db.ExtendLeasesParams{
		Ids:             ids(rows),
		Tokens:          []pgtype.UUID{token(t, rows[0]), newToken()},
		LeaseTtlSeconds: 60,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := lease.LeasesOf(got, func(r db.ExtendLeasesRow) (int64, pgtype.UUID) { return r.ID, r.Token })
	if diff := cmp.Diff(leasesOfRows(rows[0]), done); diff != "" {
		t.Errorf("extended (-want +got):\n%s", diff)
	}
	// 15 s later by the lease's clock, only the unextended row has expired.
	e.exec("UPDATE outbox SET lease_expires_at = lease_expires_at - interval '15 seconds'")
	if diff := cmp.Diff([]int64{rows[1].ID}, ids(e.claim(10, "q"))); diff != "" {
		t.Errorf("reclaimed (-want +got):\n%s", diff)
	}
}

func TestDeadLetterWithLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.leased(1)[0]
	boom := "boom"

	n, err := e.q.DeadLetterWithLease(e.ctx, db.DeadLetterWithLeaseParams{
		ID: r.ID, Token: newToken(), Attempted: true, Reason: "rejected", LastError: &boom})
	if err != nil || n != 0 {
		t.Fatalf("dead-letter with a wrong token: %d, %v; want 0, nil", n, err)
	}
	if e.count("outbox_dlq") != 0 {
		t.Fatal("dead-letter with a wrong token wrote to the DLQ")
	}

	n, err = e.q.DeadLetterWithLease(e.ctx, db.DeadLetterWithLeaseParams{
		ID: r.ID, Token: token(t, r), Attempted: true, Reason: "retry_exhausted", LastError: &boom})
	if err != nil || n != 1 {
		t.Fatalf("dead-letter: %d, %v; want 1, nil", n, err)
	}
	if _, ok := e.row(r.ID); ok {
		t.Errorf("row %d still in the outbox", r.ID)
	}
	var got db.OutboxDlq
	if err := e.db.Pool.QueryRow(e.ctx, `SELECT id, queue, payload, headers, ordering_key, timer_id,
		deliveries_count, attempts_count, created_at, failed_at, failure_reason, last_error FROM outbox_dlq`).Scan(
		&got.ID, &got.Queue, &got.Payload, &got.Headers, &got.OrderingKey, &got.TimerID,
		&got.DeliveriesCount, &got.AttemptsCount, &got.CreatedAt, &got.FailedAt, &got.FailureReason, &got.LastError); err != nil {
		t.Fatal(err)
	}
	want := db.OutboxDlq{ID: r.ID, Queue: "q", Payload: r.Payload, DeliveriesCount: 1, AttemptsCount: 1,
		CreatedAt: r.CreatedAt, FailedAt: got.FailedAt, FailureReason: "retry_exhausted", LastError: &boom}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("DLQ row (-want +got):\n%s", diff)
	}
}

func TestDeadLetterCapsLastError(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.leased(1)[0]
	long := ""
	for range 3000 {
		long += "é" // two bytes each
	}
	if _, err := e.q.DeadLetterWithLease(e.ctx, db.DeadLetterWithLeaseParams{
		ID: r.ID, Token: token(t, r), Reason: "max_deliveries", LastError: &long}); err != nil {
		t.Fatal(err)
	}
	var chars, attempts int
	if err := e.db.Pool.QueryRow(e.ctx, "SELECT length(last_error), attempts_count FROM outbox_dlq").Scan(&chars, &attempts); err != nil {
		t.Fatal(err)
	}
	if chars != 2048 || attempts != 0 {
		t.Errorf("last_error %d chars, attempts %d; want 2048 and 0 (handler never ran)", chars, attempts)
	}
}

func TestDeadLetterIsAtomic(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.leased(1)[0]
	// A DLQ row with the same id makes the insert half of the statement fail.
	e.exec(`INSERT INTO outbox_dlq (id, queue, payload, deliveries_count, attempts_count, created_at, failure_reason)
		VALUES ($1, 'q', '\x00', 1, 1, now(), 'rejected')`, r.ID)

	_, err := e.q.DeadLetterWithLease(e.ctx, db.DeadLetterWithLeaseParams{
		ID: r.ID, Token: token(t, r), Attempted: true, Reason: "rejected"})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("dead-letter onto a taken DLQ id: err %v, want unique_violation", err)
	}
	got, ok := e.row(r.ID)
	if !ok {
		t.Fatalf("row %d deleted although its DLQ insert failed", r.ID)
	}
	if !got.AcquiredToken.Valid || got.AcquiredToken != token(t, r) {
		t.Errorf("row lease = %v, want still %v", got.AcquiredToken, token(t, r))
	}
}

func TestDeadLetterRejectsUnknownReason(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.leased(1)[0]
	_, err := e.q.DeadLetterWithLease(e.ctx, db.DeadLetterWithLeaseParams{ID: r.ID, Token: token(t, r), Reason: "oops"})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.ConstraintName != "outbox_dlq_reason_chk" {
		t.Fatalf("err %v, want a violation of outbox_dlq_reason_chk", err)
	}
	if _, ok := e.row(r.ID); !ok {
		t.Errorf("row %d lost", r.ID)
	}
}
