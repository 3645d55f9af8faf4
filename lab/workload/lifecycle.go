package workload

// The money's lifecycle after a payment: authorize, capture (all or
// part), partial refunds; the cancel of an authorization; the refund of a
// charge; a refund refused for more than was captured. Each operation is
// a command of its own (kind capture, cancel or refund, naming the
// payment's key), published once what it acts on has settled, and judged
// against the provider's ledger by CheckLifecycle.

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// The flows of a lifecycle workload, one of each per set.
const (
	FlowCaptureRefunds = "authorize, capture all, two partial refunds"
	FlowPartialCapture = "authorize, capture part, refund part, refund more than captured (refused)"
	FlowCancel         = "authorize, cancel"
	FlowChargeRefund   = "charge, refund all"
)

// Flows lists the flows in the order a set plans them.
var Flows = []string{FlowCaptureRefunds, FlowPartialCapture, FlowCancel, FlowChargeRefund}

// LifeOp is one operation of a flow on its payment.
type LifeOp struct {
	Cmd  payment.Command // kind, its own key, payment_key, amount (0: all, or the rest)
	Body []byte
	// Refusal is the reason its claim must refuse it with (it is never
	// sent); "" when it must succeed.
	Refusal string
	// Want is what a capture must receive, a refund give back; 0 for a
	// cancel and a refusal.
	Want int64
}

// Key is the operation's row key, "merchant_id:idempotency_key".
func (o LifeOp) Key() string { return o.Cmd.MerchantID + ":" + o.Cmd.IdempotencyKey }

// Flow is one payment's lifecycle: the payment (Root, an index into the
// phased workload's payments, made an authorize when Authorize), then its
// operations, each published once the one before it has settled.
type Flow struct {
	Name      string
	Root      int
	Merchant  string
	Key       string // the payment's idempotency key
	Amount    int64  // the payment's amount
	Authorize bool
	Ops       []LifeOp
}

// RootKey is the payment's row key, "merchant_id:idempotency_key".
func (f Flow) RootKey() string { return f.Merchant + ":" + f.Key }

// Ref is the payment's key.
func (f Flow) Ref() ledger.KeyRef {
	return ledger.KeyRef{MerchantID: f.Merchant, IdempotencyKey: f.Key}
}

// Canceled reports whether the flow ends with its authorization canceled:
// no money moves.
func (f Flow) Canceled() bool {
	return slices.ContainsFunc(f.Ops, func(o LifeOp) bool { return o.Cmd.Kind == payment.KindCancel })
}

// Captured is what the provider must hold as received for the payment
// at the end of the flow: its capture's amount, the charge's amount, 0
// for a canceled authorization.
func (f Flow) Captured() int64 {
	if !f.Authorize {
		return f.Amount
	}
	for _, o := range f.Ops {
		if o.Cmd.Kind == payment.KindCapture {
			return o.Want
		}
	}
	return 0
}

// PlanLifecycle makes sets of the flows out of ph's payments that are not
// declined, chosen with rng, turning the roots of the authorize flows into
// authorizes (ph.Payments is changed in place: its messages then carry
// kind authorize). It draws from rng after PlanPhased, so the phased
// workload of a seed is the one it was before lifecycles.
func PlanLifecycle(rng *rand.Rand, ph *Phased, sets int) []Flow {
	var flows []Flow
	next := 0
	order := rng.Perm(len(ph.Payments))
	for range sets {
		for _, name := range Flows {
			for next < len(order) && ph.Payments[order[next]].Cmd.PaymentMethod != "pm_card_visa" {
				next++
			}
			if next == len(order) {
				return flows
			}
			i := order[next]
			next++
			flows = append(flows, planFlow(name, i, &ph.Payments[i]))
		}
	}
	return flows
}

// planFlow makes flow name of payment i, made an authorize where the flow
// starts with one.
func planFlow(name string, i int, p *Command) Flow {
	c := &p.Cmd
	f := Flow{Name: name, Root: i, Merchant: c.MerchantID, Key: c.IdempotencyKey, Amount: c.Amount, Authorize: name != FlowChargeRefund}
	if f.Authorize {
		c.Kind = payment.KindAuthorize
		p.Body, _ = json.Marshal(c)
	}
	a := c.Amount
	op := func(kind string, amount int64, want int64, refusal string) {
		cmd := payment.Command{MerchantID: c.MerchantID, IdempotencyKey: fmt.Sprintf("%s-%s%d", c.IdempotencyKey, kind, len(f.Ops)+1),
			Kind: kind, PaymentKey: c.IdempotencyKey, Amount: amount}
		body, _ := json.Marshal(cmd)
		f.Ops = append(f.Ops, LifeOp{Cmd: cmd, Body: body, Want: want, Refusal: refusal})
	}
	switch name {
	case FlowCaptureRefunds:
		op(payment.KindCapture, 0, a, "")
		op(payment.KindRefund, a/4, a/4, "")
		op(payment.KindRefund, a/4, a/4, "")
	case FlowPartialCapture:
		// Half captured, a quarter refunded: a refund of the captured half
		// is more than what is left, though less than was authorized.
		op(payment.KindCapture, a/2, a/2, "")
		op(payment.KindRefund, a/4, a/4, "")
		op(payment.KindRefund, a/2, 0, ledger.RefuseOverRefundable)
	case FlowCancel:
		op(payment.KindCancel, 0, 0, "")
	case FlowChargeRefund:
		op(payment.KindRefund, 0, a, "")
	}
	return f
}

