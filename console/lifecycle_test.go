package console_test

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/console"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// authorize records an authorized payment of amount under key.
func (w *world) authorize(key string, amount int64) {
	w.t.Helper()
	c := &payment.Command{MerchantID: "m_1", IdempotencyKey: key, Amount: amount, Currency: "usd", PaymentMethod: "pm_card_visa", Kind: payment.KindAuthorize}
	res, err := w.store.Claim(w.ctx, "w", time.Minute, ledger.NewClaimRequest(c))
	if err != nil || res.Lease == nil {
		w.t.Fatalf("claim %s: %v %+v", key, err, res)
	}
	if err := w.store.Complete(w.ctx, *res.Lease, ledger.Completion{ChargeID: "pi_" + key, Authorized: true, ResponseStatus: 200,
		Response: json.RawMessage(`{"status":"requires_capture"}`)}); err != nil {
		w.t.Fatal(err)
	}
}

// capture records a capture of pay that received amount.
func (w *world) capture(key, pay string, amount int64) {
	w.t.Helper()
	req := ledger.NewPaymentOpRequest(&payment.Command{MerchantID: "m_1", IdempotencyKey: key, PaymentKey: pay, Amount: amount, Kind: payment.KindCapture})
	res, err := w.store.ClaimPaymentOp(w.ctx, "w", time.Minute, req)
	if err != nil || res.Lease == nil {
		w.t.Fatalf("claim capture %s: %v %+v", key, err, res)
	}
	if err := w.store.CompletePaymentOp(w.ctx, *res.Lease, ledger.PaymentOpCompletion{Status: ledger.OpSucceeded, AmountReceived: amount,
		ResponseStatus: 200, Response: json.RawMessage(`{"status":"succeeded"}`)}); err != nil {
		w.t.Fatal(err)
	}
}

// refund records a refund of pay, succeeded or refused for reason.
func (w *world) refund(key, pay string, amount int64, status, reason string) {
	w.t.Helper()
	req := ledger.NewRefundRequest(&payment.Command{MerchantID: "m_1", IdempotencyKey: key, PaymentKey: pay, Amount: amount, Kind: payment.KindRefund})
	res, err := w.store.ClaimRefund(w.ctx, "w", time.Minute, req)
	if err != nil || res.Lease == nil {
		w.t.Fatalf("claim refund %s: %v %+v", key, err, res)
	}
	c := ledger.RefundCompletion{Status: status, RefundID: "re_" + key, ResponseStatus: 200, Response: json.RawMessage(`{"status":"succeeded"}`)}
	if status == ledger.RefundRefused {
		c = ledger.RefundCompletion{Status: status, Reason: reason, ResponseStatus: 400, Response: json.RawMessage(`{"error":"no"}`)}
	}
	if err := w.store.CompleteRefund(w.ctx, *res.Lease, c); err != nil {
		w.t.Fatal(err)
	}
}

