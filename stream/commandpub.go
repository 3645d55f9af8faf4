package stream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/textproto"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/payment"
)

// DefaultPublishTimeout bounds one publish and its PubAck.
const DefaultPublishTimeout = 5 * time.Second

// A publish has three outcomes: done (a PubAck for this command), refused
// (the stream provably stored nothing of it) and unknown (anything else:
// no PubAck within the timeout, a dropped connection, no responders
// during a leader change, a context ended after the send), which means
// the command may be stored. Publish and PublishBatch wrap every refusal
// in ErrRefused; every other error they return is an unknown outcome.
var (
	// ErrRefused marks a publish the stream provably did not store: the
	// message could not be built or failed the worker's check, the client
	// refused it before sending it, the server answered with a JetStream
	// API error (4xx), the stream does not exist (ErrStreamMissing), or
	// another message holds its Nats-Msg-Id (ErrMsgIDTaken).
	ErrRefused = errors.New("refused, nothing stored")
	// ErrStreamMissing: the payments stream does not exist (the worker
	// creates it). A refusal.
	ErrStreamMissing = errors.New("the payments stream does not exist; start a worker (`paydedup worker` creates the streams)")
	// ErrMsgIDTaken: the PubAck was a duplicate's, and the message stored
	// under the command's Nats-Msg-Id is another command (e.g. one
	// `paydedup publish` put on the queue with the same merchant and key):
	// the stream dropped this one. A refusal.
	ErrMsgIDTaken = errors.New("another command holds this command's Nats-Msg-Id in the stream's duplicate window")
	// ErrStreamFull: the payments stream holds its bound of messages or
	// bytes (Config.StreamMaxMsgs, StreamMaxBytes) and refuses new ones
	// (DiscardNew): it sheds at the door, never a stored command. A
	// refusal.
	ErrStreamFull = errors.New("the payments stream is full; it refuses new commands until the workers settle the ones it holds")
)

// Refused reports whether err, from Publish or PublishBatch, is a refusal:
// nothing of the command was stored. Any other error is an unknown
// outcome.
func Refused(err error) bool { return errors.Is(err, ErrRefused) }

// refusal wraps err as a refusal.
func refusal(err error) error {
	if StreamFull(err) && !errors.Is(err, ErrStreamFull) {
		return fmt.Errorf("%w: %w: %w", ErrRefused, ErrStreamFull, err)
	}
	return fmt.Errorf("%w: %w", ErrRefused, err)
}

// jsErrCodeStreamStoreFailed is the server's JSStreamStoreFailedF, which
// nats.go does not name.
const jsErrCodeStreamStoreFailed jetstream.ErrorCode = 10077

// StreamFull reports whether err is a stream's refusal of a message
// because it holds its bound (JetStream's store error 10077, "maximum
// messages exceeded" or "maximum bytes exceeded", answered 503 under
// DiscardNew): nothing was stored.
func StreamFull(err error) bool {
	if errors.Is(err, ErrStreamFull) {
		return true
	}
	var api *jetstream.APIError
	if !errors.As(err, &api) || api.ErrorCode != jsErrCodeStreamStoreFailed {
		return false
	}
	return strings.Contains(api.Description, "maximum messages exceeded") || strings.Contains(api.Description, "maximum bytes exceeded")
}

// refusedBeforeSend reports whether a publish error proves nothing was
// stored: the client refused the message before sending it, or the
// server answered with a JetStream API error of the request (4xx).
func refusedBeforeSend(err error) bool {
	if errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadSubject) || errors.Is(err, jetstream.ErrInvalidOption) {
		return true
	}
	if StreamFull(err) {
		return true
	}
	var api *jetstream.APIError
	return errors.As(err, &api) && api.Code >= 400 && api.Code < 500
}

