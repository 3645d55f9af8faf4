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
