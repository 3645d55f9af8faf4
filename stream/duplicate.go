package stream

import (
	"bytes"
	"context"
	"fmt"
	"math"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/payment"
)

// SameStored reports whether the message a duplicate PubAck points to
// (ack.Stream, ack.Sequence) is m. A duplicate PubAck only says that some
// message with m's Nats-Msg-Id was stored; it counts as m's only when the
// stored copy is m: the same subject and Paydedup-Replay-Of header, and
// either the same body and Idempotency-Key byte for byte, or the same
// payment command written otherwise (another field order or spacing:
// equal canonical encodings, what the fingerprint is made of). false with
// a nil error is a definite answer (another message holds the id); an
// error is unknown.
func SameStored(ctx context.Context, js jetstream.JetStream, ack *jetstream.PubAck, m *nats.Msg) (bool, error) {
	s, err := js.Stream(ctx, ack.Stream)
	if err != nil {
		return false, fmt.Errorf("stream %s: %w", ack.Stream, err)
	}
	got, err := s.GetMsg(ctx, ack.Sequence)
	if err != nil {
		return false, fmt.Errorf("read %s message %d: %w", ack.Stream, ack.Sequence, err)
	}
	if got.Subject != m.Subject || got.Header.Get(HeaderReplayOf) != m.Header.Get(HeaderReplayOf) {
		return false, nil
	}
	if bytes.Equal(got.Data, m.Data) && got.Header.Get(HeaderIdempotencyKey) == m.Header.Get(HeaderIdempotencyKey) {
		return true, nil
	}
	stored, err := comparableCommand(got.Header, got.Data)
	if err != nil {
		return false, nil
	}
	sent, err := comparableCommand(m.Header, m.Data)
	if err != nil {
		return false, nil
	}
	var storedBuf, sentBuf [512]byte
	return bytes.Equal(stored.AppendCanonical(storedBuf[:0]), sent.AppendCanonical(sentBuf[:0])), nil
}

// comparableCommand decodes a command with its Idempotency-Key header and no
// size or amount limit: it is compared, not judged.
func comparableCommand(h nats.Header, data []byte) (*payment.Command, error) {
	env := payment.Envelope{}
	if vals, ok := h[HeaderIdempotencyKey]; ok {
		env.HeaderKeySet = true
		if len(vals) > 0 {
			env.HeaderKey = vals[0]
		}
	}
	return payment.Decode(data, env, payment.Limits{MaxBodyBytes: math.MaxInt, MaxAmount: math.MaxInt64})
}
