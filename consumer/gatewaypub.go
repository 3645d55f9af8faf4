package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/payment"
)

// DefaultPublishTimeout bounds one publish and its PubAck.
const DefaultPublishTimeout = 5 * time.Second

// CommandPublisher publishes validated payment commands the way the worker
// expects them: on <SubjectPrefix>.<merchant_id>, with Nats-Msg-Id
// <merchant_id>:<idempotency_key> (the stream's duplicate window drops quick
// double publishes) and the Idempotency-Key header, waiting for the PubAck
// of the configured stream. The HTTP gateway uses it.
type CommandPublisher struct {
	js      jetstream.JetStream
	cfg     Config
	timeout time.Duration
}

// NewCommandPublisher returns a publisher for cfg's stream and subject
// prefix (the worker's). It does not create the stream: the worker owns its
// configuration; Ready reports whether it exists.
func NewCommandPublisher(nc *nats.Conn, cfg Config, timeout time.Duration) (*CommandPublisher, error) {
	if nc == nil {
		return nil, errors.New("command publisher: nil NATS connection")
	}
	if timeout < 0 {
		return nil, fmt.Errorf("command publisher: timeout must not be negative, got %v", timeout)
	}
	cfg = cfg.WithDefaults()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if timeout == 0 {
		timeout = DefaultPublishTimeout
	}
	return &CommandPublisher{js: js, cfg: cfg, timeout: timeout}, nil
}

// Publish publishes cmd, with the extra headers given (e.g. W3C
// traceparent and tracestate, so the worker's trace continues the HTTP
// request's), and returns once the stream acknowledged it. A duplicate
// inside the stream's window is acknowledged too: the first copy is stored.
func (p *CommandPublisher) Publish(ctx context.Context, cmd *payment.Command, extra map[string]string) error {
	if cmd == nil {
		return errors.New("publish command: nil command")
	}
	data, err := json.Marshal(cmd)
	if err != nil {
		return fmt.Errorf("publish command: %w", err)
	}
	m := CommandMsg(p.cfg, cmd.MerchantID, cmd.IdempotencyKey, data)
	for k, v := range extra {
		if v != "" && m.Header.Get(k) == "" {
			m.Header.Set(k, v)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	if _, err := p.js.PublishMsg(ctx, m, jetstream.WithExpectStream(p.cfg.Stream)); err != nil {
		return fmt.Errorf("publish command to %s: %w", p.cfg.Stream, err)
	}
	return nil
}

// Ready reports whether the stream exists (the worker creates it).
func (p *CommandPublisher) Ready(ctx context.Context) error {
	if _, err := p.js.Stream(ctx, p.cfg.Stream); err != nil {
		return fmt.Errorf("stream %s: %w", p.cfg.Stream, err)
	}
	return nil
}
