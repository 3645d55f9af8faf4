package ledger_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
)

// TestCompletionOf: the completion stored for each kind of provider answer
// is the provider's status and body when it gave them, else 200, 202 or 402;
// without a body the worker (SummaryIfNoBody) stores a summary of the
// answer, the reconciler and the settle path (ProviderBodyOnly) nothing.
func TestCompletionOf(t *testing.T) {
	t.Parallel()
	body := json.RawMessage(`{"id":"pi_1"}`)
	for _, tc := range []struct {
		name    string
		out     provider.Outcome
		want    ledger.Completion // with ProviderBodyOnly
		summary string            // the body SummaryIfNoBody adds, if any
	}{
		{"charged", provider.Outcome{ChargeID: "pi_1", Status: "succeeded"},
			ledger.Completion{ChargeID: "pi_1", ResponseStatus: 200}, `{"declined":false,"id":"pi_1","status":"succeeded"}`},
		{"charged with status and body", provider.Outcome{ChargeID: "pi_1", Status: "succeeded", HTTPStatus: 201, Response: body},
			ledger.Completion{ChargeID: "pi_1", ResponseStatus: 201, Response: body}, ""},
		{"processing", provider.Outcome{ChargeID: "pi_1", Status: "processing", Processing: true},
			ledger.Completion{ChargeID: "pi_1", Processing: true, ResponseStatus: 202}, `{"declined":false,"id":"pi_1","status":"processing"}`},
		{"processing with status and body", provider.Outcome{ChargeID: "pi_1", Processing: true, HTTPStatus: 202, Response: body},
			ledger.Completion{ChargeID: "pi_1", Processing: true, ResponseStatus: 202, Response: body}, ""},
		{"declined", provider.Outcome{Status: "requires_payment_method", Declined: true, DeclineCode: "card_declined"},
			ledger.Completion{Declined: true, ResponseStatus: 402}, `{"declined":true,"id":"","status":"requires_payment_method"}`},
		{"declined with status and body", provider.Outcome{ChargeID: "pi_1", Declined: true, HTTPStatus: 402, Response: body},
			ledger.Completion{ChargeID: "pi_1", Declined: true, ResponseStatus: 402, Response: body}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := ledger.CompletionOf(&tc.out, ledger.ProviderBodyOnly); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ProviderBodyOnly\n got %+v (%s)\nwant %+v (%s)", got, got.Response, tc.want, tc.want.Response)
			}
			want := tc.want
			if tc.summary != "" {
				want.Response = json.RawMessage(tc.summary)
			}
			if got := ledger.CompletionOf(&tc.out, ledger.SummaryIfNoBody); !reflect.DeepEqual(got, want) {
				t.Errorf("SummaryIfNoBody\n got %+v (%s)\nwant %+v (%s)", got, got.Response, want, want.Response)
			}
		})
	}
}

// TestSettleStatus: what a processing payment settles to once the
// provider's answer is final: failed and 402 for a decline, succeeded and
// 200 for a charge, the provider's own status over either.
func TestSettleStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		declined   bool
		httpStatus int
		status     string
		code       int
	}{
		{false, 0, ledger.PaymentSucceeded, 200},
		{false, 201, ledger.PaymentSucceeded, 201},
		{true, 0, ledger.PaymentFailed, 402},
		{true, 400, ledger.PaymentFailed, 400},
	} {
		c := ledger.CompletionOf(&provider.Outcome{ChargeID: "pi_1", Declined: tc.declined, HTTPStatus: tc.httpStatus}, ledger.ProviderBodyOnly)
		if status := c.SettleStatus(); status != tc.status || c.ResponseStatus != tc.code {
			t.Errorf("settle (declined %v, HTTP %d) = %s, %d; want %s, %d", tc.declined, tc.httpStatus, status, c.ResponseStatus, tc.status, tc.code)
		}
	}
}
