package demo

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/lab/workload"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// TestDemoVerdictOnDoubleCharge gives the demo's judge a ledger with a
// charged payment charged twice: it is a double charge, not "charged
// once", and the run fails.
func TestDemoVerdictOnDoubleCharge(t *testing.T) {
	t.Parallel()
	pay := func(key, method string) demoPayment {
		return demoPayment{ref: ledger.KeyRef{MerchantID: "m_demo", IdempotencyKey: key},
			cmd: payment.Command{MerchantID: "m_demo", IdempotencyKey: key, Amount: 100, Currency: "usd", PaymentMethod: method}}
	}
	payments := []demoPayment{pay("a", "pm_card_visa"), pay("b", "pm_card_visa"), pay("c", "pm_card_chargeDeclined")}
	byRef := map[ledger.KeyRef]ledger.Record{}
	for _, p := range payments {
		rec := ledger.Record{MerchantID: "m_demo", IdempotencyKey: p.ref.IdempotencyKey, Status: ledger.StatusCompleted, ResponseStatus: 200, ChargeID: "pi_" + p.ref.IdempotencyKey}
		if p.cmd.PaymentMethod == "pm_card_chargeDeclined" {
			rec.ResponseStatus, rec.ChargeID = 402, ""
		}
		byRef[p.ref] = rec
	}
	judge := func(charges map[string]int) *demoReport {
		rep := &demoReport{byReason: map[string]int{}}
		rep.judge(payments, charges, byRef, map[ledger.KeyRef]string{})
		return rep
	}

	clean := judge(map[string]int{"m_demo:a": 1, "m_demo:b": 1})
	if clean.double != 0 || clean.chargedOnce != 2 || clean.declined != 1 || clean.lost != 0 || clean.disagree != 0 {
		t.Fatalf("clean run judged %+v", clean)
	}
	if err := clean.verdict(true, time.Minute); err != nil {
		t.Fatalf("clean verdict: %v", err)
	}

	rep := judge(map[string]int{"m_demo:a": 1, "m_demo:b": 2})
	if rep.double != 1 || rep.chargedOnce != 1 || len(rep.doubleKeys) != 1 || !strings.HasPrefix(rep.doubleKeys[0], "m_demo:b ") {
		t.Errorf("b charged twice: %d double %q, %d charged once; want 1 double (m_demo:b), 1 charged once", rep.double, rep.doubleKeys, rep.chargedOnce)
	}
	if err := rep.verdict(true, time.Minute); err == nil || !strings.Contains(err.Error(), "1 double charges") {
		t.Errorf("verdict with a double charge: %v", err)
	}
	if err := clean.verdict(false, time.Minute); err == nil {
		t.Error("verdict of a run that did not settle: nil")
	}
}

// cleanLifecycle is what a clean run leaves of flows: every operation
// stored as planned, the provider's ledger agreeing, refusals dead-lettered.
func cleanLifecycle(flows []workload.Flow) workload.LifeEvidence {
	ev := workload.LifeEvidence{Roots: map[string]workload.LifeRoot{}, Ops: map[string]workload.LifeRow{}, Letters: map[string][]string{}}
	for _, f := range flows {
		root := workload.LifeRoot{Status: ledger.PaymentSucceeded, ChargeID: "pi_" + f.Key, Intent: "succeeded", Received: f.Captured()}
		if f.Canceled() {
			root.Status, root.Intent = ledger.PaymentCanceled, "canceled"
		}
		ev.Roots[f.RootKey()] = root
		for j, op := range f.Ops {
			switch {
			case op.Refusal != "":
				ev.Letters[op.Key()] = []string{op.Refusal, op.Refusal}
			case op.Cmd.Kind == payment.KindRefund:
				id := fmt.Sprintf("re_%s_%d", f.Key, j)
				ev.Ops[op.Key()] = workload.LifeRow{Found: true, Status: ledger.RefundSucceeded, Amount: op.Want, RefundID: id}
				ev.Refunds = append(ev.Refunds, workload.ProviderRefund{ID: id, Intent: root.ChargeID, Key: op.Key(), Amount: op.Want, Status: "succeeded"})
			default:
				ev.Ops[op.Key()] = workload.LifeRow{Found: true, Status: ledger.OpSucceeded, Amount: op.Want}
			}
		}
	}
	return ev
}

