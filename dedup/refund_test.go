package dedup_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// chargedPayment records a succeeded payment of amount under key.
func (b *bundle) chargedPayment(t *testing.T, merchant, key string, amount int64) {
	t.Helper()
	l := b.claim(t, "w", req(merchant, key, amount)).Lease
	if err := b.store.Complete(b.ctx, *l, charged("pi_"+key)); err != nil {
		t.Fatal(err)
	}
}

// refundReq is a refund of amount (0: the rest) of payment under key.
func refundReq(merchant, key, pay string, amount int64) ledger.RefundRequest {
	return ledger.NewRefundRequest(&payment.Command{MerchantID: merchant, IdempotencyKey: key, PaymentKey: pay, Amount: amount,
		Kind: payment.KindRefund})
}

func (b *bundle) claimRefund(t *testing.T, holder string, r ledger.RefundRequest) ledger.RefundClaim {
	t.Helper()
	res, err := b.store.ClaimRefund(b.ctx, holder, lease, r)
	if err != nil {
		t.Fatalf("claim refund %s: %v", r.IdempotencyKey, err)
	}
	return res
}

func refunded(id string) ledger.RefundCompletion {
	return ledger.RefundCompletion{Status: ledger.RefundSucceeded, RefundID: id, ResponseStatus: 200,
		Response: json.RawMessage(`{"id":"` + id + `","status":"succeeded"}`)}
}

