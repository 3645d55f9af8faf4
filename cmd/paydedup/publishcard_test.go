package main

import (
	"strings"
	"testing"
)

// paydedup publish refuses a line holding card data: it names the line and
// the field, never the number, publishes nothing of it, and exits non-zero
// saying why; the other lines are published. Before the door, the lines
// were published with the number (and a key holding one as Nats-Msg-Id).
func TestPublishRefusesCardData(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, "", true)
	lines := []string{
		`{"merchant_id":"m_1","idempotency_key":"k-1","amount":1999,"currency":"usd","payment_method":"pm_card_visa"}`,
		`{"merchant_id":"m_1","idempotency_key":"k-2","amount":1999,"currency":"usd","payment_method":"pm_card_visa","description":"card 4111 1111 1111 1111"}`,
		`{"merchant_id":"m_1","idempotency_key":"4111111111111111","amount":1999,"currency":"usd","payment_method":"pm_card_visa"}`,
		`{"merchant_id":"m_1","idempotency_key":"k-4","amount":1999,"currency":"usd","payment_method":"pm_card_visa","metadata":{"pan":"5555-5555-5555-4444"}}`,
		`{"merchant_id":"m_1","idempotency_key":"k-5","amount":0,"currency":"usd","payment_method":"pm_card_visa"}`,
	}
	out, errOut, err := w.run(strings.Join(lines, "\n")+"\n", "publish")
	if err == nil {
		t.Fatal("publish with card data exited zero")
	}
	for _, want := range []string{
		"line 2 refused, not published: card_data: description:",
		"line 3 refused, not published: card_data: idempotency_key:",
		"line 4 refused, not published: card_data: metadata.pan:",
		"line 5 skipped: invalid_amount",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr does not say %q:\n%s", want, errOut)
		}
	}
	if !strings.Contains(err.Error(), "3 lines refused for card data") || !strings.Contains(err.Error(), "1 malformed lines skipped") {
		t.Errorf("error: %v", err)
	}
	for _, s := range []string{out, errOut, err.Error()} {
		for _, n := range []string{"4111", "5555"} {
			if strings.Contains(s, n) {
				t.Errorf("the output shows the card number:\n%s", s)
			}
		}
	}
	msgs := w.streamMsgs()
	if len(msgs) != 1 || string(msgs[0].Data) != lines[0] {
		t.Fatalf("%d messages in the stream, want only line 1", len(msgs))
	}
}