// TestPaymentPageShowsItsLifecycle: a payment authorized, captured for
// less, then partly refunded shows on its page what the HTTP API's GET
// shows (partially_refunded, amount received and refunded), with its
// capture and its refunds by their own keys; an authorization not yet
// captured shows what can be captured. A refusal's reason carrying a card
// number reaches the page masked.
func TestPaymentPageShowsItsLifecycle(t *testing.T) {
	t.Parallel()
	w := setup(t, console.Config{})
	w.authorize("order-auth", 1000)
	w.capture("cap-1", "order-auth", 800)
	w.refund("ref-1", "order-auth", 300, ledger.RefundSucceeded, "")
	w.refund("ref-2", "order-auth", 100, ledger.RefundRefused, "card 4242424242424242 disputed")
	w.authorize("order-held", 500)

	r := w.get("/payment?merchant=m_1&key=order-auth")
	for _, re := range []string{`id="life-status">partially_refunded<`, `id="amount-received">800<`, `id="amount-refunded">300<`,
		`<tr class="op"><td>capture</td><td>cap-1</td><td>800 usd</td><td>800</td><td>succeeded</td>`,
		`<tr class="refund"><td>ref-1</td><td>300 usd</td><td>succeeded</td>`,
		`<tr class="refund"><td>ref-2</td><td>100 usd</td><td>refused</td><td>card \[card number redacted\] disputed</td>`,
		`Refunds \(2\)`} {
		if !regexp.MustCompile(re).MatchString(r.body) {
			t.Errorf("the page of an authorized, captured, partly refunded payment does not match %q:\n%s", re, r.body)
		}
	}
	if strings.Contains(r.body, "4242424242424242") || strings.Contains(r.body, "amount-capturable") {
		t.Errorf("the page shows a card number, or a captured payment's capturable amount:\n%s", r.body)
	}
	r = w.get("/payment?merchant=m_1&key=order-held")
	for _, s := range []string{`id="life-status">authorized<`, `id="amount-capturable">500<`, `id="amount-received">0<`} {
		if !strings.Contains(r.body, s) {
			t.Errorf("the page of an authorization does not show %q:\n%s", s, r.body)
		}
	}

	// The overview counts the rows by kind.
	o := w.get("/")
	for _, re := range []string{`id="kind-capture"><td>capture</td><td>pending 0, unknown 0, succeeded 1, refused 0</td>`,
		`id="kind-refund"><td>refund</td><td>pending 0, unknown 0, processing 0, succeeded 1, failed 0, refused 1</td>`,
		`id="kind-authorize"><td>authorize</td><td>pending 0, completed 2, failed 0</td>`} {
		if !regexp.MustCompile(re).MatchString(o.body) {
			t.Errorf("the overview does not match %q:\n%s", re, o.body)
		}
	}
}

// TestDeadLettersByKind: a refund's dead letter shows its kind and the
// payment it acts on (a link to its page), on the overview and on its
// own page, and the overview filters the letters by kind.
func TestDeadLettersByKind(t *testing.T) {
	t.Parallel()
	w := setup(t, console.Config{})
	refundSeq := w.fileLetter(stream.ReasonMaxDeliveries, "m_1", "ref-9", []byte(`{"merchant_id":"m_1","idempotency_key":"ref-9","kind":"refund","payment_key":"order-9","amount":5}`), nil)
	chargeSeq := w.fileLetter(stream.ReasonMaxDeliveries, "m_1", "order-10", nil, nil)

	o := w.get("/")
	row := regexp.MustCompile(`(?s)<tr id="letter-` + itoa(refundSeq) + `">.*?</tr>`).FindString(o.body)
	if !strings.Contains(row, `<td class="kind">refund of <a href="/payment?merchant=m_1&amp;key=order-9">order-9</a></td>`) {
		t.Errorf("the overview's row of a refund's letter does not show its kind and payment:\n%s", row)
	}
	if !strings.Contains(o.body, `id="letter-`+itoa(chargeSeq)+`"`) || !regexp.MustCompile(`By kind: <a href="/\?kind=charge#dead-letters">charge</a> 1, <a href="/\?kind=refund#dead-letters">refund</a> 1`).MatchString(o.body) {
		t.Errorf("the overview does not list both letters, or count them by kind:\n%s", o.body)
	}
	f := w.get("/?kind=refund")
	if !strings.Contains(f.body, `id="letter-`+itoa(refundSeq)+`"`) || strings.Contains(f.body, `id="letter-`+itoa(chargeSeq)+`"`) {
		t.Errorf("the overview filtered by kind refund does not show the refund's letter only:\n%s", f.body)
	}
	if bad := w.get("/?kind=bogus"); bad.status != 400 {
		t.Errorf("an unknown kind: status %d", bad.status)
	}
	l := w.get("/letters/" + itoa(refundSeq))
	for _, s := range []string{`id="letter-kind">refund<`, `id="letter-payment"><a href="/payment?merchant=m_1&amp;key=order-9">order-9</a>`} {
		if !strings.Contains(l.body, s) {
			t.Errorf("the refund's letter page does not show %q:\n%s", s, l.body)
		}
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