// TestRefundClaimRules: a refund is claimed only of a charged payment of
// the same merchant, and only while the refunds that may hold money
// (claimed, unknown, pending at the provider, succeeded) leave room for
// it; a refused claim writes nothing. A refund whose outcome may have
// happened is re-acquired for a lookup, never for a blind re-call; a
// failed refund gives its amount back.
func TestRefundClaimRules(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.chargedPayment(t, "m_1", "pay", 100)

	refused := func(what string, r ledger.RefundRequest, reason string) {
		t.Helper()
		if got := b.claimRefund(t, "w", r); got.Outcome != ledger.Refused || got.Reason != reason || got.Lease != nil {
			t.Fatalf("%s: %v %q, want refused %q", what, got.Outcome, got.Reason, reason)
		}
	}
	refused("unknown payment", refundReq("m_1", "r-x", "nope", 10), ledger.RefuseNoPayment)
	refused("another merchant's payment", refundReq("m_2", "r-x", "pay", 10), ledger.RefuseNoPayment)
	declinedLease := b.claim(t, "w", req("m_1", "declined", 100)).Lease
	if err := b.store.Complete(b.ctx, *declinedLease, ledger.Completion{Declined: true, ResponseStatus: 402, Response: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	refused("declined payment", refundReq("m_1", "r-x", "declined", 10), ledger.RefuseNotCharged)
	procLease := b.claim(t, "w", req("m_1", "proc", 100)).Lease
	if err := b.store.Complete(b.ctx, *procLease, ledger.Completion{Processing: true, ChargeID: "pi_proc", ResponseStatus: 202, Response: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	refused("processing payment", refundReq("m_1", "r-x", "proc", 10), ledger.RefuseNotCharged)
	wrongCur := refundReq("m_1", "r-x", "pay", 10)
	wrongCur.Currency = "eur"
	wrongCur.RequestHash = ledger.NewRefundRequest(&payment.Command{MerchantID: "m_1", IdempotencyKey: "r-x", PaymentKey: "pay",
		Amount: 10, Currency: "eur", Kind: payment.KindRefund}).RequestHash
	refused("other currency", wrongCur, ledger.RefuseCurrency)
	if n := b.count(t, `SELECT count(*) FROM refunds`); n != 0 {
		t.Fatalf("%d refund rows after refusals, want none", n)
	}

	first := b.claimRefund(t, "w", refundReq("m_1", "r-1", "pay", 60))
	if first.Outcome != ledger.Claimed || first.Refundable != 100 || first.Refund.Amount != 60 || first.Refund.ChargeID != "pi_pay" ||
		!strings.HasPrefix(first.Lease.ProviderKey, "pdr_") || first.Lease.ProviderKey != ledger.RefundProviderKey("m_1", "r-1") {
		t.Fatalf("first refund: %+v", first)
	}
	// The claimed refund holds its 60: 50 more is over what is left.
	if got := b.claimRefund(t, "w", refundReq("m_1", "r-2", "pay", 50)); got.Outcome != ledger.Refused ||
		got.Reason != ledger.RefuseOverRefundable || got.Refundable != 40 {
		t.Fatalf("second refund over the rest: %+v", got)
	}
	// Same key, same request, lease live: in flight; another request: mismatch.
	if got := b.claimRefund(t, "w2", refundReq("m_1", "r-1", "pay", 60)); got.Outcome != ledger.InFlight {
		t.Fatalf("same refund in flight: %v", got.Outcome)
	}
	if got := b.claimRefund(t, "w2", refundReq("m_1", "r-1", "pay", 61)); got.Outcome != ledger.Mismatch {
		t.Fatalf("same key, other amount: %v", got.Outcome)
	}
	// Its answer is lost: unknown, still held, looked up before any re-call.
	if err := b.store.ReleaseRefund(b.ctx, *first.Lease, "timeout"); err != nil {
		t.Fatal(err)
	}
	if got := b.claimRefund(t, "w", refundReq("m_1", "r-2", "pay", 50)); got.Outcome != ledger.Refused || got.Reason != ledger.RefuseOverRefundable {
		t.Fatalf("a refund of unknown outcome must hold its amount: %+v", got)
	}
	again := b.claimRefund(t, "w2", refundReq("m_1", "r-1", "pay", 60))
	if again.Outcome != ledger.NeedsLookup || again.Lease == nil || again.Lease.Attempt != 2 || again.Lease.ProviderKey != first.Lease.ProviderKey {
		t.Fatalf("re-claim of an unknown refund: %+v, want a lookup under the same provider key", again)
	}
	// The old holder is fenced out.
	if err := b.store.CompleteRefund(b.ctx, *first.Lease, refunded("re_1")); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Fatalf("stale completion: %v, want lease lost", err)
	}
	// The lookup finds it failed at the provider: the money is back.
	failed := ledger.RefundCompletion{Status: ledger.RefundFailed, RefundID: "re_1", Reason: "expired_or_canceled_card",
		ResponseStatus: 200, Response: json.RawMessage(`{"id":"re_1","status":"failed"}`)}
	if err := b.store.CompleteRefund(b.ctx, *again.Lease, failed); err != nil {
		t.Fatal(err)
	}
	if err := b.store.CompleteRefund(b.ctx, *again.Lease, failed); err != nil {
		t.Fatalf("completion retried: %v", err)
	}
	if got := b.claimRefund(t, "w", refundReq("m_1", "r-1", "pay", 60)); got.Outcome != ledger.Duplicate || got.Refund.Status != ledger.RefundFailed {
		t.Fatalf("failed refund replayed: %+v", got)
	}
	rest := b.claimRefund(t, "w", refundReq("m_1", "r-3", "pay", 0))
	if rest.Outcome != ledger.Claimed || rest.Refund.Amount != 100 {
		t.Fatalf("refund of the rest after a failed one: %+v, want 100", rest)
	}
	if err := b.store.CompleteRefund(b.ctx, *rest.Lease, refunded("re_3")); err != nil {
		t.Fatal(err)
	}
	refused("nothing left", refundReq("m_1", "r-4", "pay", 0), ledger.RefuseOverRefundable)
	refused("one more cent", refundReq("m_1", "r-5", "pay", 1), ledger.RefuseOverRefundable)

	// Each final refund wrote one outcome event with its record (the
	// release and the claims none).
	var got []string
	for _, e := range b.events(t) {
		if e.Seq == 3 {
			got = append(got, fmt.Sprintf("%s %s %s %d %s %s", e.EventID, e.Kind, e.Status, e.Amount, e.ChargeID, e.Reason))
		}
	}
	want := []string{"m_1:r-1:refund_failed refund_failed failed 60 pi_pay expired_or_canceled_card",
		"m_1:r-3:refunded refunded succeeded 100 pi_pay "}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("refund events:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestRefundRefusedByTheProviderWritesItsEvent: a refund the provider
// refuses (its definitive no) is recorded refused, gives its amount back,
// and writes one refund_failed event with status refused, in the
// completion's transaction; a refused command's constraint (seq 0, kind
// refused, 00026) must not reject it, or the completion itself fails.
func TestRefundRefusedByTheProviderWritesItsEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.chargedPayment(t, "m_1", "pay", 100)
	c := b.claimRefund(t, "w", refundReq("m_1", "r-1", "pay", 100))
	if c.Outcome != ledger.Claimed {
		t.Fatalf("claim: %+v", c)
	}
	no := ledger.RefundCompletion{Status: ledger.RefundRefused, Reason: "charge_already_refunded", ResponseStatus: 400,
		Response: json.RawMessage(`{"error":{"code":"charge_already_refunded"}}`)}
	if err := b.store.CompleteRefund(b.ctx, *c.Lease, no); err != nil {
		t.Fatalf("complete a refund the provider refused: %v", err)
	}
	if rest := b.claimRefund(t, "w", refundReq("m_1", "r-2", "pay", 0)); rest.Outcome != ledger.Claimed || rest.Refund.Amount != 100 {
		t.Fatalf("refund of the rest after a refused one: %+v, want 100", rest)
	}
	var got []string
	for _, e := range b.events(t) {
		if e.Seq == 3 {
			got = append(got, fmt.Sprintf("%s %s %s %d %s", e.EventID, e.Kind, e.Status, e.Amount, e.Reason))
		}
	}
	if want := "m_1:r-1:refund_failed refund_failed refused 100 charge_already_refunded"; strings.Join(got, "|") != want {
		t.Fatalf("refund events %q, want %q", got, want)
	}
}

// TestRefundRaceForTheLast100: two holders race two refunds of all of a
// 100 payment, for many payments at once: for each, exactly one refund
// is claimed and the other refused over_refundable, never both. Without
// the payment row's lock the two sums both read 0 and both claim.
func TestRefundRaceForTheLast100(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 40
	for i := range n {
		b.chargedPayment(t, "m_1", fmt.Sprintf("pay-%d", i), 100)
	}
	type result struct {
		claim ledger.RefundClaim
		err   error
	}
	results := make([][2]result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		for j, holder := range []string{"a", "b"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r := refundReq("m_1", fmt.Sprintf("refund-%d-%s", i, holder), fmt.Sprintf("pay-%d", i), 100)
				c, err := b.store.ClaimRefund(b.ctx, holder, lease, r)
				results[i][j] = result{c, err}
			}()
		}
	}
	close(start)
	wg.Wait()
	for i, rs := range results {
		claimed, refused := 0, 0
		for _, r := range rs {
			switch {
			case r.err != nil:
				t.Fatalf("payment %d: %v", i, r.err)
			case r.claim.Outcome == ledger.Claimed:
				claimed++
			case r.claim.Outcome == ledger.Refused && r.claim.Reason == ledger.RefuseOverRefundable:
				refused++
			}
		}
		if claimed != 1 || refused != 1 {
			t.Errorf("payment %d: %d claimed, %d refused over_refundable; want one of each", i, claimed, refused)
		}
	}
	if over := b.count(t, `SELECT count(*) FROM (SELECT payment_key FROM refunds GROUP BY payment_key HAVING sum(amount) > 100) o`); over != 0 {
		t.Fatalf("%d payments with refunds over their amount", over)
	}
}

// TestRefundLeaseRunOutIsLookedUp: a refund whose holder died with its
// lease (the call may have reached the provider) is re-acquired, once its
// lease ran out, for a lookup before any re-call, under the same provider
// key; until then it is in flight, and it holds its amount throughout.
func TestRefundLeaseRunOutIsLookedUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.chargedPayment(t, "m_1", "pay", 100)
	dead := b.claimRefund(t, "dies", refundReq("m_1", "r-1", "pay", 100))
	if dead.Outcome != ledger.Claimed {
		t.Fatalf("claim: %v", dead.Outcome)
	}
	if got := b.claimRefund(t, "next", refundReq("m_1", "r-1", "pay", 100)); got.Outcome != ledger.InFlight || got.RetryIn <= 0 {
		t.Fatalf("before the lease ran out: %+v", got)
	}
	b.clock.Advance(lease + time.Second)
	if got := b.claimRefund(t, "next", refundReq("m_1", "r-2", "pay", 1)); got.Outcome != ledger.Refused || got.Reason != ledger.RefuseOverRefundable {
		t.Fatalf("a refund past its lease still holds its amount: %+v", got)
	}
	got := b.claimRefund(t, "next", refundReq("m_1", "r-1", "pay", 100))
	if got.Outcome != ledger.NeedsLookup || got.Lease.Holder != "next" || got.Lease.Attempt != 2 || got.Lease.ProviderKey != dead.Lease.ProviderKey {
		t.Fatalf("after the lease ran out: %+v, want a lookup by the next holder under the same provider key", got)
	}
	if err := b.store.CompleteRefund(b.ctx, *got.Lease, refunded("re_1")); err != nil {
		t.Fatal(err)
	}
	r, err := b.store.GetRefund(b.ctx, "m_1", "r-1")
	if err != nil || r.Status != ledger.RefundSucceeded || r.RefundID != "re_1" || !r.Final() {
		t.Fatalf("refund %+v %v", r, err)
	}
	if _, err := b.store.GetRefund(b.ctx, "m_1", "r-9"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("unknown refund: %v", err)
	}
}

// TestWorkerRoleRefunds runs the refund path and an authorization's
// completion on a pool logged in as paydedup_worker, as production does:
// the claim's lock of the payment row, the refund's writes, the reconciler's
// lease of stuck refunds, and the outcome events the triggers write.
func TestWorkerRoleRefunds(t *testing.T) {
	t.Parallel()
	pool := asWorker(t, testenv.PostgresURL(t))
	store, err := dedup.New(pool, dedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res, err := store.Claim(ctx, "w", lease, req("m_1", "pay", 100))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(ctx, *res.Lease, charged("pi_pay")); err != nil {
		t.Fatal(err)
	}
	auth, err := store.Claim(ctx, "w", lease, authorizeReq("m_1", "auth", 100))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(ctx, *auth.Lease, authorized("pi_auth", 100)); err != nil {
		t.Fatalf("authorized completion as the worker: %v", err)
	}
	c, err := store.ClaimRefund(ctx, "w", lease, refundReq("m_1", "r-1", "pay", 60))
	if err != nil || c.Outcome != ledger.Claimed {
		t.Fatalf("claim refund as the worker: %+v %v", c, err)
	}
	if err := store.ReleaseRefund(ctx, *c.Lease, "timeout"); err != nil {
		t.Fatal(err)
	}
	stuck, err := store.AcquireStuckRefunds(ctx, "reconciler", 0, lease, 10)
	if err != nil || len(stuck) != 1 {
		t.Fatalf("stuck refunds as the worker: %d %v", len(stuck), err)
	}
	if err := store.CompleteRefund(ctx, stuck[0].Lease(), refunded("re_1")); err != nil {
		t.Fatalf("complete refund as the worker: %v", err)
	}
	if got, err := store.ClaimRefund(ctx, "w", lease, refundReq("m_1", "r-2", "pay", 0)); err != nil || got.Refund.Amount != 40 {
		t.Fatalf("refund of the rest: %+v %v", got, err)
	}
}
