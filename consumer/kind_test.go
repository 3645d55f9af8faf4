package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/lab/storehook"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/reconciler"
)

// authorizeBody is an authorize command as a client encodes it.
func authorizeBody(merchant, key string, amount int64) []byte {
	b, _ := json.Marshal(payment.Command{MerchantID: merchant, IdempotencyKey: key, Amount: amount, Currency: "usd",
		PaymentMethod: "pm_card_visa", Kind: payment.KindAuthorize})
	return b
}

// intentOf is the provider's one intent under (merchant, key), found by
// the non-charging lookup: more than one is an error there, so a found
// intent is the only one.
func (e *env) intentOf(merchant, key string) *provider.IntentOutcome {
	e.t.Helper()
	res, err := e.stripe.Lookup(e.ctx, provider.LookupRequest{MerchantID: merchant, IdempotencyKey: key})
	if err != nil || !res.Found {
		e.t.Fatalf("lookup %s:%s: found %v, %v", merchant, key, res.Found, err)
	}
	in, err := e.stripe.RetrieveIntent(e.ctx, provider.RetrieveIntentRequest{ChargeID: res.Outcome.ChargeID})
	if err != nil {
		e.t.Fatal(err)
	}
	return in
}

// authorizedRow waits for the key's row to complete and checks that it
// completed authorized: the ledger row, the client's state, the outcome
// event, and at the provider one intent held for capture, nothing moved.
func (e *env) authorizedRow(merchant, key string, amount int64) ledger.Record {
	e.t.Helper()
	e.eventually("authorize completed", func() bool {
		rec, err := e.store.Get(e.ctx, merchant, key)
		return err == nil && rec.Status == ledger.StatusCompleted
	})
	rec, _ := e.store.Get(e.ctx, merchant, key)
	pay, err := e.store.GetPayment(e.ctx, merchant, key)
	if err != nil || pay.Status != ledger.PaymentAuthorized || pay.ChargeID != rec.ChargeID {
		e.t.Fatalf("ledger row %+v (%v), want authorized with the record's intent %s", pay, err, rec.ChargeID)
	}
	if st := ledger.StateOf(nil, &rec, &pay); st.Status != ledger.StateAuthorized || st.AmountCapturable != amount {
		e.t.Fatalf("state %s with %d capturable, want authorized with %d", st.Status, st.AmountCapturable, amount)
	}
	if n := e.count(`SELECT count(*) FROM outcome_events WHERE merchant_id = $1 AND idempotency_key = $2 AND kind = 'authorized'`, merchant, key); n != 1 {
		e.t.Fatalf("%d authorized outcome events, want 1", n)
	}
	in := e.intentOf(merchant, key)
	if in.ChargeID != rec.ChargeID || in.Status != provider.StatusRequiresCapture || in.AmountCapturable != amount || in.AmountReceived != 0 {
		e.t.Fatalf("provider's intent %+v, want %s requires_capture with %d capturable and nothing received", in, rec.ChargeID, amount)
	}
	if n := e.charges(merchant, key); n != 0 {
		e.t.Fatalf("%d charges at the provider, want none: an authorize moves no money", n)
	}
	return rec
}

// TestAuthorizeEndsAuthorized: an authorize is claimed and called as a
// charge is, with manual capture: the payment ends authorized, the money
// held at the provider, its capturable amount shown.
func TestAuthorizeEndsAuthorized(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.startWorker("w1", nil)
	e.publish("m_1", authorizeBody("m_1", "auth", 2500), "", nil)
	e.publish("m_1", authorizeBody("m_1", "auth", 2500), "", nil) // a duplicate: replayed, not called again
	e.authorizedRow("m_1", "auth", 2500)
	e.quiescent()
	if n := len(e.deadLetters()); n != 0 {
		t.Fatalf("%d dead letters, want 0", n)
	}
}

// holdingCharger is a provider that leaves every intent requires_capture,
// whatever the request asked: what a charge must never record as charged.
type holdingCharger struct{ inner consumer.Charger }

func (h holdingCharger) Charge(ctx context.Context, req provider.ChargeRequest) (*provider.Outcome, error) {
	req.ManualCapture = true
	return h.inner.Charge(ctx, req)
}

// TestChargeLeftRequiresCaptureIsNotCharged: a charge (automatic capture)
// whose intent the provider leaves requires_capture moved no money: it is
// recorded processing (the key never charged again, the payment settled
// by lookup), never succeeded.
func TestChargeLeftRequiresCaptureIsNotCharged(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.startWorker("w1", holdingCharger{e.stripe})
	e.publish("m_1", body("m_1", "held", 1200), "", nil)
	e.eventually("charge completed", func() bool {
		rec, err := e.store.Get(e.ctx, "m_1", "held")
		return err == nil && rec.Status == ledger.StatusCompleted
	})
	e.quiescent()
	rec, _ := e.store.Get(e.ctx, "m_1", "held")
	pay, err := e.store.GetPayment(e.ctx, "m_1", "held")
	if err != nil || pay.Status != ledger.PaymentProcessing {
		t.Fatalf("ledger row %s (%v), want processing: the provider holds the money, it did not move", pay.Status, err)
	}
	if st := ledger.StateOf(nil, &rec, &pay); st.Status != ledger.StateProcessing {
		t.Fatalf("state %s, want processing", st.Status)
	}
	if n := e.charges("m_1", "held"); n != 0 {
		t.Fatalf("%d charges at the provider, want none", n)
	}
}

