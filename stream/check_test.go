package stream_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// A command whose message the worker would read back as another command
// (here a description that is not UTF-8: the JSON encoder writes U+FFFD
// for its bad byte) is refused by Check, not published as something else.
func TestCheckRefusesAnotherCommandBack(t *testing.T) {
	t.Parallel()
	js, err := jetstream.New(testenv.NATSConn(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := testenv.Streams(t, js).WithDefaults()
	p, err := stream.NewCommandPublisher(js.Conn(), cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	good := &payment.Command{MerchantID: "m_1", IdempotencyKey: "k-1", Amount: 100, Currency: "usd",
		PaymentMethod: "pm_card_visa", Description: "order 42", Metadata: map[string]string{"a": "1"}}
	if err := p.Check(good, nil); err != nil {
		t.Fatalf("a valid command: %v", err)
	}
	bad := *good
	bad.Description = "order \xff"
	err = p.Check(&bad, nil)
	if err == nil || !strings.Contains(err.Error(), "another command") {
		t.Fatalf("a description that is not UTF-8: err = %v, want the message refused as another command", err)
	}
}