// TestDemoVerdictOnRefunds gives the demo's lifecycle proof a run whose
// provider refunded a refund twice, and one that refunded past what was
// captured (the refused refund sent after all): each is caught, and the
// run fails.
func TestDemoVerdictOnRefunds(t *testing.T) {
	t.Parallel()
	ph := workload.PlanPhased(rand.New(rand.NewPCG(1, 2)), workload.PhasedConfig{Payments: 40, Duplicates: 0.2, Declines: 0.1, Prefix: "demo-t"})
	flows := workload.PlanLifecycle(rand.New(rand.NewPCG(3, 4)), &ph, 2)
	if len(flows) != 2*len(workload.Flows) {
		t.Fatalf("%d flows, want %d", len(flows), 2*len(workload.Flows))
	}
	judge := func(ev workload.LifeEvidence) *demoReport {
		rep := &demoReport{byReason: map[string]int{}}
		rep.judgeLifecycle(flows, ev)
		return rep
	}
	clean := judge(cleanLifecycle(flows))
	if err := clean.verdict(true, time.Minute); err != nil || !clean.life.OK() {
		t.Fatalf("clean lifecycle: %v %+v", err, clean.life)
	}
	if got := clean.life.Outcomes[payment.KindRefund]["refused "+ledger.RefuseOverRefundable]; got != 2 {
		t.Errorf("clean lifecycle: %d refunds refused over_refundable, want 2 (%v)", got, clean.life.Outcomes)
	}

	var captureRefunds, partial workload.Flow
	for _, f := range flows {
		switch f.Name {
		case workload.FlowCaptureRefunds:
			captureRefunds = f
		case workload.FlowPartialCapture:
			partial = f
		}
	}

	// The provider refunded the first partial refund twice (two refunds
	// under its key), which also takes more than was captured back.
	ev := cleanLifecycle(flows)
	again := ev.Refunds[slices.IndexFunc(ev.Refunds, func(r workload.ProviderRefund) bool { return r.Key == captureRefunds.Ops[1].Key() })]
	again.ID += "_again"
	ev.Refunds = append(ev.Refunds, again)
	rep := judge(ev)
	if len(rep.life.DoubleRefunds) != 1 || !strings.HasPrefix(rep.life.DoubleRefunds[0], captureRefunds.Ops[1].Key()+" ") {
		t.Errorf("a refund made twice: double refunds %q", rep.life.DoubleRefunds)
	}
	if err := rep.verdict(true, time.Minute); err == nil || !strings.Contains(err.Error(), "1 refunds made twice") {
		t.Errorf("verdict with a double refund: %v", err)
	}

	// The refund the ledger must refuse was sent after all: the payment's
	// refunds at the provider now hold more than it captured.
	ev = cleanLifecycle(flows)
	over := partial.Ops[2]
	ev.Refunds = append(ev.Refunds, workload.ProviderRefund{ID: "re_over", Intent: "pi_" + partial.Key, Key: over.Key(), Amount: over.Cmd.Amount, Status: "succeeded"})
	rep = judge(ev)
	if len(rep.life.OverRefunded) != 1 || !strings.HasPrefix(rep.life.OverRefunded[0], partial.RootKey()+" ") {
		t.Errorf("an over-refund: over-refunded %q", rep.life.OverRefunded)
	}
	if len(rep.life.Wrong) == 0 {
		t.Error("a refund refused by the ledger but made at the provider is not reported")
	}
	if err := rep.verdict(true, time.Minute); err == nil || !strings.Contains(err.Error(), "1 payments refunded past what was captured") {
		t.Errorf("verdict with an over-refund: %v", err)
	}

	// The stored outcome of a capture disagrees with what the provider
	// received.
	ev = cleanLifecycle(flows)
	row := ev.Ops[partial.Ops[0].Key()]
	row.Amount++
	ev.Ops[partial.Ops[0].Key()] = row
	if rep := judge(ev); len(rep.life.Wrong) != 1 || rep.verdict(true, time.Minute) == nil {
		t.Errorf("a capture stored with another amount than received: %q", rep.life.Wrong)
	}
}