// CommandPublisher publishes validated payment commands the way the worker
// expects them: on <SubjectPrefix>.<merchant_id>, with Nats-Msg-Id
// <merchant_id>:<idempotency_key> (the stream's duplicate window drops quick
// double publishes) and the Idempotency-Key header, waiting for the PubAck
// of the configured stream. The HTTP gateway uses it.
//
// Every message is built once and decoded as the worker will decode it
// (the header values as NATS delivers them, the worker's limits from the
// Config) before it is published, so what the gateway accepts is what the
// worker accepts: a command the worker would dead-letter is refused with
// the same *payment.ValidationError instead.
type CommandPublisher struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	async   jetstream.JetStream // PublishBatch's: its PubAck futures time out with a try
	cfg     Config
	timeout time.Duration
}

// NewCommandPublisher returns a publisher for cfg's stream, subject prefix
// and limits (the worker's). It does not create the stream: the worker owns
// its configuration; Ready reports whether it exists.
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
	async, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(max(timeout/4, time.Second)))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return &CommandPublisher{nc: nc, js: js, async: async, cfg: cfg, timeout: timeout}, nil
}

// Check builds the message Publish would publish for cmd and extra and
// decodes it as the worker will. A *payment.ValidationError is the reason
// the worker would dead-letter it; any other error means the message could
// not be built.
func (p *CommandPublisher) Check(cmd *payment.Command, extra map[string]string) error {
	_, err := p.message(cmd, extra, 0)
	return err
}

// Checked is a command's message as Prepare built and checked it, for a
// PublishBatch that does not build it again.
type Checked struct {
	cmd *payment.Command
	msg *nats.Msg
}

// Prepare is Check that keeps the message it built: given to PublishBatch
// (BatchCommand.Checked) with the same command, it is what is published.
func (p *CommandPublisher) Prepare(cmd *payment.Command, extra map[string]string) (*Checked, error) {
	m, err := p.message(cmd, extra, 0)
	if err != nil {
		return nil, err
	}
	return &Checked{cmd: cmd, msg: m}, nil
}

// Publish publishes cmd, with the extra headers given (e.g. W3C
// traceparent and tracestate, so the worker's trace continues the HTTP
// request's), after the same check as Check, and returns the stream
// sequence once the stream acknowledged it. A duplicate inside the
// stream's window is acknowledged too, with the first copy's sequence,
// once the stored copy is checked to be this command (else ErrMsgIDTaken).
// A refusal wraps ErrRefused; any other error is an unknown outcome.
//
// republish > 0 marks a new copy of a command whose first copy the stream
// no longer holds: its Nats-Msg-Id is RepublishMsgID(…, republish), since the
// old id may still be inside the duplicate window, which would drop the
// copy. The worker's claim makes any second copy harmless.
func (p *CommandPublisher) Publish(ctx context.Context, cmd *payment.Command, extra map[string]string, republish int) (uint64, error) {
	ack, err := p.publish(ctx, cmd, extra, republish)
	return ack.Seq, err
}

// Ack is where the stream holds a published command: its stream and
// sequence, and whether the duplicate window dropped this publish as a copy
// of the same command stored earlier under its Nats-Msg-Id (a retry whose
// first PubAck was lost, or a second publish of one payment).
type Ack struct {
	Stream    string
	Seq       uint64
	Duplicate bool
}

// PublishAck is Publish (no republish) that returns the whole Ack, so a
// publisher can tell a first copy from a duplicate of itself.
func (p *CommandPublisher) PublishAck(ctx context.Context, cmd *payment.Command, extra map[string]string) (Ack, error) {
	return p.publish(ctx, cmd, extra, 0)
}

