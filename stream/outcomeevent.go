package stream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/ledger"
)

// OutcomeSchema is the version of the outcome event's JSON (OutcomeEvent):
// a field may be added under it, never removed or changed.
const OutcomeSchema = "paydedup.outcome.v1"

// OutcomeDuplicateWindow is the outcomes stream's duplicate window: a relay
// that published an event and lost the PubAck, or died before marking it,
// publishes it again under the same Nats-Msg-Id within it (the next pass,
// or another worker's once the dead one's transaction is gone), and the
// stream stores it once.
const OutcomeDuplicateWindow = 10 * time.Minute

// OutcomeMaxAge is how long the outcomes stream keeps an event for its
// subscribers.
const OutcomeMaxAge = 7 * 24 * time.Hour

// OutcomeEvent is the body of a message on the outcomes stream: one final
// outcome of one payment, a command the worker refused (kind refused,
// seq 0), or one filed for an operator (kind waiting_for_operator, seq 0,
// not final; docs/message-contract.md, "Outcome events").
type OutcomeEvent struct {
	Schema         string    `json:"schema"`
	EventID        string    `json:"event_id"`
	MerchantID     string    `json:"merchant_id"`
	IdempotencyKey string    `json:"idempotency_key"`
	Seq            int       `json:"seq"`
	Kind           string    `json:"kind"`
	Status         string    `json:"status"`
	Amount         int64     `json:"amount"`
	Currency       string    `json:"currency"`
	ChargeID       string    `json:"charge_id,omitempty"`
	Reason         string    `json:"reason,omitempty"`
	OccurredAt     time.Time `json:"occurred_at"`
}

// NewOutcomeEvent is the message body of the outbox's event e.
func NewOutcomeEvent(e ledger.OutcomeEvent) OutcomeEvent {
	return OutcomeEvent{Schema: OutcomeSchema, EventID: e.EventID, MerchantID: e.MerchantID, IdempotencyKey: e.IdempotencyKey,
		Seq: e.Seq, Kind: e.Kind, Status: e.Status, Amount: e.Amount, Currency: e.Currency, ChargeID: e.ChargeID,
		Reason: e.Reason, OccurredAt: e.OccurredAt.UTC()}
}

// OutcomeSubject is the subject of a merchant's outcome events.
func (c Config) OutcomeSubject(merchantID string) string {
	return c.WithDefaults().OutcomePrefix + "." + subjectToken(merchantID)
}

// OutcomeMsg is the message of event e: its JSON on the merchant's
// subject, with Nats-Msg-Id = the event id.
func OutcomeMsg(cfg Config, e ledger.OutcomeEvent) (*nats.Msg, error) {
	body, err := json.Marshal(NewOutcomeEvent(e))
	if err != nil {
		return nil, fmt.Errorf("encode outcome event %s: %w", e.EventID, err)
	}
	m := nats.NewMsg(cfg.OutcomeSubject(e.MerchantID))
	m.Data = body
	m.Header.Set(nats.MsgIdHdr, e.EventID)
	return m, nil
}

// DecodeOutcomeEvent reads an outcome event's body; it refuses another
// schema's.
func DecodeOutcomeEvent(body []byte) (OutcomeEvent, error) {
	var e OutcomeEvent
	if err := json.Unmarshal(body, &e); err != nil {
		return e, fmt.Errorf("decode outcome event: %w", err)
	}
	if e.Schema != OutcomeSchema {
		return e, fmt.Errorf("decode outcome event: schema %q, want %q", e.Schema, OutcomeSchema)
	}
	return e, nil
}

// EnsureOutcomeStream creates or updates the outcomes stream: subjects
// <OutcomePrefix>.>, kept OutcomeMaxAge, with a duplicate window of
// OutcomeDuplicateWindow (never narrowed).
func EnsureOutcomeStream(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Stream, error) {
	cfg = cfg.WithDefaults()
	want := jetstream.StreamConfig{
		Name:        cfg.OutcomeStream,
		Description: "paydedup outcome events: one per final outcome of a payment, Nats-Msg-Id = event_id",
		Subjects:    []string{cfg.OutcomePrefix + ".>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      OutcomeMaxAge,
		Duplicates:  OutcomeDuplicateWindow,
		Replicas:    cfg.Replicas,
	}
	if cur, err := js.Stream(ctx, cfg.OutcomeStream); err == nil {
		want.Duplicates = max(want.Duplicates, cur.CachedInfo().Config.Duplicates)
		want.MaxAge = max(want.MaxAge, cur.CachedInfo().Config.MaxAge)
	} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("read stream %s: %w", cfg.OutcomeStream, err)
	}
	s, err := js.CreateOrUpdateStream(ctx, want)
	if err != nil {
		return nil, fmt.Errorf("create stream %s: %w", cfg.OutcomeStream, err)
	}
	return s, nil
}

// OutcomePublisher publishes outbox events to the outcomes stream.
type OutcomePublisher struct {
	js         jetstream.JetStream
	cfg        Config
	ackTimeout time.Duration
}

// NewOutcomePublisher returns a publisher on js; ackTimeout bounds the wait
// for a batch's PubAcks (DefaultPublishAckTimeout when zero).
func NewOutcomePublisher(js jetstream.JetStream, cfg Config, ackTimeout time.Duration) *OutcomePublisher {
	if ackTimeout <= 0 {
		ackTimeout = DefaultPublishAckTimeout
	}
	return &OutcomePublisher{js: js, cfg: cfg.WithDefaults(), ackTimeout: ackTimeout}
}

// PublishOutcomes sends events in order (one connection: the stream stores
// them in that order) and waits for each PubAck: done[i] is true when the
// stream acknowledged events[i], stored now or kept from an earlier
// publish under its id (a duplicate). An event without a PubAck is not
// done; it may be stored, and its next publish under the same id is then
// dropped as a duplicate. The error is only for a batch that could not be
// sent at all.
func (p *OutcomePublisher) PublishOutcomes(ctx context.Context, events []ledger.OutcomeEvent) ([]bool, error) {
	done := make([]bool, len(events))
	futures := make([]jetstream.PubAckFuture, len(events))
	for i, e := range events {
		m, err := OutcomeMsg(p.cfg, e)
		if err != nil {
			return nil, err
		}
		f, err := p.js.PublishMsgAsync(m, jetstream.WithExpectStream(p.cfg.OutcomeStream))
		if err != nil {
			break // the rest is sent on the next pass, after this prefix
		}
		futures[i] = f
	}
	timer := time.NewTimer(p.ackTimeout)
	defer timer.Stop()
	for i, f := range futures {
		if f == nil {
			break
		}
		select {
		case <-f.Ok():
			done[i] = true
		case <-f.Err():
		case <-timer.C:
			return done, nil
		case <-ctx.Done():
			return done, nil
		}
	}
	return done, nil
}
