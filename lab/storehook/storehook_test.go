package storehook_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/lab/storehook"
	"github.com/paydedup/paydedup/ledger"
)

// The wrapper is a worker's store, and the optional parts it restates are
// the consumer's, method for method.
var (
	_ consumer.Store           = storehook.Wrapper(nil)
	_ consumer.RefundStore     = storehook.RefundStore(nil)
	_ storehook.RefundStore    = consumer.RefundStore(nil)
	_ consumer.PaymentOpStore  = storehook.PaymentOpStore(nil)
	_ storehook.PaymentOpStore = consumer.PaymentOpStore(nil)
)

// recorder is a store that records which methods reached it.
type recorder struct{ got []string }

func (r *recorder) ClaimBatch(_ context.Context, _ string, _ time.Duration, reqs []ledger.ClaimRequest) ([]ledger.ClaimResult, error) {
	r.got = append(r.got, "ClaimBatch")
	return make([]ledger.ClaimResult, len(reqs)), nil
}

func (r *recorder) Heartbeat(_ context.Context, l ledger.Lease, d time.Duration) (ledger.Lease, error) {
	r.got = append(r.got, "Heartbeat")
	l.Until = l.Until.Add(d)
	return l, nil
}

func (r *recorder) Complete(context.Context, ledger.Lease, ledger.Completion) error {
	r.got = append(r.got, "Complete")
	return nil
}

func (r *recorder) CompleteBatch(_ context.Context, items []ledger.CompleteItem) ([]error, error) {
	r.got = append(r.got, "CompleteBatch")
	return make([]error, len(items)), nil
}

func (r *recorder) Fail(context.Context, ledger.Lease, string) (ledger.Status, error) {
	r.got = append(r.got, "Fail")
	return ledger.StatusFailed, nil
}

func (r *recorder) Release(context.Context, ledger.Lease, string) error {
	r.got = append(r.got, "Release")
	return nil
}

func (r *recorder) RecordRefusal(context.Context, ledger.Refusal) (bool, error) {
	r.got = append(r.got, "RecordRefusal")
	return true, nil
}

func (r *recorder) ProviderKeyWindow() time.Duration { return time.Hour }

// refundPart and opPart record refunds' and payment operations' calls in
// a recorder: a store made of a recorder and either or both takes those
// commands too.
type (
	refundPart struct{ r *recorder }
	opPart     struct{ r *recorder }
)

func (p refundPart) ClaimRefund(_ context.Context, _ string, _ time.Duration, req ledger.RefundRequest) (ledger.RefundClaim, error) {
	p.r.got = append(p.r.got, "ClaimRefund")
	return ledger.RefundClaim{Outcome: ledger.Claimed, Refundable: req.Amount}, nil
}

func (p refundPart) CompleteRefund(context.Context, ledger.Lease, ledger.RefundCompletion) error {
	p.r.got = append(p.r.got, "CompleteRefund")
	return nil
}

func (p refundPart) ReleaseRefund(context.Context, ledger.Lease, string) error {
	p.r.got = append(p.r.got, "ReleaseRefund")
	return nil
}

func (p opPart) ClaimPaymentOp(_ context.Context, _ string, _ time.Duration, req ledger.PaymentOpRequest) (ledger.PaymentOpClaim, error) {
	p.r.got = append(p.r.got, "ClaimPaymentOp")
	return ledger.PaymentOpClaim{Outcome: ledger.Claimed, Capturable: req.Amount}, nil
}

func (p opPart) CompletePaymentOp(context.Context, ledger.Lease, ledger.PaymentOpCompletion) error {
	p.r.got = append(p.r.got, "CompletePaymentOp")
	return nil
}

func (p opPart) ReleasePaymentOp(context.Context, ledger.Lease, string) error {
	p.r.got = append(p.r.got, "ReleasePaymentOp")
	return nil
}

// The stores with optional parts.
type (
	refundRecorder struct {
		*recorder
		refundPart
	}
	opRecorder struct {
		*recorder
		opPart
	}
	fullRecorder struct {
		*recorder
		refundPart
		opPart
	}
)

