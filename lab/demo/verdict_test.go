package demo

import (
	"strings"
	"testing"
	"time"

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