// OpMessage is the NATS message of op; dup names a duplicate's
// Nats-Msg-Id suffix ("": the original's id, which the stream's window
// drops when it is published again).
func OpMessage(cfg stream.Config, op LifeOp, dup string) *nats.Msg {
	msg := stream.CommandMsg(cfg, op.Cmd.MerchantID, op.Cmd.IdempotencyKey, op.Body)
	if dup != "" {
		msg.Header.Set(nats.MsgIdHdr, stream.MsgID(op.Cmd.MerchantID, op.Cmd.IdempotencyKey)+":"+dup)
	}
	return msg
}

// LifeRow is an operation's stored row as the verifier reads it: a
// capture's or a cancel's, a refund's. A claim that refuses writes none.
type LifeRow struct {
	Found    bool
	Status   string // ledger.OpSucceeded, ledger.RefundSucceeded, ...
	Amount   int64  // a refund's amount, what a capture received
	RefundID string
}

// ProviderRefund is one refund in the provider's ledger.
type ProviderRefund struct {
	ID     string
	Intent string // the refunded payment intent
	Key    string // "merchant_id:idempotency_key" of the refund, from its metadata
	Amount int64
	Status string // pending, succeeded, failed, canceled
}

// holds reports whether the refund took money back (or may yet).
func (r ProviderRefund) holds() bool { return r.Status == "pending" || r.Status == "succeeded" }

// LifeRoot is a flow's payment as the store and the provider have it.
type LifeRoot struct {
	Status   string // the ledger row's: succeeded, canceled, authorized, ...
	ChargeID string
	// Intent is the provider's status of ChargeID's intent, Received what
	// it received (its succeeded charge's amount; 0 when none).
	Intent   string
	Received int64
}

// LifeEvidence is what a run left of its flows.
type LifeEvidence struct {
	Roots   map[string]LifeRoot // by the payment's row key
	Ops     map[string]LifeRow  // by the operation's row key
	Letters map[string][]string // dead-letter reasons by row key
	Refunds []ProviderRefund    // every refund the provider made
}

// LifeTally is the judgement of a run's flows.
type LifeTally struct {
	Flows, Ops int
	// Outcomes counts the operations by kind (authorize included, for the
	// roots) and outcome: "succeeded", "refused over_refundable", ...
	Outcomes map[string]map[string]int
	// DoubleRefunds: refund keys the provider refunded more than once.
	DoubleRefunds []string
	// OverRefunded: payments whose refunds at the provider hold more than
	// it received.
	OverRefunded []string
	// Wrong: an operation whose outcome is not the plan's, or whose
	// stored outcome disagrees with the provider, with why.
	Wrong []string
}

// OK reports whether every flow ended as planned and as the provider has it.
func (t LifeTally) OK() bool {
	return len(t.DoubleRefunds) == 0 && len(t.OverRefunded) == 0 && len(t.Wrong) == 0
}

