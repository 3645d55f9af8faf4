package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/gateway/pgstore"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// gatewayCharge is the gateway's intake of a charge under key: acquired,
// and published at a sequence unless its PubAck was lost (published
// false: the command may be in the stream and may be charged).
func (e *env) gatewayCharge(key string, published bool) *pgstore.Store {
	e.t.Helper()
	return e.gatewayIntake(&payment.Command{MerchantID: "m_1", IdempotencyKey: key, Amount: 100, Currency: "usd", PaymentMethod: "pm_card_visa"}, published)
}

// gatewayIntake is gatewayCharge for any command the door takes (a
// charge, or a refund, capture or cancel).
func (e *env) gatewayIntake(cmd *payment.Command, published bool) *pgstore.Store {
	e.t.Helper()
	intake, err := pgstore.New(e.pool, pgstore.Config{})
	if err != nil {
		e.t.Fatal(err)
	}
	acqs, err := intake.AcquireIntakes(e.ctx, []ledger.ClaimRequest{ledger.NewClaimRequest(cmd)}, 30*time.Second, time.Hour)
	if err != nil || acqs[0].Outcome != ledger.IntakeAcquired {
		e.t.Fatalf("acquire intake: %+v %v", acqs, err)
	}
	if published {
		if err := intake.IntakePublished(e.ctx, acqs[0].Intake, 999999, time.Minute); err != nil {
			e.t.Fatal(err)
		}
	}
	cfg := e.cfg
	cfg.Holder = "w1"
	w, err := consumer.NewWorker(e.nc, consumer.NewProcessor(e.store, e.stripe, cfg, nil), cfg, nil, nil, intake)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	e.t.Cleanup(func() { cancel(); <-done })
	e.waitStreams()
	return intake
}

// TestRefundLetterLeavesTheGatewaysChargeAlone: the gateway's intake
// holds the charges it took; a refund is never one of them, whatever its
// key. A refund refused by the ledger's rules (waiting for nobody) or for
// bad input (final) under the key of a charge the gateway took must not
// mark that charge: the gateway would answer it waiting for an operator,
// or final and never charged while the charge may still be made (a client
// paying again under a new key would pay twice).
func TestRefundLetterLeavesTheGatewaysChargeAlone(t *testing.T) {
	t.Parallel()
	t.Run("refused by the ledger", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		intake := e.gatewayCharge("order-42", true)
		e.publish("m_1", refundBody("m_1", "order-42", "no-such-payment", 10), "", nil)
		if d := e.deadLetterOf("order-42"); d.Reason != ledger.RefuseNoPayment {
			t.Fatalf("refund letter %+v", d)
		}
		e.quiescent()
		time.Sleep(time.Second) // the intake is marked after the term
		if in, err := intake.GetIntake(e.ctx, "m_1", "order-42"); err != nil || in.OperatorReason != "" || in.DeadLettered() {
			t.Fatalf("the gateway's charge marked by a refund's letter: operator_reason=%q dead_letter=%q (%v)", in.OperatorReason, in.DeadLetterReason, err)
		}
	})
	t.Run("bad input, the charge's publish unknown", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		intake := e.gatewayCharge("order-43", false)
		bad := []byte(`{"merchant_id":"m_1","idempotency_key":"order-43","kind":"refund","payment_key":"order-1","currency":"USD"}`)
		e.publish("m_1", bad, "", map[string]string{"Idempotency-Key": "order-43"})
		e.eventually("refund letter filed", func() bool { return len(e.deadLetters()) == 1 })
		e.quiescent()
		time.Sleep(time.Second) // the intake is marked after the term
		if in, err := intake.GetIntake(e.ctx, "m_1", "order-43"); err != nil || in.DeadLettered() || in.OperatorReason != "" {
			t.Fatalf("the gateway's charge (publish unknown) made final by a refund's letter: dead_letter=%q operator=%q (%v)", in.DeadLetterReason, in.OperatorReason, err)
		}
	})
}

// TestOperationLetterMarksOnlyItsOwnIntake: the letter of a refund the
// ledger's rules refuse marks the door's intake of that very refund
// (final: a retry is answered the refusal, never judged again), and no
// other: not a refund's of another amount under the key (the door took
// that one; a refund published straight on the queue reused its key).
func TestOperationLetterMarksOnlyItsOwnIntake(t *testing.T) {
	t.Parallel()
	t.Run("its own", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		intake := e.gatewayIntake(&payment.Command{MerchantID: "m_1", IdempotencyKey: "ref-1", Kind: payment.KindRefund, PaymentKey: "no-such-payment", Amount: 10}, false)
		e.publish("m_1", refundBody("m_1", "ref-1", "no-such-payment", 10), "", nil)
		e.eventually("the refund's intake marked", func() bool {
			in, err := intake.GetIntake(e.ctx, "m_1", "ref-1")
			return err == nil && in.DeadLetterReason == ledger.RefuseNoPayment
		})
	})
	t.Run("another refund's", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		intake := e.gatewayIntake(&payment.Command{MerchantID: "m_1", IdempotencyKey: "ref-2", Kind: payment.KindRefund, PaymentKey: "no-such-payment", Amount: 10}, false)
		e.publish("m_1", refundBody("m_1", "ref-2", "no-such-payment", 20), "", nil)
		if d := e.deadLetterOf("ref-2"); d.Reason != ledger.RefuseNoPayment {
			t.Fatalf("refund letter %+v", d)
		}
		e.quiescent()
		time.Sleep(time.Second) // the intake is marked after the term
		if in, err := intake.GetIntake(e.ctx, "m_1", "ref-2"); err != nil || in.DeadLettered() || in.OperatorReason != "" {
			t.Fatalf("the door's refund marked by another refund's letter: dead_letter=%q operator=%q (%v)", in.DeadLetterReason, in.OperatorReason, err)
		}
	})
}