func (p *CommandPublisher) publish(ctx context.Context, cmd *payment.Command, extra map[string]string, republish int) (Ack, error) {
	m, err := p.message(cmd, extra, republish)
	if err != nil {
		return Ack{}, refusal(fmt.Errorf("publish command: %w", err))
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	// One try waits a quarter of the timeout (at least a second) for its
	// PubAck; a Retryable failure (the stream leader changing, a
	// reconnect) sends the same message, same Nats-Msg-Id, again until
	// the timeout: a copy that did land is dropped by the duplicate window.
	// No responders is retried here, not inside nats.go, so that a stream
	// that does not exist is told at once (missing).
	tryFor := max(p.timeout/4, time.Second)
	for tries := 1; ; tries++ {
		tctx, tcancel := context.WithTimeout(ctx, tryFor)
		ack, err := p.js.PublishMsg(tctx, m, jetstream.WithExpectStream(p.cfg.Name), jetstream.WithRetryAttempts(0))
		tcancel()
		if err == nil {
			if err := p.duplicateOf(ctx, ack, m); err != nil {
				return Ack{}, fmt.Errorf("publish command to %s: %w", p.cfg.Name, err)
			}
			return Ack{Stream: ack.Stream, Seq: ack.Sequence, Duplicate: ack.Duplicate}, nil
		}
		if refusedBeforeSend(err) {
			return Ack{}, refusal(fmt.Errorf("publish command to %s (%d tries): %w", p.cfg.Name, tries, err))
		}
		if p.missing(ctx, err) {
			return Ack{}, refusal(fmt.Errorf("publish command to %s: %w (%w)", p.cfg.Name, ErrStreamMissing, err))
		}
		if !Retryable(err) || ctx.Err() != nil {
			return Ack{}, fmt.Errorf("publish command to %s (%d tries): %w", p.cfg.Name, tries, err)
		}
		select {
		case <-ctx.Done():
			return Ack{}, fmt.Errorf("publish command to %s (%d tries): %w", p.cfg.Name, tries, err)
		case <-time.After(retryWait(tries)):
		}
	}
}

// missing reports whether a publish answered by no responders met a
// stream that does not exist: the stream's info answers "stream not
// found" at once. A leader change answers otherwise (the info, or no
// answer in time), and the publish is retried.
func (p *CommandPublisher) missing(ctx context.Context, err error) bool {
	if !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, nats.ErrNoResponders) {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, serr := p.js.Stream(ctx, p.cfg.Name)
	return errors.Is(serr, jetstream.ErrStreamNotFound)
}

// duplicateOf checks a PubAck: a duplicate's counts as m's only when the
// copy stored under its Nats-Msg-Id is this command (SameStored). Another
// command there is ErrMsgIDTaken, a refusal; a failed read is an unknown
// outcome.
func (p *CommandPublisher) duplicateOf(ctx context.Context, ack *jetstream.PubAck, m *nats.Msg) error {
	if !ack.Duplicate {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.timeout)
	defer cancel()
	same, err := SameStored(ctx, p.js, ack, m)
	if err != nil {
		return fmt.Errorf("check the copy a duplicate PubAck points to: %w", err)
	}
	if !same {
		return refusal(fmt.Errorf("%w (%s message %d)", ErrMsgIDTaken, ack.Stream, ack.Sequence))
	}
	return nil
}

// Stored reports whether the stream still holds, at seq, the command of
// (merchantID, key): a published copy not yet removed by the stream's
// limits. A retry republishes only when it does not.
func (p *CommandPublisher) Stored(ctx context.Context, merchantID, key string, seq uint64) (bool, error) {
	if seq == 0 {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	s, err := p.js.Stream(ctx, p.cfg.Name)
	if err != nil {
		return false, fmt.Errorf("stream %s: %w", p.cfg.Name, err)
	}
	raw, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s message %d: %w", p.cfg.Name, seq, err)
	}
	return raw.Subject == p.cfg.SubjectPrefix+"."+merchantID && raw.Header.Get(HeaderIdempotencyKey) == key, nil
}

// Ready reports whether the stream exists (the worker creates it); a
// missing stream's error says to start a worker.
func (p *CommandPublisher) Ready(ctx context.Context) error {
	_, err := p.js.Stream(ctx, p.cfg.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("stream %s: %w", p.cfg.Name, ErrStreamMissing)
	case err != nil:
		return fmt.Errorf("stream %s: %w", p.cfg.Name, err)
	}
	return nil
}

// message builds the message for cmd and checks it the way the worker will
// read it: the header block as NATS encodes and decodes it (values trimmed,
// line breaks replaced), the body within the worker's limits, the same
// command (fingerprint) back, and the whole within the server's payload
// limit.
func (p *CommandPublisher) message(cmd *payment.Command, extra map[string]string, republish int) (*nats.Msg, error) {
	if cmd == nil {
		return nil, errors.New("nil command")
	}
	data, err := EncodeCommand(cmd)
	if err != nil {
		return nil, err
	}
	m := CommandMsg(p.cfg, cmd.MerchantID, cmd.IdempotencyKey, data)
	if republish > 0 {
		m.Header.Set(nats.MsgIdHdr, RepublishMsgID(cmd.MerchantID, cmd.IdempotencyKey, republish))
	}
	for k, v := range extra {
		if v != "" && m.Header.Get(k) == "" {
			m.Header.Set(k, v)
		}
	}
	block := headerBlock(m.Header)
	wire, err := nats.DecodeHeadersMsg(block)
	if err != nil {
		return nil, fmt.Errorf("headers do not survive the wire: %w", err)
	}
	got, err := DecodeCommand(p.cfg, m.Subject, wire, data)
	if err != nil {
		return nil, err
	}
	// The same command back: equal canonical encodings are equal
	// fingerprints, without hashing either.
	var gotBuf, cmdBuf [512]byte
	if !bytes.Equal(got.AppendCanonical(gotBuf[:0]), cmd.AppendCanonical(cmdBuf[:0])) {
		return nil, errors.New("the message would reach the worker as another command")
	}
	if limit := p.nc.MaxPayload(); limit > 0 && int64(len(block)+len(data)) > limit {
		return nil, &payment.ValidationError{Reason: payment.ReasonBodyTooLarge,
			Msg: fmt.Sprintf("message is %d bytes, the NATS server's limit is %d", len(block)+len(data), limit)}
	}
	return m, nil
}

// EncodeCommand is the JSON body of a command as publishers send it:
// encoding/json without HTML escaping (which would turn each of < > & into
// six bytes, growing a body past the worker's limit).
func EncodeCommand(cmd *payment.Command) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(cmd); err != nil {
		return nil, fmt.Errorf("encode command: %w", err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// headerValueOnWire replaces line breaks as nats.go does when it writes a
// header value.
var headerValueOnWire = strings.NewReplacer("\r", " ", "\n", " ")

// headerBlock encodes h as nats.go puts it on the wire: the NATS/1.0 line,
// each value trimmed of surrounding white space with its line breaks
// replaced, and a blank line.
func headerBlock(h nats.Header) []byte {
	var b bytes.Buffer
	b.WriteString("NATS/1.0\r\n")
	for k, vs := range h {
		for _, v := range vs {
			b.WriteString(k)
			b.WriteString(": ")
			b.WriteString(headerValueOnWire.Replace(textproto.TrimString(v)))
			b.WriteString("\r\n")
		}
	}
	b.WriteString("\r\n")
	return b.Bytes()
}

// BatchCommand is one command of a PublishBatch: what Publish takes.
type BatchCommand struct {
	Cmd       *payment.Command
	Extra     map[string]string
	Republish int
	// Checked, when Prepare made it for Cmd and Extra, is published as is
	// (a republish, whose Nats-Msg-Id differs, is built again).
	Checked *Checked
}

// BatchResult is the fate of one command of a PublishBatch: its stream
// sequence once the stream acknowledged it, or why it has none.
type BatchResult struct {
	Seq uint64
	Err error
}

// PublishBatch publishes every command of cmds at once, each checked and
// built as Publish would (same subject, Nats-Msg-Id, headers), and awaits
// every PubAck: one asynchronous send per command instead of a request and
// its reply each. results[i] is the fate of cmds[i]; a command that cannot
// be built, or that the stream refused, fails alone. Errors are Publish's:
// a refusal wraps ErrRefused, any other is an unknown outcome; a
// duplicate's PubAck is checked as Publish checks it.
//
// The retry rule is Publish's: a command whose PubAck did not come for a
// Retryable reason within a quarter of the timeout is sent again, the
// same message (Nats-Msg-Id), until the timeout; a copy that did land is
// dropped by the duplicate window.
func (p *CommandPublisher) PublishBatch(ctx context.Context, cmds []BatchCommand) []BatchResult {
	results := make([]BatchResult, len(cmds))
	msgs := make([]*nats.Msg, len(cmds))
	var waiting []int
	for i, c := range cmds {
		if ch := c.Checked; ch != nil && ch.cmd == c.Cmd && c.Republish == 0 {
			msgs[i] = ch.msg
			waiting = append(waiting, i)
			continue
		}
		m, err := p.message(c.Cmd, c.Extra, c.Republish)
		if err != nil {
			results[i].Err = refusal(fmt.Errorf("publish command: %w", err))
			continue
		}
		msgs[i] = m
		waiting = append(waiting, i)
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	tryFor := max(p.timeout/4, time.Second)
	futures := make([]jetstream.PubAckFuture, len(cmds))
	acks := make([]*jetstream.PubAck, len(cmds))
	for tries := 1; len(waiting) > 0; tries++ {
		for _, i := range waiting {
			f, err := p.async.PublishMsgAsync(msgs[i], jetstream.WithExpectStream(p.cfg.Name), jetstream.WithRetryAttempts(0))
			if err != nil {
				f = failedFuture(msgs[i], err)
			}
			futures[i] = f
		}
		tctx, tcancel := context.WithTimeout(ctx, tryFor)
		var again []int
		missing := -1 // whether the stream is missing, asked once a try: -1 not asked
		for _, i := range waiting {
			var err error
			select {
			case ack := <-futures[i].Ok():
				results[i] = BatchResult{Seq: ack.Sequence}
				acks[i] = ack
				continue
			case err = <-futures[i].Err():
			case <-tctx.Done():
				err = fmt.Errorf("no PubAck within %v: %w", tryFor, tctx.Err())
			}
			results[i].Err = fmt.Errorf("publish command to %s (%d tries): %w", p.cfg.Name, tries, err)
			if refusedBeforeSend(err) {
				results[i].Err = refusal(results[i].Err)
				continue
			}
			if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
				if missing < 0 {
					missing = 0
					if p.missing(ctx, err) {
						missing = 1
					}
				}
				if missing == 1 {
					results[i].Err = refusal(fmt.Errorf("publish command to %s: %w (%w)", p.cfg.Name, ErrStreamMissing, err))
					continue
				}
			}
			if Retryable(err) && ctx.Err() == nil {
				again = append(again, i)
			}
		}
		tcancel()
		waiting = again
		if len(waiting) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			waiting = nil
		case <-time.After(retryWait(tries)):
		}
	}
	for i, ack := range acks {
		if ack != nil && ack.Duplicate {
			if err := p.duplicateOf(ctx, ack, msgs[i]); err != nil {
				results[i] = BatchResult{Err: fmt.Errorf("publish command to %s: %w", p.cfg.Name, err)}
			}
		}
	}
	return results
}

// PublishCommands is PublishBatch of commands without extra headers, for
// the intake's relay: seqs[i] is the stream sequence of cmds[i] once the
// stream acknowledged it (a duplicate of the same command included), errs[i]
// why it has none (a refusal wraps ErrRefused and, for a command the
// worker would dead-letter, a *payment.ValidationError).
func (p *CommandPublisher) PublishCommands(ctx context.Context, cmds []*payment.Command) (seqs []uint64, errs []error) {
	batch := make([]BatchCommand, len(cmds))
	for i, c := range cmds {
		batch[i] = BatchCommand{Cmd: c}
	}
	results := p.PublishBatch(ctx, batch)
	seqs, errs = make([]uint64, len(cmds)), make([]error, len(cmds))
	for i, r := range results {
		seqs[i], errs[i] = r.Seq, r.Err
	}
	return seqs, errs
}