// CheckLifecycle judges flows against what the run left.
func CheckLifecycle(flows []Flow, ev LifeEvidence) LifeTally {
	t := LifeTally{Flows: len(flows), Outcomes: map[string]map[string]int{}}
	wrong := func(format string, args ...any) { t.Wrong = append(t.Wrong, fmt.Sprintf(format, args...)) }
	count := func(kind, outcome string) {
		if t.Outcomes[kind] == nil {
			t.Outcomes[kind] = map[string]int{}
		}
		t.Outcomes[kind][outcome]++
	}
	byKey := map[string][]ProviderRefund{}
	byIntent := map[string][]ProviderRefund{}
	for _, r := range ev.Refunds {
		byKey[r.Key] = append(byKey[r.Key], r)
		byIntent[r.Intent] = append(byIntent[r.Intent], r)
	}
	for key, rs := range byKey {
		if len(rs) > 1 {
			t.DoubleRefunds = append(t.DoubleRefunds, fmt.Sprintf("%s (refunded %d times)", key, len(rs)))
		}
	}
	planned := map[string]bool{}
	for _, f := range flows {
		root, ok := ev.Roots[f.RootKey()]
		wantStatus, wantIntent := ledger.PaymentSucceeded, "succeeded"
		if f.Canceled() {
			wantStatus, wantIntent = ledger.PaymentCanceled, "canceled"
		}
		if f.Authorize {
			count(payment.KindAuthorize, statusOr(root.Status, ok))
		}
		switch {
		case !ok:
			wrong("%s (%s): the payment has no ledger row", f.RootKey(), f.Name)
		case root.Status != wantStatus || root.Intent != wantIntent:
			wrong("%s (%s): the payment ended %s, its intent %q at the provider; want %s, %s", f.RootKey(), f.Name, root.Status, root.Intent, wantStatus, wantIntent)
		case root.Received != f.Captured():
			wrong("%s (%s): the provider received %d, want %d", f.RootKey(), f.Name, root.Received, f.Captured())
		}
		var held int64
		for _, r := range byIntent[root.ChargeID] {
			if root.ChargeID != "" && r.holds() {
				held += r.Amount
			}
		}
		if root.ChargeID != "" && held > root.Received {
			t.OverRefunded = append(t.OverRefunded, fmt.Sprintf("%s (refunds at the provider hold %d of the %d it received)", f.RootKey(), held, root.Received))
		}
		for _, op := range f.Ops {
			t.Ops++
			key, kind := op.Key(), op.Cmd.Kind
			planned[key] = true
			row, letters, sent := ev.Ops[key], ev.Letters[key], byKey[key]
			if op.Refusal != "" {
				refused := slices.Contains(letters, op.Refusal)
				switch {
				case refused:
					count(kind, "refused "+op.Refusal)
				case row.Found:
					count(kind, row.Status)
				default:
					count(kind, "no outcome")
				}
				if !refused || (row.Found && row.Status != ledger.RefundRefused) || len(sent) > 0 {
					wrong("%s (%s of %s): must be refused %s and never sent; dead letters %v, stored %q, %d refunds at the provider",
						key, kind, f.RootKey(), op.Refusal, letters, row.Status, len(sent))
				}
				continue
			}
			count(kind, statusOr(row.Status, row.Found))
			if len(letters) > 0 {
				wrong("%s (%s of %s): dead-lettered %v", key, kind, f.RootKey(), letters)
			}
			switch {
			case !row.Found || row.Status != ledger.OpSucceeded:
				wrong("%s (%s of %s): stored %q, want %s", key, kind, f.RootKey(), statusOr(row.Status, row.Found), ledger.OpSucceeded)
			case kind == payment.KindRefund:
				switch {
				case row.Amount != op.Want:
					wrong("%s (refund of %s): stored amount %d, want %d", key, f.RootKey(), row.Amount, op.Want)
				case len(sent) == 0:
					wrong("%s (refund of %s): stored succeeded, the provider has no refund under its key", key, f.RootKey())
				case sent[0].ID != row.RefundID || sent[0].Amount != row.Amount || sent[0].Status != row.Status || sent[0].Intent != root.ChargeID:
					wrong("%s (refund of %s): stored %s %d %s, the provider has %s %d %s of %s", key, f.RootKey(), row.RefundID, row.Amount, row.Status,
						sent[0].ID, sent[0].Amount, sent[0].Status, sent[0].Intent)
				}
			case kind == payment.KindCapture && (row.Amount != op.Want || row.Amount != root.Received):
				wrong("%s (capture of %s): stored received %d, want %d; the provider received %d", key, f.RootKey(), row.Amount, op.Want, root.Received)
			case kind == payment.KindCancel && root.Intent != "canceled":
				wrong("%s (cancel of %s): stored succeeded, the intent is %q at the provider", key, f.RootKey(), root.Intent)
			}
		}
	}
	for _, f := range flows {
		for _, r := range byIntent[ev.Roots[f.RootKey()].ChargeID] {
			if ev.Roots[f.RootKey()].ChargeID != "" && !planned[r.Key] {
				wrong("%s: refund %s under %q, which no operation of the flow made", f.RootKey(), r.ID, r.Key)
			}
		}
	}
	for _, s := range [][]string{t.DoubleRefunds, t.OverRefunded, t.Wrong} {
		slices.Sort(s)
	}
	return t
}

// statusOr is status, or "no row" when there is none.
func statusOr(status string, found bool) string {
	if !found {
		return "no row"
	}
	return status
}
