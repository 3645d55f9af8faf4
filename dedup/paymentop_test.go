package dedup_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// authorizedPayment records an authorized payment of amount under key.
func (b *bundle) authorizedPayment(t *testing.T, merchant, key string, amount int64) {
	t.Helper()
	l := b.claim(t, "w", authorizeReq(merchant, key, amount)).Lease
	if err := b.store.Complete(b.ctx, *l, authorized("pi_"+key, amount)); err != nil {
		t.Fatal(err)
	}
}

// opReq is a capture (amount 0: all of it) or a cancel of payment pay.
func opReq(kind, merchant, key, pay string, amount int64) ledger.PaymentOpRequest {
	return ledger.NewPaymentOpRequest(&payment.Command{MerchantID: merchant, IdempotencyKey: key, PaymentKey: pay, Amount: amount, Kind: kind})
}

func (b *bundle) claimOp(t *testing.T, holder string, r ledger.PaymentOpRequest) ledger.PaymentOpClaim {
	t.Helper()
	res, err := b.store.ClaimPaymentOp(b.ctx, holder, lease, r)
	if err != nil {
		t.Fatalf("claim %s %s: %v", r.Kind, r.IdempotencyKey, err)
	}
	return res
}

func captured(received int64) ledger.PaymentOpCompletion {
	return ledger.PaymentOpCompletion{Status: ledger.OpSucceeded, AmountReceived: received, ResponseStatus: 200,
		Response: json.RawMessage(fmt.Sprintf(`{"status":"succeeded","amount_received":%d}`, received))}
}

func canceled() ledger.PaymentOpCompletion {
	return ledger.PaymentOpCompletion{Status: ledger.OpSucceeded, ResponseStatus: 200, Response: json.RawMessage(`{"status":"canceled"}`)}
}

// opEvents are the seq-3 events, as "id kind status amount reason".
func (b *bundle) opEvents(t *testing.T) []string {
	var got []string
	for _, e := range b.events(t) {
		if e.Seq == 3 {
			got = append(got, fmt.Sprintf("%s %s %s %d %s", e.EventID, e.Kind, e.Status, e.Amount, e.Reason))
		}
	}
	return got
}