// TestCrashAfterAuthorizeBeforeCommit: a worker authorizes and dies before
// its commit; the redelivery's worker calls again under the stored
// provider key, the provider replays the one authorization, and the row
// completes authorized with it. The dead worker's late commit is fenced.
func TestCrashAfterAuthorizeBeforeCommit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	hung, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hangOnce := func(context.Context, *storehook.Call) error {
		first := false
		once.Do(func() { first = true })
		if first {
			close(hung)
			<-release
		}
		return nil
	}
	hs := storehook.Wrap(e.store).
		Before(storehook.Complete, hangOnce).
		Before(storehook.CompleteBatch, hangOnce).
		Before(storehook.ClaimBatch, func(ctx context.Context, _ *storehook.Call) error {
			select {
			case <-hung:
				select {
				case <-release:
				case <-ctx.Done():
				}
				return fmt.Errorf("worker is dead")
			default:
				return nil
			}
		})
	cfg := e.cfg
	cfg.Holder = "dies"
	w, err := consumer.NewWorker(e.nc, consumer.NewProcessor(hs, e.stripe, cfg, nil), cfg, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	e.waitStreams()
	e.publish("m_1", authorizeBody("m_1", "crash-auth", 4200), "", nil)
	select {
	case <-hung:
	case <-time.After(30 * time.Second):
		t.Fatal("the authorization never reached the commit")
	}
	first := e.intentOf("m_1", "crash-auth")
	if first.Status != provider.StatusRequiresCapture {
		t.Fatalf("intent %s before the crash, want requires_capture", first.Status)
	}
	cancel()

	e.startWorker("healthy", nil)
	rec := e.authorizedRow("m_1", "crash-auth", 4200)
	if rec.ChargeID != first.ChargeID || rec.LockedBy != "healthy" {
		t.Fatalf("completed with %s by %s, want the original authorization %s by another holder", rec.ChargeID, rec.LockedBy, first.ChargeID)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e.quiescent()
	e.authorizedRow("m_1", "crash-auth", 4200)
	if n := e.count(`SELECT count(*) FROM payments`); n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
}

// TestTwoWorkersRaceAuthorizes: two workers share authorizes, each
// published twice: every one ends authorized with exactly one intent at
// the provider (the lookup fails on two) and one ledger row.
func TestTwoWorkersRaceAuthorizes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.startWorker("w1", nil)
	e.startWorker("w2", nil)
	const n = 40
	for i := range n {
		b := authorizeBody("m_1", fmt.Sprintf("race-%d", i), int64(100+i))
		e.publish("m_1", b, "", nil)
		e.publish("m_1", b, "", nil)
	}
	e.eventually("all completed", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE status = 'completed'`) == n
	})
	e.quiescent()
	for i := range n {
		e.authorizedRow("m_1", fmt.Sprintf("race-%d", i), int64(100+i))
	}
	if got := e.count(`SELECT count(*) FROM payments WHERE status = 'authorized'`); got != n {
		t.Fatalf("%d authorized ledger rows, want %d", got, n)
	}
}

// TestReconcilerCompletesAbandonedAuthorize: a worker authorized and died
// with its message gone; the reconciler's lookup finds the intent
// requires_capture and completes the row authorized (the kind read back
// from the stored provider key), never calling to authorize.
func TestReconcilerCompletesAbandonedAuthorize(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cmd := &payment.Command{MerchantID: "m_1", IdempotencyKey: "orphan-auth", Amount: 900, Currency: "usd",
		PaymentMethod: "pm_card_visa", Kind: payment.KindAuthorize}
	req := ledger.NewClaimRequest(cmd)
	res, err := e.store.Claim(e.ctx, "dead-worker", time.Second, req)
	if err != nil || res.Lease == nil {
		t.Fatalf("claim: %v", err)
	}
	out, err := e.stripe.Charge(e.ctx, provider.ChargeRequest{
		ProviderKey: res.Lease.ProviderKey, MerchantID: "m_1", IdempotencyKey: "orphan-auth",
		Amount: 900, Currency: "usd", PaymentMethod: "pm_card_visa", ManualCapture: true,
	})
	if err != nil || !out.Authorized {
		t.Fatalf("authorize: %+v %v", out, err)
	}
	rec, err := reconciler.New(e.store, e.stripe, reconciler.Config{Grace: time.Millisecond, SearchLag: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e.eventually("lease expired and resolved", func() bool {
		r, err := rec.RunOnce(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		return r.Completed == 1
	})
	got := e.authorizedRow("m_1", "orphan-auth", 900)
	if got.ChargeID != out.ChargeID {
		t.Fatalf("completed with %s, want %s", got.ChargeID, out.ChargeID)
	}
}
