package workload

import (
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// TestPlanLifecycle: the flows are rooted in payments that are not
// declined, the authorize flows' payments are published as authorizes,
// every operation decodes as the worker reads it, names its payment and
// asks what the flow says; the phased workload of a seed is unchanged but
// for those kinds.
func TestPlanLifecycle(t *testing.T) {
	t.Parallel()
	cfg := PhasedConfig{Payments: 200, Duplicates: 0.4, Declines: 0.05, Prefix: "demo-x"}
	before := PlanPhased(rand.New(rand.NewPCG(7, 0x5eed)), cfg)
	rng := rand.New(rand.NewPCG(7, 0x5eed))
	ph := PlanPhased(rng, cfg)
	flows := PlanLifecycle(rng, &ph, 2)
	if len(flows) != 2*len(Flows) {
		t.Fatalf("%d flows, want %d", len(flows), 2*len(Flows))
	}
	sc := stream.Config{SubjectPrefix: "payments.requests"}
	roots := map[int]bool{}
	for _, f := range flows {
		if roots[f.Root] {
			t.Fatalf("payment %d roots two flows", f.Root)
		}
		roots[f.Root] = true
		p := ph.Payments[f.Root]
		if p.Cmd.PaymentMethod != "pm_card_visa" || f.RootKey() != p.Cmd.MerchantID+":"+p.Cmd.IdempotencyKey {
			t.Fatalf("%s roots in %+v", f.Name, p.Cmd)
		}
		msg := ph.Message(sc, Planned{Kind: KindOriginal, I: f.Root})
		c, err := payment.Decode(msg.Data, payment.Envelope{SubjectMerchant: p.Cmd.MerchantID}, payment.Limits{})
		if err != nil || (c.KindOf() == payment.KindAuthorize) != f.Authorize {
			t.Fatalf("%s: its payment decodes as %+v (%v)", f.Name, c, err)
		}
		for _, op := range f.Ops {
			for _, dup := range []string{"", "retry"} {
				m := OpMessage(sc, op, dup)
				c, err := payment.Decode(m.Data, payment.Envelope{SubjectMerchant: p.Cmd.MerchantID, HeaderKey: m.Header.Get(HeaderKey), HeaderKeySet: true}, payment.Limits{})
				if err != nil || c.Kind != op.Cmd.Kind || c.PaymentKey != f.Key || c.Amount != op.Cmd.Amount {
					t.Fatalf("%s: %s decodes as %+v (%v)", f.Name, m.Data, c, err)
				}
			}
		}
		if f.Name == FlowPartialCapture && (f.Ops[2].Refusal != ledger.RefuseOverRefundable || f.Ops[2].Cmd.Amount <= f.Captured()-f.Ops[1].Want) {
			t.Fatalf("%s: the last refund, %d of %d captured less %d refunded, is not one the ledger refuses", f.Name, f.Ops[2].Cmd.Amount, f.Captured(), f.Ops[1].Want)
		}
		ph.Payments[f.Root] = before.Payments[f.Root]
	}
	if !reflect.DeepEqual(before, ph) {
		t.Error("the lifecycle changed the phased workload beyond its roots' kinds")
	}
}

// TestCheckLifecycleRefusedButSent: a refund the ledger must refuse that
// was sent all the same is caught even where the provider's sum stays
// within what was captured.
func TestCheckLifecycleRefusedButSent(t *testing.T) {
	t.Parallel()
	f := planFlow(FlowPartialCapture, 0, &Command{Cmd: payment.Command{MerchantID: "m", IdempotencyKey: "k", Amount: 1000, Currency: "usd", PaymentMethod: "pm_card_visa"}})
	ev := LifeEvidence{
		Roots: map[string]LifeRoot{"m:k": {Status: ledger.PaymentSucceeded, ChargeID: "pi_1", Intent: "succeeded", Received: 500}},
		Ops: map[string]LifeRow{f.Ops[0].Key(): {Found: true, Status: "succeeded", Amount: 500},
			f.Ops[1].Key(): {Found: true, Status: "succeeded", Amount: 250, RefundID: "re_1"}},
		Letters: map[string][]string{f.Ops[2].Key(): {ledger.RefuseOverRefundable}},
		Refunds: []ProviderRefund{{ID: "re_1", Intent: "pi_1", Key: f.Ops[1].Key(), Amount: 250, Status: "succeeded"}},
	}
	if tally := CheckLifecycle([]Flow{f}, ev); !tally.OK() {
		t.Fatalf("clean flow: %+v", tally)
	}
	ev.Refunds = append(ev.Refunds, ProviderRefund{ID: "re_2", Intent: "pi_1", Key: f.Ops[2].Key(), Amount: 1, Status: "failed"})
	if tally := CheckLifecycle([]Flow{f}, ev); len(tally.Wrong) != 1 || len(tally.OverRefunded) != 0 {
		t.Errorf("refused refund sent (and failed): %+v", tally)
	}
}
