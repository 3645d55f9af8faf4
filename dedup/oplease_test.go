package dedup_test

import (
	"errors"
	"testing"
	"time"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// TestOperationLeaseFences: a refund's and a capture's lease are fenced
// alike. Once a worker's lease has run out and another holder has taken
// the operation over for a lookup, the first holder can neither record an
// answer nor give the operation back unknown; the new holder records it,
// and its retried commit (the first answer lost) is accepted as done, while
// a stale release of a finished operation still fails.
func TestOperationLeaseFences(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.chargedPayment(t, "m_1", "pay", 100)
	b.authorizedPayment(t, "m_1", "auth", 100)

	type op struct {
		name       string
		claim      func(holder string) (ledger.Outcome, *ledger.Lease)
		complete   func(l ledger.Lease) error
		release    func(l ledger.Lease) error
		status     func() string
		doneStatus string
	}
	ops := []op{{
		name: "refund",
		claim: func(holder string) (ledger.Outcome, *ledger.Lease) {
			c := b.claimRefund(t, holder, refundReq("m_1", "r-1", "pay", 100))
			return c.Outcome, c.Lease
		},
		complete: func(l ledger.Lease) error { return b.store.CompleteRefund(b.ctx, l, refunded("re_1")) },
		release:  func(l ledger.Lease) error { return b.store.ReleaseRefund(b.ctx, l, "timeout") },
		status: func() string {
			r, err := b.store.GetRefund(b.ctx, "m_1", "r-1")
			if err != nil {
				t.Fatal(err)
			}
			return r.Status + " " + r.LockedBy
		},
		doneStatus: ledger.RefundSucceeded,
	}, {
		name: "capture",
		claim: func(holder string) (ledger.Outcome, *ledger.Lease) {
			c := b.claimOp(t, holder, opReq(payment.KindCapture, "m_1", "c-1", "auth", 0))
			return c.Outcome, c.Lease
		},
		complete: func(l ledger.Lease) error { return b.store.CompletePaymentOp(b.ctx, l, captured(100)) },
		release:  func(l ledger.Lease) error { return b.store.ReleasePaymentOp(b.ctx, l, "timeout") },
		status: func() string {
			o, err := b.store.GetPaymentOp(b.ctx, "m_1", "c-1")
			if err != nil {
				t.Fatal(err)
			}
			return o.Status + " " + o.LockedBy
		},
		doneStatus: ledger.OpSucceeded,
	}}
	for _, o := range ops {
		outcome, dead := o.claim("dies")
		if outcome != ledger.Claimed || dead == nil {
			t.Fatalf("%s: first claim %v", o.name, outcome)
		}
		b.clock.Advance(lease + time.Second)
		outcome, next := o.claim("next")
		if outcome != ledger.NeedsLookup || next == nil || next.Holder != "next" {
			t.Fatalf("%s: claim after the lease ran out: %v %+v", o.name, outcome, next)
		}
		if err := o.release(*dead); !errors.Is(err, ledger.ErrLeaseLost) {
			t.Fatalf("%s: the first holder gave back an operation taken over: %v, want ErrLeaseLost", o.name, err)
		}
		if err := o.complete(*dead); !errors.Is(err, ledger.ErrLeaseLost) {
			t.Fatalf("%s: the first holder recorded an operation taken over: %v, want ErrLeaseLost", o.name, err)
		}
		if got, want := o.status(), "pending next"; got != want {
			t.Fatalf("%s: after the stale writes the row is %q, want %q", o.name, got, want)
		}
		if err := o.complete(*next); err != nil {
			t.Fatalf("%s: the new holder's completion: %v", o.name, err)
		}
		if err := o.complete(*next); err != nil {
			t.Fatalf("%s: the new holder's retried completion (first answer lost): %v", o.name, err)
		}
		if err := o.complete(*dead); !errors.Is(err, ledger.ErrLeaseLost) {
			t.Fatalf("%s: the old holder's completion of a finished operation: %v, want ErrLeaseLost", o.name, err)
		}
		if err := o.release(*next); !errors.Is(err, ledger.ErrLeaseLost) {
			t.Fatalf("%s: release of a finished operation: %v, want ErrLeaseLost", o.name, err)
		}
		if got, want := o.status(), o.doneStatus+" next"; got != want {
			t.Fatalf("%s: finished row %q, want %q", o.name, got, want)
		}
	}
}
