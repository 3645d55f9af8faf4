package consumer

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// markRecorder records the dead letters told to the gateway's intake.
type markRecorder struct {
	marked []string
}

func (m *markRecorder) MarkIntakeDeadLettered(_ context.Context, _, _ string, _ uint64, reason, _ string) (bool, error) {
	m.marked = append(m.marked, reason)
	return true, nil
}

// TestIntakeLearnsOnlyFinalDeadLetters: the gateway answers a dead-lettered
// key as final ("send a corrected payment with a new key"). That is true of
// bad input and a reused key, which a replay would dead-letter again; it is
// false of a letter that waits for an operator: a max_deliveries letter is
// replayed and may then charge, and a ledger conflict or a provider
// idempotency mismatch may stand beside a charge. Told "final" for those, a
// client pays again under a new key.
func TestIntakeLearnsOnlyFinalDeadLetters(t *testing.T) {
	cases := []struct {
		reason string
		final  bool
	}{
		{string(payment.ReasonMalformedJSON), true},
		{string(payment.ReasonKeyMismatch), true},
		{string(payment.ReasonBodyTooLarge), true},
		{stream.ReasonKeyReused, true},
		{stream.ReasonMaxDeliveries, false},
		{stream.ReasonLedgerConflict, false},
		{stream.ReasonProviderMismatch, false},
	}
	for _, c := range cases {
		rec := &markRecorder{}
		w := &Worker{cfg: Config{}.WithDefaults(), intake: rec}
		in := inbound{
			meta: &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: 7}},
			cmd:  &payment.Command{MerchantID: "m_1", IdempotencyKey: "k"},
		}
		w.deadLetteredIntake(context.Background(), &in, c.reason, errors.New("x"), slog.New(slog.DiscardHandler))
		if got := len(rec.marked) == 1; got != c.final {
			t.Errorf("dead letter %s: intake marked final = %v, want %v", c.reason, got, c.final)
		}
	}
}
