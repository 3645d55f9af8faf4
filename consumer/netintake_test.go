package consumer_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// TestMaxDeliveriesNetMarksIntakeForOperator: a command the gateway
// published runs out of deliveries with no worker filing its dead letter
// (its worker died on every delivery). The net files the max_deliveries
// letter and records on the gateway's intake that the payment waits for an
// operator, as a worker does for the letters it files; without that the
// gateway answers "queued" for a payment nobody will process.
func TestMaxDeliveriesNetMarksIntakeForOperator(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := e.cfg
	cfg.Stream.MaxDeliver, cfg.Stream.AckWait = 2, 500*time.Millisecond
	_, cons, err := stream.EnsureStreams(e.ctx, e.js, cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	intake, err := pgstore.New(e.pool, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: "net-orphan", Amount: 100, Currency: "usd", PaymentMethod: "pm_card_visa"}
	acqs, err := intake.AcquireIntakes(e.ctx, []ledger.ClaimRequest{ledger.NewClaimRequest(cmd)}, 30*time.Second, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	acq := acqs[0]
	if acq.Outcome != ledger.IntakeAcquired {
		t.Fatalf("acquire intake: %+v", acq)
	}
	data, err := stream.EncodeCommand(cmd)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := e.js.PublishMsg(e.ctx, stream.CommandMsg(cfg.Stream, cmd.MerchantID, cmd.IdempotencyKey, data))
	if err != nil {
		t.Fatal(err)
	}
	if err := intake.IntakePublished(e.ctx, acq.Intake, ack.Sequence, time.Minute); err != nil {
		t.Fatal(err)
	}
	runNet(t, e, cfg, intake)

	// A worker that dies on every delivery: fetch, never settle, and keep
	// pulling so the server gives up on the message.
	var deliveries atomic.Int32
	e.eventually("the net filed the dead letter", func() bool {
		if b, err := cons.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond)); err == nil {
			for range b.Messages() {
				deliveries.Add(1)
			}
		}
		return len(e.deadLetters()) == 1
	})
	if p, err := stream.ParseDeadLetter(e.deadLetters()[0].Header); err != nil || p.Reason != stream.ReasonMaxDeliveries {
		t.Fatalf("dead letter %+v %v, want max_deliveries", p, err)
	}
	var in ledger.Intake
	e.eventually("the intake waits for an operator", func() bool {
		in, err = intake.GetIntake(e.ctx, cmd.MerchantID, cmd.IdempotencyKey)
		return err == nil && in.OperatorReason != ""
	})
	if in.OperatorReason != stream.ReasonMaxDeliveries || in.DeadLettered() || !in.WaitsForOperator(nil) {
		t.Fatalf("intake %+v: want waiting for an operator (max_deliveries), not final", in)
	}
	if deliveries.Load() != 2 {
		t.Fatalf("%d deliveries, want 2", deliveries.Load())
	}
}

// TestMaxDeliveriesNetMarksOperationForOperator: a refund the door took
// (its intake row: no currency, the command's fingerprint) runs out of
// deliveries with no worker filing its letter. The net files it
// max_deliveries and marks the door's intake of that very refund waiting
// for an operator, with the reason, as a worker does for an operation's
// letter (operationLetter); without that GET /v1/refunds/{key} answers
// "queued" for a refund no worker will process. Its waiting_for_operator
// event is written, as for a charge.
func TestMaxDeliveriesNetMarksOperationForOperator(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := e.cfg
	cfg.Stream.MaxDeliver, cfg.Stream.AckWait = 2, 500*time.Millisecond
	_, cons, err := stream.EnsureStreams(e.ctx, e.js, cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	intake, err := pgstore.New(e.pool, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: "net-refund", Kind: payment.KindRefund, PaymentKey: "order-1", Amount: 10}
	acqs, err := intake.AcquireIntakes(e.ctx, []ledger.ClaimRequest{ledger.NewClaimRequest(cmd)}, 30*time.Second, time.Hour)
	if err != nil || acqs[0].Outcome != ledger.IntakeAcquired {
		t.Fatalf("acquire intake: %+v %v", acqs, err)
	}
	data, err := stream.EncodeCommand(cmd)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := e.js.PublishMsg(e.ctx, stream.CommandMsg(cfg.Stream, cmd.MerchantID, cmd.IdempotencyKey, data))
	if err != nil {
		t.Fatal(err)
	}
	if err := intake.IntakePublished(e.ctx, acqs[0].Intake, ack.Sequence, time.Minute); err != nil {
		t.Fatal(err)
	}
	runNet(t, e, cfg, intake)

	e.eventually("the net filed the dead letter", func() bool {
		if b, err := cons.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond)); err == nil {
			for range b.Messages() {
			}
		}
		return len(e.deadLetters()) == 1
	})
	if p, err := stream.ParseDeadLetter(e.deadLetters()[0].Header); err != nil || p.Reason != stream.ReasonMaxDeliveries {
		t.Fatalf("dead letter %+v %v, want max_deliveries", p, err)
	}
	var in ledger.Intake
	deadline := time.Now().Add(5 * time.Second)
	for {
		in, err = intake.GetIntake(e.ctx, cmd.MerchantID, cmd.IdempotencyKey)
		if err == nil && in.OperatorReason != "" || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || in.OperatorReason != stream.ReasonMaxDeliveries || in.OperatorError == "" || in.DeadLettered() || !in.WaitsForOperator(nil) {
		t.Fatalf("the refund's intake: operator_reason=%q operator_error=%q dead_letter=%q (%v); want waiting for an operator (max_deliveries), with the cause, not final",
			in.OperatorReason, in.OperatorError, in.DeadLetterReason, err)
	}
	if n := e.count(`SELECT count(*) FROM outcome_events WHERE idempotency_key = 'net-refund' AND kind = 'waiting_for_operator' AND reason = $1`, stream.ReasonMaxDeliveries); n != 1 {
		t.Fatalf("%d waiting_for_operator events of the refund, want 1", n)
	}
}
