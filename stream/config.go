// Package stream owns paydedup's JetStream topology and wire format: the
// payments stream, the dead-letter stream, the workers' durable consumer
// and the advisory stream of the max-deliveries net (EnsureStreams); the
// subject, headers and Nats-Msg-Id of a payment command (CommandMsg,
// MsgID) and its strict decoding (DecodeCommand), shared by the worker and
// the gateway's publisher so both accept the same messages; the dead-letter
// format (Letter, its HMAC in Dlq-Auth, ParseDeadLetter, the reasons); the
// publishers (Publisher, CommandPublisher); and the consumer's backlog
// (ConsumerState).
//
// It works with nats-server 2.9: one filter subject per consumer, no 2.10
// features.
package stream

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/paydedup/paydedup/payment"
)

// Defaults of Config.
const (
	DefaultStream          = "PAYMENTS"
	DefaultSubjectPrefix   = "payments.requests"
	DefaultDLQStream       = "PAYMENTS_DLQ"
	DefaultDLQPrefix       = "payments.dlq"
	DefaultDurable         = "paydedup-worker"
	DefaultOutcomeStream   = "PAYMENTS_OUTCOMES"
	DefaultOutcomePrefix   = "payments.outcomes"
	DefaultDuplicateWindow = 2 * time.Minute
	// DefaultStreamMaxBytes and DefaultStreamMaxMsgs bound the payments
	// stream. It keeps every command until a worker settles it (no max
	// age: a pause of any length must not delete one); when it is full it
	// refuses new publishes (DiscardNew), which the publisher sees.
	DefaultStreamMaxBytes int64 = 4 << 30
	DefaultStreamMaxMsgs  int64 = 10_000_000
	DefaultDLQMaxAge            = 14 * 24 * time.Hour
	DefaultAckWait              = 60 * time.Second
	DefaultMaxDeliver           = 20
	DefaultMaxAckPending        = 1000
)

// MinStreamMaxBytes is the smallest bound of the payments stream: room for
// a few of the largest messages the server accepts.
const MinStreamMaxBytes = 1 << 20

// Config is the topology: the streams, their subjects, the durable
// consumer, the dead-letter key and the limits a command's message must
// keep. Zero values take the defaults; Validate reports contradictions by
// the setting's name.
type Config struct {
	Name          string // the payments stream
	SubjectPrefix string // publishers use <prefix>.<merchant_id>
	DLQStream     string
	DLQPrefix     string // dead letters go to <prefix>.<reason>
	// AdvisoryStream captures the durable consumer's MAX_DELIVERIES
	// advisories for the max-deliveries net; <Name>_MAXDELIVER by default.
	AdvisoryStream  string
	Durable         string
	DuplicateWindow time.Duration
	// OutcomeStream holds the payments' outcome events, relayed from the
	// outbox on <OutcomePrefix>.<merchant_id> (EnsureOutcomeStream).
	OutcomeStream string
	OutcomePrefix string
	// StreamMaxBytes and StreamMaxMsgs bound the payments stream. There is
	// no max age: a command stays until a worker settles it, however long
	// the workers pause; a full stream refuses the publish instead
	// (ErrStreamFull), so the publisher's client learns it was not stored.
	StreamMaxBytes int64
	StreamMaxMsgs  int64
	DLQMaxAge      time.Duration
	Replicas       int
	// DLQKey authenticates dead letters (Dlq-Auth): the workers sign what
	// they file, and replay refuses what does not verify. At least
	// MinDLQKeyLen bytes; the worker refuses to start without it.
	DLQKey []byte
	// DLQPreviousKeys verify dead letters too, and never sign: the keys
	// DLQKey replaced, kept while letters signed with them may still be
	// replayed (the rotation in docs/operations.md). Each at least
	// MinDLQKeyLen bytes.
	DLQPreviousKeys [][]byte

	// AckWait, MaxDeliver, BackOff and MaxAckPending configure the durable
	// consumer.
	AckWait       time.Duration
	MaxDeliver    int
	BackOff       []time.Duration // optional redelivery schedule after AckWait timeouts
	MaxAckPending int

	// Limits bound a payment command's body and amount: the worker decodes
	// with them and the gateway's publisher checks with them, so both
	// accept the same messages.
	Limits payment.Limits
}

// WithDefaults returns c with every zero value replaced by its default.
func (c Config) WithDefaults() Config {
	c.Name = cmp.Or(c.Name, DefaultStream)
	c.SubjectPrefix = cmp.Or(c.SubjectPrefix, DefaultSubjectPrefix)
	c.DLQStream = cmp.Or(c.DLQStream, DefaultDLQStream)
	c.DLQPrefix = cmp.Or(c.DLQPrefix, DefaultDLQPrefix)
	c.AdvisoryStream = cmp.Or(c.AdvisoryStream, c.Name+"_MAXDELIVER")
	c.Durable = cmp.Or(c.Durable, DefaultDurable)
	c.OutcomeStream = cmp.Or(c.OutcomeStream, DefaultOutcomeStream)
	c.OutcomePrefix = cmp.Or(c.OutcomePrefix, DefaultOutcomePrefix)
	c.DuplicateWindow = cmp.Or(c.DuplicateWindow, DefaultDuplicateWindow)
	c.StreamMaxBytes = cmp.Or(c.StreamMaxBytes, DefaultStreamMaxBytes)
	c.StreamMaxMsgs = cmp.Or(c.StreamMaxMsgs, DefaultStreamMaxMsgs)
	c.DLQMaxAge = cmp.Or(c.DLQMaxAge, DefaultDLQMaxAge)
	c.Replicas = cmp.Or(c.Replicas, 1)
	c.AckWait = cmp.Or(c.AckWait, DefaultAckWait)
	c.MaxDeliver = cmp.Or(c.MaxDeliver, DefaultMaxDeliver)
	c.MaxAckPending = cmp.Or(c.MaxAckPending, DefaultMaxAckPending)
	return c
}

// Validate checks that the topology is coherent. Errors name the setting
// to fix. The worker's settings that must nest with it (the lease within
// AckWait, the key retention beyond the redelivery schedule) are checked
// by the consumer's configuration.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for name, d := range map[string]time.Duration{
		"duplicate window": c.DuplicateWindow, "DLQ max age": c.DLQMaxAge,
		"ack wait": c.AckWait,
	} {
		if d <= 0 {
			bad("%s must be positive, got %v", name, d)
		}
	}
	if c.MaxDeliver < 2 {
		bad("max deliver must be at least 2 (the last delivery is used to dead-letter), got %d", c.MaxDeliver)
	}
	if len(c.BackOff) > 0 && c.MaxDeliver <= len(c.BackOff) {
		bad("max deliver (%d) must exceed the number of backoff steps (%d)", c.MaxDeliver, len(c.BackOff))
	}
	if c.StreamMaxBytes < MinStreamMaxBytes {
		bad("stream max bytes must be at least %d, got %d", MinStreamMaxBytes, c.StreamMaxBytes)
	}
	if c.StreamMaxMsgs < 1 {
		bad("stream max msgs must be at least 1, got %d", c.StreamMaxMsgs)
	}
	return errors.Join(errs...)
}

// DLQSubject is the subject of a dead letter with this reason:
// <DLQPrefix>.<reason as one subject token>.
func (c Config) DLQSubject(reason string) string { return c.DLQPrefix + "." + subjectToken(reason) }