// TestCaptureClaimRules: a capture is claimed only of an authorized
// payment of the same merchant and currency, for at most what was
// authorized, and only once: a second capture under another key, or a
// cancel, is refused while the first holds (claimed, unknown or done); a
// refused claim writes nothing. A capture whose outcome may have happened
// is re-acquired for a lookup under the same provider key. Its completion
// moves the payment to succeeded with what was received, writes the
// captured event, and refunds are then bounded by what was captured.
func TestCaptureClaimRules(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.authorizedPayment(t, "m_1", "auth", 100)
	b.chargedPayment(t, "m_1", "pay", 100)

	refused := func(what string, r ledger.PaymentOpRequest, reason string) {
		t.Helper()
		if got := b.claimOp(t, "w", r); got.Outcome != ledger.Refused || got.Reason != reason || got.Lease != nil {
			t.Fatalf("%s: %v %q, want refused %q", what, got.Outcome, got.Reason, reason)
		}
	}
	refused("unknown payment", opReq(payment.KindCapture, "m_1", "c-x", "nope", 10), ledger.RefuseNoPayment)
	refused("another merchant's payment", opReq(payment.KindCapture, "m_2", "c-x", "auth", 10), ledger.RefuseNoPayment)
	refused("a charged payment", opReq(payment.KindCapture, "m_1", "c-x", "pay", 10), ledger.RefuseNotAuthorized)
	refused("a cancel of a charged payment", opReq(payment.KindCancel, "m_1", "v-x", "pay", 0), ledger.RefuseNotAuthorized)
	refused("more than authorized", opReq(payment.KindCapture, "m_1", "c-x", "auth", 101), ledger.RefuseOverCapturable)
	cur := opReq(payment.KindCapture, "m_1", "c-x", "auth", 10)
	cur.Currency = "eur"
	cur.RequestHash = ledger.Fingerprint(&payment.Command{MerchantID: "m_1", IdempotencyKey: "c-x", PaymentKey: "auth", Amount: 10,
		Currency: "eur", Kind: payment.KindCapture})
	refused("other currency", cur, ledger.RefuseCurrency)
	if n := b.count(t, `SELECT count(*) FROM payment_ops`); n != 0 {
		t.Fatalf("%d rows after refusals, want none", n)
	}

	first := b.claimOp(t, "w", opReq(payment.KindCapture, "m_1", "c-1", "auth", 60))
	if first.Outcome != ledger.Claimed || first.Capturable != 100 || first.Op.Amount != 60 || first.Op.ChargeID != "pi_auth" ||
		!strings.HasPrefix(first.Lease.ProviderKey, "pdc_") || first.Lease.ProviderKey != ledger.PaymentOpProviderKey(payment.KindCapture, "m_1", "c-1") {
		t.Fatalf("first capture: %+v", first)
	}
	refused("a second capture", opReq(payment.KindCapture, "m_1", "c-2", "auth", 40), ledger.RefuseAlreadyCaptured)
	refused("a cancel after a capture", opReq(payment.KindCancel, "m_1", "v-1", "auth", 0), ledger.RefuseCaptured)
	if got := b.claimOp(t, "w2", opReq(payment.KindCapture, "m_1", "c-1", "auth", 60)); got.Outcome != ledger.InFlight {
		t.Fatalf("same capture in flight: %v", got.Outcome)
	}
	if got := b.claimOp(t, "w2", opReq(payment.KindCapture, "m_1", "c-1", "auth", 61)); got.Outcome != ledger.Mismatch {
		t.Fatalf("same key, other amount: %v", got.Outcome)
	}
	// Its answer is lost: unknown, still holding the payment.
	if err := b.store.ReleasePaymentOp(b.ctx, *first.Lease, "timeout"); err != nil {
		t.Fatal(err)
	}
	refused("a cancel after a capture of unknown outcome", opReq(payment.KindCancel, "m_1", "v-1", "auth", 0), ledger.RefuseCaptured)
	again := b.claimOp(t, "w2", opReq(payment.KindCapture, "m_1", "c-1", "auth", 60))
	if again.Outcome != ledger.NeedsLookup || again.Lease.Attempt != 2 || again.Lease.ProviderKey != first.Lease.ProviderKey {
		t.Fatalf("re-claim of an unknown capture: %+v, want a lookup under the same provider key", again)
	}
	if err := b.store.CompletePaymentOp(b.ctx, *first.Lease, captured(60)); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Fatalf("stale completion: %v, want lease lost", err)
	}
	if err := b.store.CompletePaymentOp(b.ctx, *again.Lease, captured(60)); err != nil {
		t.Fatal(err)
	}
	if err := b.store.CompletePaymentOp(b.ctx, *again.Lease, captured(60)); err != nil {
		t.Fatalf("completion retried: %v", err)
	}
	if got := b.claimOp(t, "w", opReq(payment.KindCapture, "m_1", "c-1", "auth", 60)); got.Outcome != ledger.Duplicate || got.Op.AmountReceived != 60 {
		t.Fatalf("capture replayed: %+v", got)
	}
	pay, err := b.store.GetPayment(b.ctx, "m_1", "auth")
	if err != nil || pay.Status != ledger.PaymentSucceeded || pay.SettledAt.IsZero() {
		t.Fatalf("captured payment %+v %v, want succeeded", pay, err)
	}
	refused("a capture of a captured payment", opReq(payment.KindCapture, "m_1", "c-3", "auth", 0), ledger.RefuseAlreadyCaptured)

	// Refunds of the captured payment: at most the 60 captured.
	if got := b.claimRefund(t, "w", refundReq("m_1", "r-1", "auth", 61)); got.Outcome != ledger.Refused || got.Reason != ledger.RefuseOverRefundable {
		t.Fatalf("refund over the captured 60: %+v", got)
	}
	if got := b.claimRefund(t, "w", refundReq("m_1", "r-1", "auth", 0)); got.Outcome != ledger.Claimed || got.Refund.Amount != 60 {
		t.Fatalf("refund of all captured: %+v, want 60", got)
	}
	// A capture's key is no refund's, and a refund's no capture's.
	if got := b.claimRefund(t, "w", refundReq("m_1", "c-1", "auth", 1)); got.Outcome != ledger.Mismatch {
		t.Fatalf("refund under a capture's key: %v, want mismatch (key_reused)", got.Outcome)
	}
	if got := b.claimOp(t, "w", opReq(payment.KindCancel, "m_1", "r-1", "auth", 0)); got.Outcome != ledger.Mismatch {
		t.Fatalf("cancel under a refund's key: %v, want mismatch (key_reused)", got.Outcome)
	}
	if want := "m_1:c-1:captured captured succeeded 60 "; strings.Join(b.opEvents(t), "|") != want {
		t.Fatalf("events %q, want %q", b.opEvents(t), want)
	}
}

