package pgstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/internal/pg"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
)

// TestOperatorLetterIsNotFinal: a dead letter that waits for an operator
// is recorded on the intake apart from the final ones (the intake does
// not become dead-lettered, so nothing that treats it as final changes),
// and the payment waits for an operator only until a worker claims the
// key again. A key with a final dead letter, or without an intake row
// (published straight on the queue), is left alone.
func TestOperatorLetterIsNotFinal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := req("m_1", "op", 500)
	res, err := acquireOne(b.ctx, b.store, r, lease, time.Hour)
	if err != nil || res.Outcome != ledger.IntakeAcquired {
		t.Fatalf("acquire: %+v %v", res, err)
	}
	if err := b.store.IntakePublished(b.ctx, res.Intake, 7, time.Minute); err != nil {
		t.Fatal(err)
	}
	cl := b.claim(t, "w1", r)
	if cl.Lease == nil {
		t.Fatalf("claim: %+v", cl)
	}
	if _, err := b.worker.Fail(b.ctx, *cl.Lease, "rejected"); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(time.Second)
	ok, err := b.store.MarkIntakeForOperator(b.ctx, "m_1", "op", "provider_rejected", strings.Repeat("e", 2000))
	if !ok || err != nil {
		t.Fatalf("mark for an operator: %v %v", ok, err)
	}
	in, err := b.store.GetIntake(b.ctx, "m_1", "op")
	if err != nil {
		t.Fatal(err)
	}
	rec, err := b.worker.Get(b.ctx, "m_1", "op")
	if err != nil {
		t.Fatal(err)
	}
	if in.DeadLettered() || in.OperatorReason != "provider_rejected" || len(in.OperatorError) != 1024 ||
		!in.OperatorAt.Equal(b.clock.Now()) || !in.WaitsForOperator(&rec) || !in.WaitsForOperator(nil) {
		t.Fatalf("intake %+v (record %+v): want waiting for an operator, not dead-lettered", in, rec)
	}
	// Held within its republish hold, a retry meets the row as it is.
	if res, err := acquireOne(b.ctx, b.store, r, lease, time.Hour); err != nil || res.Outcome != ledger.IntakeHeld || res.Intake.OperatorReason == "" {
		t.Fatalf("acquire while waiting: %+v %v", res, err)
	}

	// The operator replays it: a worker claims the key again, and the
	// record's state shows again.
	b.clock.Advance(time.Second)
	if cl := b.claim(t, "w2", r); cl.Lease == nil {
		t.Fatalf("claim after the replay: %+v", cl)
	}
	if rec, err = b.worker.Get(b.ctx, "m_1", "op"); err != nil || in.WaitsForOperator(&rec) {
		t.Fatalf("record %+v %v claimed after the letter: still waiting for an operator", rec, err)
	}
	completed := rec
	completed.Status, completed.UpdatedAt = ledger.StatusCompleted, in.OperatorAt
	if in.WaitsForOperator(&completed) {
		t.Fatal("a completed record waits for an operator")
	}

	// A final dead letter stays final; no intake row, nothing marked.
	if _, err := acquireOne(b.ctx, b.store, req("m_1", "dead", 500), lease, time.Hour); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.store.MarkIntakeDeadLettered(b.ctx, "m_1", "dead", 9, "amount_over_limit", "x"); !ok || err != nil {
		t.Fatalf("final dead letter: %v %v", ok, err)
	}
	if ok, err := b.store.MarkIntakeForOperator(b.ctx, "m_1", "dead", "max_deliveries", "x"); ok || err != nil {
		t.Fatalf("a final dead letter was marked for an operator: %v %v", ok, err)
	}
	if in, _ := b.store.GetIntake(b.ctx, "m_1", "dead"); in.WaitsForOperator(nil) || !in.DeadLettered() {
		t.Fatalf("intake %+v", in)
	}
	if ok, err := b.store.MarkIntakeForOperator(b.ctx, "m_1", "queue-only", "max_deliveries", "x"); ok || err != nil {
		t.Fatalf("a key without an intake row was marked: %v %v", ok, err)
	}
}

// TestWorkerRoleMarksIntakeForOperator: paydedup_worker may record a
// letter that waits for an operator (migration 00017's column grants).
func TestWorkerRoleMarksIntakeForOperator(t *testing.T) {
	t.Parallel()
	ownerURL := testenv.PostgresURL(t)
	ctx := context.Background()
	owner, err := pg.Connect(ctx, ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	ownerStore, err := pgstore.New(owner, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acquireOne(ctx, ownerStore, req("m_1", "op", 500), lease, time.Hour); err != nil {
		t.Fatal(err)
	}
	worker, err := pgstore.New(testenv.AsRole(t, ownerURL, workerRole), pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := worker.MarkIntakeForOperator(ctx, "m_1", "op", "max_deliveries", "x"); !ok || err != nil {
		t.Fatalf("mark for an operator as %s: %v %v", workerRole, ok, err)
	}
}
