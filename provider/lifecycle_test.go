package provider_test

import (
	"errors"
	"testing"

	"github.com/paydedup/paydedup/provider"
)

// TestRefusal: a capture's, cancel's or refund's error answer is a
// refusal only when the provider said no for good about the payment's
// state; every other answer keeps the charge path's class.
func TestRefusal(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		r          provider.Rejection
		code       string
		wantClass  provider.Class
		wantRefuse bool
	}{
		{"unexpected state", provider.Rejection{HTTPStatus: 400, Type: "invalid_request_error", Code: "payment_intent_unexpected_state"}, "payment_intent_unexpected_state", 0, true},
		{"amount too large", provider.Rejection{HTTPStatus: 400, Type: "invalid_request_error", Code: "amount_too_large"}, "amount_too_large", 0, true},
		{"already refunded", provider.Rejection{HTTPStatus: 400, Type: "invalid_request_error", Code: "charge_already_refunded"}, "charge_already_refunded", 0, true},
		{"card error", provider.Rejection{HTTPStatus: 402, Type: "card_error", Code: "card_declined", DeclineCode: "expired_card"}, "expired_card", 0, true},
		{"unknown parameter", provider.Rejection{HTTPStatus: 400, Type: "invalid_request_error", Code: "parameter_unknown"}, "", provider.ClassRejected, false},
		{"idempotency error", provider.Rejection{HTTPStatus: 400, Type: "idempotency_error"}, "", provider.ClassMismatch, false},
		{"key in use", provider.Rejection{HTTPStatus: 409, Type: "invalid_request_error", Code: "idempotency_key_in_use"}, "", provider.ClassUnknown, false},
		{"server error", provider.Rejection{HTTPStatus: 500, Type: "api_error"}, "", provider.ClassUnknown, false},
		{"rate limited", provider.Rejection{HTTPStatus: 429, Type: "invalid_request_error", Code: "rate_limit"}, "", provider.ClassRetryable, false},
		{"unauthorized", provider.Rejection{HTTPStatus: 401, Type: "authentication_error"}, "", provider.ClassUnauthorized, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, err := tt.r.Refusal()
			if tt.wantRefuse {
				if err != nil || code != tt.code {
					t.Fatalf("Refusal() = %q, %v; want %q", code, err, tt.code)
				}
				return
			}
			if code != "" {
				t.Fatalf("Refusal() code = %q, want an error", code)
			}
			wantClass(t, err, tt.wantClass)
		})
	}
}

// TestRefundVerdict: a refund is found by its own metadata among the
// payment's refunds; two under one key, or one of another amount, are
// never taken for it.
func TestRefundVerdict(t *testing.T) {
	t.Parallel()
	req := provider.RefundLookupRequest{ChargeID: "pi_1", MerchantID: "m_1", IdempotencyKey: "r1", Amount: 500}
	mine := &provider.RefundOutcome{RefundID: "re_1", Status: provider.RefundSucceeded, Amount: 500, MerchantID: "m_1", IdempotencyKey: "r1"}
	other := &provider.RefundOutcome{RefundID: "re_2", Status: provider.RefundSucceeded, Amount: 500, MerchantID: "m_1", IdempotencyKey: "r2"}
	otherMerchant := &provider.RefundOutcome{RefundID: "re_3", Status: provider.RefundSucceeded, Amount: 500, MerchantID: "m_2", IdempotencyKey: "r1"}

	res, err := provider.RefundVerdict(req, []*provider.RefundOutcome{other, mine, otherMerchant})
	if err != nil || !res.Found || res.Outcome != mine {
		t.Fatalf("verdict = %+v, %v; want re_1", res, err)
	}
	res, err = provider.RefundVerdict(req, []*provider.RefundOutcome{other, otherMerchant})
	if err != nil || res.Found {
		t.Fatalf("verdict without ours = %+v, %v; want not found", res, err)
	}
	twice := *mine
	twice.RefundID = "re_4"
	_, err = provider.RefundVerdict(req, []*provider.RefundOutcome{mine, &twice})
	wantClass(t, err, provider.ClassUnknown)
	bigger := *mine
	bigger.Amount = 900
	_, err = provider.RefundVerdict(req, []*provider.RefundOutcome{&bigger})
	if !errors.Is(err, provider.ErrForeignIntent) {
		t.Fatalf("verdict over another amount: %v, want ErrForeignIntent", err)
	}
}

// TestRefundHolds: a refund counts against what is left to refund unless
// it failed, was canceled or was refused.
func TestRefundHolds(t *testing.T) {
	t.Parallel()
	for status, want := range map[string]bool{
		provider.RefundPending: true, provider.RefundSucceeded: true, provider.RefundRequiresAction: true,
		provider.RefundFailed: false, provider.RefundCanceled: false,
	} {
		o := &provider.RefundOutcome{Status: status}
		if o.Holds() != want {
			t.Errorf("%s: Holds() = %v, want %v", status, o.Holds(), want)
		}
		if final := status == provider.RefundSucceeded || status == provider.RefundFailed || status == provider.RefundCanceled; o.Final() != final {
			t.Errorf("%s: Final() = %v, want %v", status, o.Final(), final)
		}
	}
	if (&provider.RefundOutcome{Refused: true}).Holds() {
		t.Error("a refused refund holds money")
	}
}
