package consumer_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/paydedup/paydedup/consumer"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/provider"
)

// TestCompletion pins the completion the worker stores for each kind of
// provider answer: the provider's status and body when it gave them, else
// 200, 202 or 402 and a summary of the answer.
func TestCompletion(t *testing.T) {
	t.Parallel()
	body := json.RawMessage(`{"id":"pi_1"}`)
	for _, tc := range []struct {
		name string
		out  provider.Outcome
		want ledger.Completion
	}{
		{"charged", provider.Outcome{ChargeID: "pi_1", Status: "succeeded"},
			ledger.Completion{ChargeID: "pi_1", ResponseStatus: 200, Response: json.RawMessage(`{"declined":false,"id":"pi_1","status":"succeeded"}`)}},
		{"charged with status and body", provider.Outcome{ChargeID: "pi_1", Status: "succeeded", HTTPStatus: 201, Response: body},
			ledger.Completion{ChargeID: "pi_1", ResponseStatus: 201, Response: body}},
		{"processing", provider.Outcome{ChargeID: "pi_1", Status: "processing", Processing: true},
			ledger.Completion{ChargeID: "pi_1", Processing: true, ResponseStatus: 202, Response: json.RawMessage(`{"declined":false,"id":"pi_1","status":"processing"}`)}},
		{"processing with status and body", provider.Outcome{ChargeID: "pi_1", Processing: true, HTTPStatus: 202, Response: body},
			ledger.Completion{ChargeID: "pi_1", Processing: true, ResponseStatus: 202, Response: body}},
		{"declined", provider.Outcome{Status: "requires_payment_method", Declined: true, DeclineCode: "card_declined"},
			ledger.Completion{Declined: true, ResponseStatus: 402, Response: json.RawMessage(`{"declined":true,"id":"","status":"requires_payment_method"}`)}},
		{"declined with status and body", provider.Outcome{ChargeID: "pi_1", Declined: true, HTTPStatus: 402, Response: body},
			ledger.Completion{ChargeID: "pi_1", Declined: true, ResponseStatus: 402, Response: body}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := consumer.Completion(&tc.out); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Completion(%+v)\n got %+v (%s)\nwant %+v (%s)", tc.out, got, got.Response, tc.want, tc.want.Response)
			}
		})
	}
}
