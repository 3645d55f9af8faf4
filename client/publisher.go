package client

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// PublisherConfig configures a Publisher. Zero values take the defaults.
type PublisherConfig struct {
	// MerchantID is the merchant of every payment published: the subject's
	// last token (payments.requests.<merchant_id>) and the scope of keys.
	MerchantID string
	// Stream is the payments stream's topology and the workers' limits
	// (stream.Config's defaults: PAYMENTS on payments.requests.>).
	Stream stream.Config
	// Timeout bounds one publish and its PubAck, retries with the same
	// message id included (stream.DefaultPublishTimeout).
	Timeout time.Duration
	// RetryFor is how long a publish whose PubAck did not come is sent
	// again, the same message (DefaultRetryFor). It must be shorter than
	// the stream's duplicate window (Stream.DuplicateWindow, 2 min by
	// default: state the stream's own), which drops the copies that did
	// land; NewPublisher refuses a longer one.
	RetryFor time.Duration
}

// Publisher publishes payment commands on the payments stream, as the
// workers expect them. Safe for concurrent use.
type Publisher struct {
	pub      *stream.CommandPublisher
	merchant string
	retryFor time.Duration
	keys     keyBook
}

// Published is where the stream holds a published command.
type Published struct {
	Stream string
	Seq    uint64
	// Duplicate: the stream's duplicate window dropped this publish as a
	// copy of the same command, stored earlier under its Nats-Msg-Id (a
	// retry after a lost PubAck, or a second publish of one payment). The
	// command is stored once.
	Duplicate bool
}

// NewPublisher returns a publisher on nc. It does not create the stream:
// the workers own it (`paydedup worker` creates it).
func NewPublisher(nc *nats.Conn, cfg PublisherConfig) (*Publisher, error) {
	if cfg.MerchantID == "" {
		return nil, errors.New("client: publisher: a merchant id is required")
	}
	if cfg.RetryFor < 0 {
		return nil, fmt.Errorf("client: publisher: RetryFor must not be negative, got %v", cfg.RetryFor)
	}
	pub, err := stream.NewCommandPublisher(nc, cfg.Stream, cfg.Timeout)
	if err != nil {
		return nil, fmt.Errorf("client: publisher: %w", err)
	}
	cfg.RetryFor = cmp.Or(cfg.RetryFor, DefaultRetryFor)
	// A copy sent after the window is stored again under the same
	// Nats-Msg-Id: the worker's claim charges the key once, but the
	// stream holds two commands.
	if window := cfg.Stream.WithDefaults().DuplicateWindow; cfg.RetryFor >= window {
		return nil, fmt.Errorf("client: publisher: RetryFor %v must be shorter than the stream's duplicate window %v", cfg.RetryFor, window)
	}
	return &Publisher{pub: pub, merchant: cfg.MerchantID, retryFor: cfg.RetryFor}, nil
}

// Publish publishes payment p under key on payments.requests.<merchant>
// with Nats-Msg-Id <merchant>:<key>, checked first as the worker will
// decode it, and awaits its PubAck. A publish with no PubAck is sent again,
// the same message, until RetryFor passes or ctx ends; then the error is
// ErrOutcomeUnknown (it may be stored: publish it again later, same key
// and payment). A refusal (nothing stored) is returned as is: a command
// the worker would refuse (a *payment.ValidationError), a full or missing
// stream (stream.ErrStreamFull, stream.ErrStreamMissing), or another
// command holding the key's message id (ErrKeyReused, with
// stream.ErrMsgIDTaken). But once a publish of key may have been stored
// (an ErrOutcomeUnknown, in this call or an earlier one), a refusal says
// nothing of that copy: it is ErrOutcomeUnknown, the refusal in its
// message, until Forget. A key this Publisher published with another
// payment is refused with ErrKeyReused before anything is sent.
func (p *Publisher) Publish(ctx context.Context, key string, pay Payment) (Published, error) {
	cmd := &payment.Command{MerchantID: p.merchant, IdempotencyKey: key, Amount: pay.Amount, Currency: pay.Currency,
		PaymentMethod: pay.PaymentMethod, Description: pay.Description, Metadata: pay.Metadata}
	switch pay.CaptureMethod {
	case "", "automatic":
	case "manual":
		cmd.Kind = payment.KindAuthorize
	default:
		return Published{}, &payment.ValidationError{Reason: payment.ReasonInvalidKind, Field: "capture_method",
			Msg: fmt.Sprintf("%q is not automatic or manual", pay.CaptureMethod)}
	}
	body, err := stream.EncodeCommand(cmd)
	if err != nil {
		return Published{}, fmt.Errorf("client: %w", err)
	}
	fresh, mayBeStored, err := p.keys.bind(key, sha256.Sum256(body))
	if err != nil {
		return Published{}, err
	}
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = 100*time.Millisecond, 2*time.Second
	res, err := backoff.Retry(ctx, func() (Published, error) {
		ack, err := p.pub.PublishAck(ctx, cmd, nil)
		switch {
		case err == nil:
			return Published{Stream: ack.Stream, Seq: ack.Seq, Duplicate: ack.Duplicate}, nil
		case errors.Is(err, stream.ErrMsgIDTaken):
			return Published{}, backoff.Permanent(fmt.Errorf("client: key %q: %w: %w", key, ErrKeyReused, err))
		case stream.Refused(err):
			return Published{}, backoff.Permanent(fmt.Errorf("client: %w", err))
		}
		mayBeStored = true // no PubAck: it may be stored
		return Published{}, fmt.Errorf("client: %w", err)
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(p.retryFor))
	if mayBeStored {
		p.keys.mayBe(key)
	}
	switch {
	case err == nil, errors.Is(err, ErrKeyReused):
	case stream.Refused(err) && !mayBeStored:
		if fresh {
			p.keys.forget(key) // nothing stored: the key holds nothing
		}
	default: // no PubAck now or before: it may be stored
		err = outcomeUnknown(err)
	}
	return res, err
}

// Forget drops what the Publisher remembers of key (see Client.Forget).
func (p *Publisher) Forget(key string) { p.keys.forget(key) }