// TestWrapperForwardsAndHooks: with no hooks every call reaches the store
// with its answer; a before hook's error answers a call without the store;
// an after hook's error replaces an answer the store gave; calls are
// counted per method and in all.
func TestWrapperForwardsAndHooks(t *testing.T) {
	ctx := context.Background()
	inner := &recorder{}
	w := storehook.Wrap(inner)
	l := ledger.Lease{IdempotencyKey: "k"}
	if res, err := w.ClaimBatch(ctx, "h", time.Second, make([]ledger.ClaimRequest, 2)); err != nil || len(res) != 2 {
		t.Fatalf("claim batch: %d results, %v", len(res), err)
	}
	if got, err := w.Heartbeat(ctx, l, time.Minute); err != nil || !got.Until.Equal(l.Until.Add(time.Minute)) {
		t.Fatalf("heartbeat: %+v %v, want the store's renewed lease", got, err)
	}
	if err := w.Complete(ctx, l, ledger.Completion{}); err != nil {
		t.Fatal(err)
	}
	if errs, err := w.CompleteBatch(ctx, make([]ledger.CompleteItem, 3)); err != nil || len(errs) != 3 {
		t.Fatalf("complete batch: %v %v", errs, err)
	}
	if st, err := w.Fail(ctx, l, "r"); err != nil || st != ledger.StatusFailed {
		t.Fatalf("fail: %v %v", st, err)
	}
	if err := w.Release(ctx, l, "r"); err != nil {
		t.Fatal(err)
	}
	if wrote, err := w.RecordRefusal(ctx, ledger.Refusal{StreamSeq: 1}); err != nil || !wrote {
		t.Fatalf("record refusal: %v %v, want the store's answer", wrote, err)
	}
	if w.ProviderKeyWindow() != time.Hour {
		t.Fatal("provider key window not forwarded")
	}
	if len(inner.got) != 7 || w.Calls(storehook.Any) != 7 || w.Calls(storehook.Complete) != 1 {
		t.Fatalf("store saw %v, wrapper counted %d", inner.got, w.Calls(storehook.Any))
	}

	killed := errors.New("killed")
	w.Before(storehook.Fail, storehook.FailNth(2, killed))
	lost := errors.New("answer lost")
	var seen []ledger.Status
	w.After(storehook.Fail, func(_ context.Context, c *storehook.Call) error {
		seen = append(seen, c.Status)
		if c.N == 3 {
			return lost
		}
		return nil
	})
	inner.got = nil
	if st, err := w.Fail(ctx, l, "r"); !errors.Is(err, killed) || st != "" {
		t.Fatalf("second fail: %q %v, want the before hook's error", st, err)
	}
	if st, err := w.Fail(ctx, l, "r"); !errors.Is(err, lost) || st != "" {
		t.Fatalf("third fail: %q %v, want the after hook's error and no status", st, err)
	}
	if len(inner.got) != 1 || len(seen) != 1 || seen[0] != ledger.StatusFailed {
		t.Fatalf("store saw %v, after hook saw %v: want only the third call to reach the store", inner.got, seen)
	}
	if w.Calls(storehook.Fail) != 3 {
		t.Fatalf("%d fails counted, want 3", w.Calls(storehook.Fail))
	}
}

// TestWrapperHasTheStoresOptionalPartsOnly: the worker finds refunds and
// payment operations by a type assertion on its store, so a wrapper has
// each optional part exactly when the store inside has it: a wrapper of a
// store without refunds must not take refunds (the worker would claim
// them instead of dead-lettering them), and one of a store with them must
// not hide them (the worker would dead-letter every refund). Hooks added
// later keep the wrapper's parts.
func TestWrapperHasTheStoresOptionalPartsOnly(t *testing.T) {
	rec := &recorder{}
	for _, tc := range []struct {
		name               string
		inner              storehook.Store
		refunds, paymentOp bool
	}{
		{"charges", rec, false, false},
		{"refunds", refundRecorder{rec, refundPart{rec}}, true, false},
		{"payment_ops", opRecorder{rec, opPart{rec}}, false, true},
		{"all", fullRecorder{rec, refundPart{rec}, opPart{rec}}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := storehook.Wrap(tc.inner)
			for i, s := range []consumer.Store{w, w.Before(storehook.Any, storehook.FailNth(9, errors.New("x"))), w.After(storehook.ClaimRefund, storehook.FailNth(9, errors.New("x")))} {
				if _, ok := s.(consumer.RefundStore); ok != tc.refunds {
					t.Errorf("wrapper %d is a RefundStore: %v, want %v", i, ok, tc.refunds)
				}
				if _, ok := s.(consumer.PaymentOpStore); ok != tc.paymentOp {
					t.Errorf("wrapper %d is a PaymentOpStore: %v, want %v", i, ok, tc.paymentOp)
				}
			}
		})
	}
}