// TestCancelClaimRules: a cancel of an authorized payment holds it: no
// capture after it (claimed or done), nor a second cancel; its completion
// moves the payment to canceled and writes the canceled event. A capture
// the provider refused holds nothing: a cancel may follow it.
func TestCancelClaimRules(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.authorizedPayment(t, "m_1", "auth", 100)
	v := b.claimOp(t, "w", opReq(payment.KindCancel, "m_1", "v-1", "auth", 0))
	if v.Outcome != ledger.Claimed || v.Op.Amount != 100 || !strings.HasPrefix(v.Lease.ProviderKey, "pdv_") {
		t.Fatalf("cancel: %+v", v)
	}
	for _, r := range []ledger.PaymentOpRequest{opReq(payment.KindCapture, "m_1", "c-1", "auth", 0), opReq(payment.KindCancel, "m_1", "v-2", "auth", 0)} {
		if got := b.claimOp(t, "w", r); got.Outcome != ledger.Refused || got.Reason != ledger.RefuseCanceled {
			t.Fatalf("%s after a cancel: %+v, want refused payment_canceled", r.Kind, got)
		}
	}
	if err := b.store.CompletePaymentOp(b.ctx, *v.Lease, canceled()); err != nil {
		t.Fatal(err)
	}
	if got := b.claimOp(t, "w", opReq(payment.KindCapture, "m_1", "c-1", "auth", 0)); got.Outcome != ledger.Refused || got.Reason != ledger.RefuseCanceled {
		t.Fatalf("capture after a done cancel: %+v", got)
	}
	if pay, err := b.store.GetPayment(b.ctx, "m_1", "auth"); err != nil || pay.Status != ledger.PaymentCanceled {
		t.Fatalf("canceled payment %+v %v", pay, err)
	}
	if got := b.claimRefund(t, "w", refundReq("m_1", "r-1", "auth", 1)); got.Outcome != ledger.Refused || got.Reason != ledger.RefuseNotCharged {
		t.Fatalf("refund of a canceled payment: %+v", got)
	}

	b.authorizedPayment(t, "m_1", "auth2", 100)
	c := b.claimOp(t, "w", opReq(payment.KindCapture, "m_1", "c-2", "auth2", 0))
	no := ledger.PaymentOpCompletion{Status: ledger.OpRefused, Reason: "charge_expired_for_capture", ResponseStatus: 400,
		Response: json.RawMessage(`{"error":{"code":"charge_expired_for_capture"}}`)}
	if err := b.store.CompletePaymentOp(b.ctx, *c.Lease, no); err != nil {
		t.Fatal(err)
	}
	if got := b.claimOp(t, "w", opReq(payment.KindCancel, "m_1", "v-3", "auth2", 0)); got.Outcome != ledger.Claimed {
		t.Fatalf("cancel after a refused capture: %+v", got)
	}
	want := []string{"m_1:v-1:canceled canceled canceled 100 ", "m_1:c-2:capture_failed capture_failed refused 100 charge_expired_for_capture"}
	if strings.Join(b.opEvents(t), "|") != strings.Join(want, "|") {
		t.Fatalf("events %q, want %q", b.opEvents(t), want)
	}
}

