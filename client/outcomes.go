package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// OutcomeEvent is one event of the outcomes stream: a payment's or an
// operation's final outcome, a refused command, or one filed for an
// operator (docs/message-contract.md, "Outcome events").
type OutcomeEvent = stream.OutcomeEvent

// OutcomesConfig configures FollowOutcomes. Zero values take the defaults.
type OutcomesConfig struct {
	// MerchantID is the merchant whose events are followed
	// (payments.outcomes.<merchant_id>).
	MerchantID string
	// Stream is the streams' topology (stream.Config's defaults: the
	// outcomes stream PAYMENT_OUTCOMES on payments.outcomes.>).
	Stream stream.Config
	// After resumes after the stream sequence of the last event the
	// caller handled and stored; 0 starts at the oldest event the stream
	// keeps (7 days).
	After uint64
}

// FollowOutcomes calls handle with each outcome event of the merchant and
// its stream sequence, in the stream's order, until ctx ends (it then
// returns nil) or handle returns an error (returned). The workers publish
// each event under its event_id as the message id, so the stream stores
// it once; a relay that lost a PubAck past the duplicate window may still
// publish it again: handle each event_id once (store it with what the
// event changes, in one transaction), and store seq to resume with After.
// A message that is not an event of this schema is an error naming its
// sequence: nothing is skipped silently.
func FollowOutcomes(ctx context.Context, nc *nats.Conn, cfg OutcomesConfig, handle func(seq uint64, e OutcomeEvent) error) error {
	if err := payment.ValidateMerchant(cfg.MerchantID); err != nil {
		return fmt.Errorf("follow outcomes: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("follow outcomes: %w", err)
	}
	scfg := cfg.Stream.WithDefaults()
	occ := jetstream.OrderedConsumerConfig{FilterSubjects: []string{scfg.OutcomeSubject(cfg.MerchantID)},
		DeliverPolicy: jetstream.DeliverAllPolicy}
	if cfg.After > 0 {
		occ.DeliverPolicy, occ.OptStartSeq = jetstream.DeliverByStartSequencePolicy, cfg.After+1
	}
	cons, err := js.OrderedConsumer(ctx, scfg.OutcomeStream, occ)
	if err != nil {
		return fmt.Errorf("follow stream %s: %w", scfg.OutcomeStream, err)
	}
	for {
		m, err := cons.Next(jetstream.FetchMaxWait(time.Second))
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoMessages) {
			continue
		}
		if err != nil {
			return fmt.Errorf("follow stream %s: %w", scfg.OutcomeStream, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("follow stream %s: %w", scfg.OutcomeStream, err)
		}
		e, err := stream.DecodeOutcomeEvent(m.Data())
		if err != nil {
			return fmt.Errorf("stream %s message %d: %w", scfg.OutcomeStream, meta.Sequence.Stream, err)
		}
		if err := handle(meta.Sequence.Stream, e); err != nil {
			return err
		}
	}
}
