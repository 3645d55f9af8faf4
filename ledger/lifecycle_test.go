package ledger_test

import (
	"testing"

	"github.com/paydedup/paydedup/ledger"
)

// TestLifeOf: the status and amounts a payment shows once what moved it
// after its outcome is applied, the rules the gateway's GET and the
// console share.
func TestLifeOf(t *testing.T) {
	t.Parallel()
	authorized := ledger.PaymentState{Status: ledger.StateAuthorized, Amount: 1000, AmountCapturable: 1000}
	charged := ledger.PaymentState{Status: ledger.StateSucceeded, Amount: 1000}
	n := func(v int64) *int64 { return &v }
	show := func(p *int64) any {
		if p == nil {
			return nil
		}
		return *p
	}
	for _, c := range []struct {
		name                           string
		st                             ledger.PaymentState
		l                              ledger.Lifecycle
		status                         string
		capturable, received, refunded *int64
	}{
		{"held", authorized, ledger.Lifecycle{LedgerStatus: "authorized"}, "authorized", n(1000), n(0), nil},
		{"captured for less", authorized, ledger.Lifecycle{LedgerStatus: ledger.PaymentSucceeded, AmountReceived: 800}, "succeeded", nil, n(800), n(0)},
		{"captured, part refunded", authorized, ledger.Lifecycle{LedgerStatus: ledger.PaymentSucceeded, AmountReceived: 800, AmountRefunded: 300},
			ledger.StatusPartiallyRefunded, nil, n(800), n(300)},
		{"captured, all of it refunded", authorized, ledger.Lifecycle{LedgerStatus: ledger.PaymentSucceeded, AmountReceived: 800, AmountRefunded: 800},
			ledger.StatusRefunded, nil, n(800), n(800)},
		{"canceled", authorized, ledger.Lifecycle{LedgerStatus: ledger.PaymentCanceled}, ledger.PaymentCanceled, nil, n(0), nil},
		{"charged", charged, ledger.Lifecycle{LedgerStatus: ledger.PaymentSucceeded}, "succeeded", nil, n(1000), n(0)},
		{"charged, part refunded", charged, ledger.Lifecycle{AmountRefunded: 1}, ledger.StatusPartiallyRefunded, nil, n(1000), n(1)},
		{"declined", ledger.PaymentState{Status: ledger.StateDeclined, Amount: 1000}, ledger.Lifecycle{}, "declined", nil, nil, nil},
	} {
		got := ledger.LifeOf(c.st, c.l)
		if got.Status != c.status || show(got.AmountCapturable) != show(c.capturable) || show(got.AmountReceived) != show(c.received) ||
			show(got.AmountRefunded) != show(c.refunded) {
			t.Errorf("%s: %s capturable %v received %v refunded %v, want %s %v %v %v", c.name, got.Status, show(got.AmountCapturable),
				show(got.AmountReceived), show(got.AmountRefunded), c.status, show(c.capturable), show(c.received), show(c.refunded))
		}
	}
}