// TestPaymentOpRace: for many authorized payments at once, two holders
// race two captures of all of it, or a capture and a cancel: for each,
// exactly one is claimed and the other refused, never both. Without the
// payment's lock both read no operation and both claim (the partial
// unique index then fails one with an error, never a refusal).
func TestPaymentOpRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 30
	for i := range n {
		b.authorizedPayment(t, "m_1", fmt.Sprintf("auth-%d", i), 100)
	}
	results := make([][2]ledger.PaymentOpClaim, n)
	errs := make([][2]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		for j := range 2 {
			kind := payment.KindCapture
			if j == 1 && i%2 == 1 {
				kind = payment.KindCancel
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r := opReq(kind, "m_1", fmt.Sprintf("op-%d-%d", i, j), fmt.Sprintf("auth-%d", i), 0)
				results[i][j], errs[i][j] = b.store.ClaimPaymentOp(b.ctx, fmt.Sprint(j), lease, r)
			}()
		}
	}
	close(start)
	wg.Wait()
	for i := range n {
		claimed, refused := 0, 0
		for j, r := range results[i] {
			switch {
			case errs[i][j] != nil:
				t.Fatalf("payment %d: %v", i, errs[i][j])
			case r.Outcome == ledger.Claimed:
				claimed++
			case r.Outcome == ledger.Refused && ledger.IsPaymentOpRefusal(r.Reason):
				refused++
			}
		}
		if claimed != 1 || refused != 1 {
			t.Errorf("payment %d: %d claimed, %d refused; want one of each", i, claimed, refused)
		}
	}
}

// TestWorkerRolePaymentOps runs a capture and a cancel on a pool logged in
// as paydedup_worker, as production does: the claims under the payment's
// lock, the release, the reconciler's lease of stuck ones, and the
// completions whose trigger moves the ledger the role may not update.
func TestWorkerRolePaymentOps(t *testing.T) {
	t.Parallel()
	pool := asWorker(t, testenv.PostgresURL(t))
	store, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, key := range []string{"a1", "a2"} {
		auth, err := store.Claim(ctx, "w", lease, authorizeReq("m_1", key, 100))
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Complete(ctx, *auth.Lease, authorized("pi_"+key, 100)); err != nil {
			t.Fatal(err)
		}
	}
	c, err := store.ClaimPaymentOp(ctx, "w", lease, opReq(payment.KindCapture, "m_1", "c-1", "a1", 70))
	if err != nil || c.Outcome != ledger.Claimed {
		t.Fatalf("claim capture as the worker: %+v %v", c, err)
	}
	if err := store.ReleasePaymentOp(ctx, *c.Lease, "timeout"); err != nil {
		t.Fatal(err)
	}
	stuck, err := store.AcquireStuckPaymentOps(ctx, "reconciler", 0, lease, 10)
	if err != nil || len(stuck) != 1 {
		t.Fatalf("stuck ops as the worker: %d %v", len(stuck), err)
	}
	if err := store.CompletePaymentOp(ctx, stuck[0].Lease(), captured(70)); err != nil {
		t.Fatalf("complete capture as the worker: %v", err)
	}
	v, err := store.ClaimPaymentOp(ctx, "w", lease, opReq(payment.KindCancel, "m_1", "v-1", "a2", 0))
	if err != nil || v.Outcome != ledger.Claimed {
		t.Fatalf("claim cancel as the worker: %+v %v", v, err)
	}
	if err := store.CompletePaymentOp(ctx, *v.Lease, canceled()); err != nil {
		t.Fatalf("complete cancel as the worker: %v", err)
	}
	if got, err := store.ClaimRefund(ctx, "w", lease, refundReq("m_1", "r-1", "a1", 0)); err != nil || got.Refund.Amount != 70 {
		t.Fatalf("refund of the captured 70: %+v %v", got, err)
	}
}
