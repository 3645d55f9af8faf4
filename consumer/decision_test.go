package consumer

import (
	"errors"
	"testing"
	"time"

	"github.com/paydedup/paydedup/stream"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	const max = 5
	base, cap := time.Second, 30*time.Second
	cases := []struct {
		name       string
		r          Result
		deliveries uint64
		want       Action
	}{
		{"completed", Result{Kind: Completed}, 1, Action{Kind: Ack}},
		{"declined", Result{Kind: Declined}, 1, Action{Kind: Ack}},
		{"duplicate", Result{Kind: Duplicate}, 3, Action{Kind: Ack}},
		{"completed on the last delivery", Result{Kind: Completed}, max, Action{Kind: Ack}},
		{"in flight, first look soon", Result{Kind: InFlight, Delay: 7 * time.Second}, 1, Action{Kind: Nak, Delay: time.Second}},
		{"in flight, backing off", Result{Kind: InFlight, Delay: 7 * time.Second}, 3, Action{Kind: Nak, Delay: 4 * time.Second}},
		{"in flight, never past the lease", Result{Kind: InFlight, Delay: 3 * time.Second}, 4, Action{Kind: Nak, Delay: 3 * time.Second}},
		{"in flight, long lease left: the backoff decides", Result{Kind: InFlight, Delay: time.Hour}, 4, Action{Kind: Nak, Delay: 8 * time.Second}},
		{"retry with hint", Result{Kind: Retry, Delay: 2 * time.Second}, 2, Action{Kind: Nak, Delay: 2 * time.Second}},
		{"retry, first delivery backoff", Result{Kind: Retry}, 1, Action{Kind: Nak, Delay: time.Second}},
		{"retry, third delivery backoff", Result{Kind: Retry}, 3, Action{Kind: Nak, Delay: 4 * time.Second}},
		{"retry, fourth delivery backoff", Result{Kind: Retry}, 4, Action{Kind: Nak, Delay: 8 * time.Second}},
		{"retry on the last delivery", Result{Kind: Retry, Err: errors.New("503")}, max, Action{Kind: DeadLetterTerm, Reason: stream.ReasonMaxDeliveries}},
		{"in flight on the last delivery", Result{Kind: InFlight}, max, Action{Kind: DeadLetterTerm, Reason: stream.ReasonMaxDeliveries}},
		{"past the last delivery", Result{Kind: Retry}, max + 3, Action{Kind: DeadLetterTerm, Reason: stream.ReasonMaxDeliveries}},
		{"dead letter keeps its reason", Result{Kind: DeadLetter, Reason: stream.ReasonKeyReused}, 1, Action{Kind: DeadLetterTerm, Reason: stream.ReasonKeyReused}},
		{"dead letter on the last delivery keeps its reason", Result{Kind: DeadLetter, Reason: "invalid_amount"}, max, Action{Kind: DeadLetterTerm, Reason: "invalid_amount"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := decide(tc.r, tc.deliveries, max, base, cap); got != tc.want {
				t.Fatalf("decide = %+v, want %+v", got, tc.want)
			}
		})
	}
	if got := backoff(40, base, cap); got != cap {
		t.Fatalf("backoff(40) = %v, want the cap %v", got, cap)
	}
}