// TestWrapperHooksRefundsAndPaymentOps: the refunds' and the payment
// operations' calls are forwarded with their answers, counted, and hooked
// as the charges' are, Any included.
func TestWrapperHooksRefundsAndPaymentOps(t *testing.T) {
	ctx := context.Background()
	rec := &recorder{}
	w := storehook.Wrap(fullRecorder{rec, refundPart{rec}, opPart{rec}})
	rs, ps := w.(consumer.RefundStore), w.(consumer.PaymentOpStore)
	l := ledger.Lease{IdempotencyKey: "k"}
	if c, err := rs.ClaimRefund(ctx, "h", time.Second, ledger.RefundRequest{Amount: 7}); err != nil || c.Refundable != 7 {
		t.Fatalf("claim refund: %+v %v, want the store's claim", c, err)
	}
	if err := rs.CompleteRefund(ctx, l, ledger.RefundCompletion{}); err != nil {
		t.Fatal(err)
	}
	if err := rs.ReleaseRefund(ctx, l, "r"); err != nil {
		t.Fatal(err)
	}
	if c, err := ps.ClaimPaymentOp(ctx, "h", time.Second, ledger.PaymentOpRequest{Amount: 9}); err != nil || c.Capturable != 9 {
		t.Fatalf("claim payment op: %+v %v, want the store's claim", c, err)
	}
	if err := ps.CompletePaymentOp(ctx, l, ledger.PaymentOpCompletion{}); err != nil {
		t.Fatal(err)
	}
	if err := ps.ReleasePaymentOp(ctx, l, "r"); err != nil {
		t.Fatal(err)
	}
	if len(rec.got) != 6 || w.Calls(storehook.Any) != 6 || w.Calls(storehook.ClaimRefund) != 1 || w.Calls(storehook.ReleasePaymentOp) != 1 {
		t.Fatalf("store saw %v, wrapper counted %d", rec.got, w.Calls(storehook.Any))
	}

	killed := errors.New("killed")
	var killedNow bool
	w.Before(storehook.Any, func(context.Context, *storehook.Call) error {
		if killedNow {
			return killed
		}
		return nil
	})
	lost := errors.New("answer lost")
	var seen []storehook.Call
	w.After(storehook.ClaimRefund, func(_ context.Context, c *storehook.Call) error {
		seen = append(seen, *c)
		return lost
	})
	w.After(storehook.ClaimPaymentOp, func(_ context.Context, c *storehook.Call) error {
		seen = append(seen, *c)
		return lost
	})
	rec.got = nil
	if c, err := rs.ClaimRefund(ctx, "h", time.Second, ledger.RefundRequest{Amount: 7}); !errors.Is(err, lost) || c.Refundable != 0 {
		t.Fatalf("claim refund: %+v %v, want the after hook's error and no claim", c, err)
	}
	if c, err := ps.ClaimPaymentOp(ctx, "h2", time.Second, ledger.PaymentOpRequest{Amount: 9}); !errors.Is(err, lost) || c.Capturable != 0 {
		t.Fatalf("claim payment op: %+v %v, want the after hook's error and no claim", c, err)
	}
	if len(seen) != 2 || seen[0].Holder != "h" || seen[0].RefundReq.Amount != 7 || seen[0].RefundClaim.Refundable != 7 ||
		seen[1].Holder != "h2" || seen[1].PaymentOpReq.Amount != 9 || seen[1].PaymentOpClaim.Capturable != 9 || seen[1].N != 2 {
		t.Fatalf("after hooks saw %+v, want each claim's arguments and the store's answer", seen)
	}
	killedNow = true
	if err := rs.CompleteRefund(ctx, l, ledger.RefundCompletion{}); !errors.Is(err, killed) {
		t.Fatalf("complete refund: %v, want the before hook's error", err)
	}
	if err := ps.ReleasePaymentOp(ctx, l, "r"); !errors.Is(err, killed) {
		t.Fatalf("release payment op: %v, want the before hook's error", err)
	}
	if len(rec.got) != 2 {
		t.Fatalf("store saw %v, want only the two claims", rec.got)
	}
}
