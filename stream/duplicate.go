package stream

import (
	"bytes"
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// SameStored reports whether the message a duplicate PubAck points to
// (ack.Stream, ack.Sequence) is m: the same subject, the same body and the
// same Idempotency-Key and Paydedup-Replay-Of headers. A duplicate PubAck
// only says that some message with m's Nats-Msg-Id was stored; it counts as
// m's only when the stored copy is m. false with a nil error is a definite
// answer (another message holds the id); an error is unknown.
func SameStored(ctx context.Context, js jetstream.JetStream, ack *jetstream.PubAck, m *nats.Msg) (bool, error) {
	s, err := js.Stream(ctx, ack.Stream)
	if err != nil {
		return false, fmt.Errorf("stream %s: %w", ack.Stream, err)
	}
	got, err := s.GetMsg(ctx, ack.Sequence)
	if err != nil {
		return false, fmt.Errorf("read %s message %d: %w", ack.Stream, ack.Sequence, err)
	}
	return got.Subject == m.Subject && bytes.Equal(got.Data, m.Data) &&
		got.Header.Get(HeaderIdempotencyKey) == m.Header.Get(HeaderIdempotencyKey) &&
		got.Header.Get(HeaderReplayOf) == m.Header.Get(HeaderReplayOf), nil
}
