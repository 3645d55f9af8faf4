package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// netTimeout bounds the net's look-up of its streams and consumer.
const netTimeout = 10 * time.Second

// fileDeadLetter files d in the dead-letter stream and waits for the
// PubAck. It is the one place a dead letter is built, authenticated and
// published, for the worker and the MAX_DELIVERIES net alike.
func fileDeadLetter(ctx context.Context, js jetstream.JetStream, cfg stream.Config, d stream.Letter) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, d.MsgWithin(cfg, int(js.Conn().MaxPayload()))); err != nil {
		return fmt.Errorf("publish dead letter (%s): %w", d.Reason, err)
	}
	return nil
}

// maxDeliveriesAdvisory is the part of the server's advisory we use.
type maxDeliveriesAdvisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// maxDeliverRetry is the delay before an advisory whose dead letter could
// not be filed (the DLQ refuses writes, NATS is reconnecting) is tried again.
const maxDeliverRetry = 2 * time.Second

// RunMaxDeliveriesNet files a dead letter for every message that ran out of
// deliveries without a worker filing it (a worker that died on every
// attempt never got to), until ctx ends. The server's MAX_DELIVERIES
// advisories are captured by the advisory stream (EnsureStreams creates
// it), so one announced while no worker listened (a rolling restart) waits
// there; workers share its durable consumer, and an advisory is acked only
// after its dead letter's PubAck, so a failed publish is retried. The dead
// letter's Nats-Msg-Id makes a second copy (the worker filed it but died
// before its Term; an ack lost) a no-op within the DLQ's duplicate window.
//
// A message no worker settled on any delivery is no proof of a fault of
// its own: its workers were killed or stopped holding it. Up to
// cfg.NetRequeues times the net publishes it again instead, as a new
// message with deliveries of its own (requeue); only then, or when the
// new copy's publish is refused, is the letter filed.
//
// A message that does not decode is bad input, whichever worker takes it:
// it is filed at once with its own reason, never published again. The
// outcome event of each letter filed (refused for bad input; waiting for
// an operator for max_deliveries) is written through refusals, as the
// worker writes it, before the advisory is acked; a failed write leaves
// the advisory to be handled again.
//
// After a letter's PubAck the net records on the gateway's intake, through
// intake, that the payment waits for an operator, as the worker does for
// the letters it files (nil where no gateway publishes on the stream); for
// a refund, a capture or a cancel, the door's intake of that operation
// when intake is an OperationMarker too.
func RunMaxDeliveriesNet(ctx context.Context, js jetstream.JetStream, cfg Config, logger *slog.Logger, intake OperatorMarker, refusals RefusalRecorder) error {
	cfg = cfg.WithDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	n := &maxDeliveriesNet{js: js, cfg: cfg, logger: logger, intake: intake, refusals: refusals}
	failures := 0
	for ctx.Err() == nil {
		if _, err := n.runOnce(ctx); err != nil && ctx.Err() == nil {
			failures++
			wait := min(fetchRetryBase<<min(failures-1, 5), fetchRetryMax)
			logger.Warn("max-deliveries net: fetch failed; retrying", "error", err, "retry_in", wait.String())
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			continue
		}
		failures = 0
	}
	return nil
}

// RefusalRecorder writes the outcome event of a refused command
// (Store.RecordRefusal).
type RefusalRecorder interface {
	RecordRefusal(ctx context.Context, r ledger.Refusal) (bool, error)
}

// OperationMarker is the optional part of an IntakeMarker that records
// the dead letter of a refund, a capture or a cancel on the gateway's
// intake of that very operation (the gateway's store implements it): the
// row of (merchant, key) whose fingerprint is the command's and which has
// no currency, as the door stores an operation's (a payment's intake
// under the same key is never marked). ForOperator is the letter that
// waits for an operator, as OperatorMarker's.
type OperationMarker interface {
	MarkOperationDeadLettered(ctx context.Context, merchantID, key string, fingerprint []byte, seq uint64, reason, errText string) (bool, error)
	MarkOperationForOperator(ctx context.Context, merchantID, key string, fingerprint []byte, reason, errText string) (bool, error)
}

// maxDeliveriesNet is the state of RunMaxDeliveriesNet.
type maxDeliveriesNet struct {
	js       jetstream.JetStream
	cfg      Config
	logger   *slog.Logger
	intake   OperatorMarker  // nil: no gateway intake to tell
	refusals RefusalRecorder // nil: no refused events written
	payments jetstream.Stream
	cons     jetstream.Consumer
}

// netResult counts what one runOnce did with the advisories it fetched.
type netResult struct {
	Filed, Requeued, Gone, Retried, Ignored int
}

// runOnce fetches the advisories waiting (or the first to come within
// fetchWait) and handles each.
func (n *maxDeliveriesNet) runOnce(ctx context.Context) (netResult, error) {
	var res netResult
	if n.cons == nil {
		sctx, cancel := context.WithTimeout(ctx, netTimeout)
		defer cancel()
		payments, err := n.js.Stream(sctx, n.cfg.Stream.Name)
		if err != nil {
			return res, fmt.Errorf("stream %s: %w", n.cfg.Stream.Name, err)
		}
		cons, err := n.js.Consumer(sctx, n.cfg.Stream.AdvisoryStream, stream.DefaultMaxDeliverDurable)
		if err != nil {
			return res, fmt.Errorf("consumer %s on %s: %w", stream.DefaultMaxDeliverDurable, n.cfg.Stream.AdvisoryStream, err)
		}
		n.payments, n.cons = payments, cons
	}
	batch, err := n.cons.Fetch(16, jetstream.FetchMaxWait(fetchWait))
	if err != nil {
		return res, err
	}
	for m := range batch.Messages() {
		n.handle(ctx, m, &res)
	}
	if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
		return res, err
	}
	return res, nil
}

// handle files the dead letter one advisory announces, then acks it.
func (n *maxDeliveriesNet) handle(ctx context.Context, m jetstream.Msg, res *netResult) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	var adv maxDeliveriesAdvisory
	if err := json.Unmarshal(m.Data(), &adv); err != nil || adv.StreamSeq == 0 || adv.Stream != n.cfg.Stream.Name {
		n.logger.Error("unreadable MAX_DELIVERIES advisory; dropped", "error", err, "stream", adv.Stream)
		res.Ignored++
		_ = m.Term()
		return
	}
	log := n.logger.With("stream_seq", adv.StreamSeq, "deliveries", adv.Deliveries)
	raw, err := n.payments.GetMsg(ctx, adv.StreamSeq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		// Expired (MaxAge) or deleted: nothing is left to file.
		log.Error("message that ran out of deliveries is no longer in the stream; not dead-lettered")
		res.Gone++
		_ = m.DoubleAck(ctx)
		return
	case err != nil:
		log.Warn("message that ran out of deliveries cannot be read yet; retrying", "error", err)
		res.Retried++
		_ = m.NakWithDelay(maxDeliverRetry)
		return
	}
	// A message that does not decode is filed at once with its own reason,
	// never published again: every copy would be refused. One holding card
	// data has its letter masked and the original erased: each copy would
	// store the number once more.
	_, decodeErr := stream.DecodeCommand(n.cfg.Stream, raw.Subject, raw.Header, raw.Data)
	var ve *payment.ValidationError
	cardData := errors.As(decodeErr, &ve) && ve.Reason == payment.ReasonCardData
	requeues, ok := requeuesOf(raw.Header)
	if ok && decodeErr == nil && requeues < n.cfg.NetRequeues {
		switch n.requeue(ctx, raw, requeues, log) {
		case requeued:
			if err := m.DoubleAck(ctx); err != nil {
				log.Warn("advisory ack not confirmed; its redelivery publishes nothing new", "error", err)
			}
			res.Requeued++
			return
		case requeueUnknown:
			res.Retried++
			_ = m.NakWithDelay(maxDeliverRetry)
			return
		}
	}
	cause := fmt.Errorf("delivery limit %d reached without a worker settling the message", adv.Deliveries)
	if requeues > 0 {
		cause = fmt.Errorf("delivery limit %d reached without a worker settling the message, which was published again %d time(s) before", adv.Deliveries, requeues)
	}
	d := stream.Letter{
		Reason:      stream.ReasonMaxDeliveries,
		Err:         cause,
		OrigSubject: raw.Subject, OrigStream: n.cfg.Stream.Name, OrigSeq: adv.StreamSeq,
		Deliveries: adv.Deliveries, Header: raw.Header, Data: raw.Data, FailedAt: n.cfg.Clock.Now(),
	}
	if decodeErr != nil {
		d.Reason, d.Err = inputReason(decodeErr), decodeErr
	}
	if err := fileDeadLetter(ctx, n.js, n.cfg.Stream, d); err != nil {
		log.Error("could not dead-letter a message that ran out of deliveries; retrying", "error", err)
		res.Retried++
		_ = m.NakWithDelay(maxDeliverRetry)
		return
	}
	if !n.recordRefusal(ctx, raw, d, log) {
		res.Retried++
		_ = m.NakWithDelay(maxDeliverRetry)
		return
	}
	if cardData {
		if err := n.payments.SecureDeleteMsg(ctx, adv.StreamSeq); err != nil {
			log.Warn("could not erase a message holding card data from its stream; it stays until the stream's MaxAge", "error", err)
		}
	} else if decodeErr == nil {
		n.markIntake(ctx, raw, d.Err, log)
	}
	if err := m.DoubleAck(ctx); err != nil {
		log.Warn("advisory ack not confirmed; its redelivery files nothing new", "error", err)
	}
	res.Filed++
	log.Warn("dead-lettered a message that ran out of deliveries", "reason", d.Reason)
}

// recordRefusal writes the outcome event of raw, just filed as d
// (refusalFor: refused for bad input, else waiting for an operator), and
// reports whether the advisory may be
// acked: false when the store did not take the event, and the advisory's
// next handling files the letter again (the DLQ stores one) and writes
// the event under the same id (the store keeps one).
func (n *maxDeliveriesNet) recordRefusal(ctx context.Context, raw *jetstream.RawStreamMsg, d stream.Letter, log *slog.Logger) bool {
	if n.refusals == nil {
		return true
	}
	r, ok := refusalFor(n.cfg.Stream, nil, raw.Subject, raw.Header, raw.Data, raw.Sequence, d.Reason, d.FailedAt)
	if !ok {
		return true
	}
	if _, err := n.refusals.RecordRefusal(ctx, r); err != nil {
		log.Error("outcome event not written; the advisory is handled again", "reason", d.Reason, "error", err)
		return false
	}
	return true
}

// requeuesOf reads a message's Paydedup-Requeues header: 0 when absent;
// ok is false for a value the net never writes (the message is filed).
func requeuesOf(h nats.Header) (n int, ok bool) {
	v := h.Get(stream.HeaderRequeues)
	if v == "" {
		return 0, true
	}
	n, err := strconv.Atoi(v)
	return n, err == nil && n >= 0
}

// requeueOutcome is how a requeue's publish ended.
type requeueOutcome int

const (
	requeued       requeueOutcome = iota // the new copy is stored
	requeueRefused                       // another message holds its id: file the letter
	requeueUnknown                       // may be stored: try again, same id
)

// requeue publishes raw, which ran out of deliveries after requeues
// earlier copies, again (see publishAgain).
func (n *maxDeliveriesNet) requeue(ctx context.Context, raw *jetstream.RawStreamMsg, requeues int, log *slog.Logger) requeueOutcome {
	return publishAgain(ctx, n.js, n.cfg, raw.Subject, raw.Header, raw.Data, raw.Sequence, requeues+1, log,
		"message ran out of deliveries with no worker settling it (its workers were killed or stopped); published again")
}

// publishAgain publishes message seq of the payments stream (subject,
// header, data), which ran out of deliveries, again as a new message with
// deliveries of its own: the same subject, body and headers,
// Paydedup-Requeues set to next (one more than the copies before, or as
// many when an outage, no fault of the message, spent them),
// Paydedup-Requeue-Of the first copy's sequence (firstSeq), and Nats-Msg-Id
// stream.RequeueMsgID(seq), so a retry after a lost PubAck (or the net
// and the worker both handling the message) stores one copy. A duplicate
// PubAck counts only once the stored copy is checked to be this command.
// PostgreSQL still guards the charge: a copy of a completed key is acked
// as a duplicate. done is logged at warn on success.
func publishAgain(ctx context.Context, js jetstream.JetStream, cfg Config, subject string, header nats.Header, data []byte, seq uint64, next int, log *slog.Logger, done string) requeueOutcome {
	m := nats.NewMsg(subject)
	m.Data = data
	for k, vs := range header {
		if strings.HasPrefix(k, "Nats-") || k == stream.HeaderRequeues {
			continue
		}
		m.Header[k] = append([]string(nil), vs...)
	}
	id := stream.RequeueMsgID(cfg.Stream, seq)
	m.Header.Set(nats.MsgIdHdr, id)
	m.Header.Set(stream.HeaderRequeues, strconv.Itoa(next))
	m.Header.Set(stream.HeaderRequeueOf, strconv.FormatUint(firstSeq(header, seq), 10))
	pctx, cancel := context.WithTimeout(ctx, netTimeout)
	defer cancel()
	ack, err := js.PublishMsg(pctx, m)
	if stream.StreamFull(err) {
		// Full for now (an outage fills it): not stored, and room comes
		// as the workers settle what it holds. Tried again later under
		// the same id, never filed for it.
		log.Warn("the payments stream is full; publishing again later", "error", err, "msg_id", id)
		return requeueUnknown
	}
	var refused *jetstream.APIError
	if errors.As(err, &refused) {
		log.Error("the stream refused a message published again; filing it as a dead letter", "error", err, "msg_id", id)
		return requeueRefused
	}
	if err != nil {
		log.Warn("could not publish again a message that ran out of deliveries; unknown whether it was stored, retrying under the same id", "error", err, "msg_id", id)
		return requeueUnknown
	}
	if ack.Duplicate {
		same, err := stream.SameStored(pctx, js, ack, m)
		switch {
		case err != nil:
			log.Warn("a message published again was dropped as a duplicate that cannot be read; retrying", "error", err, "msg_id", id)
			return requeueUnknown
		case !same:
			log.Error("another message holds the id of a message published again; filing it as a dead letter", "msg_id", id, "holder_seq", ack.Sequence)
			return requeueRefused
		}
	}
	log.Warn(done, "msg_id", id, "new_seq", ack.Sequence, "requeues", next, "of", cfg.NetRequeues)
	return requeued
}

// markIntake records on the gateway's intake that the payment of raw, just
// dead-lettered max_deliveries, waits for an operator; the gateway would
// otherwise answer "queued" for a payment no worker will process. The
// letter is filed already: a failure here is logged and changes nothing.
// A command published straight on the queue has no intake row. A refund,
// a capture or a cancel marks its operation's intake (markOperation).
func (n *maxDeliveriesNet) markIntake(ctx context.Context, raw *jetstream.RawStreamMsg, cause error, log *slog.Logger) {
	if n.intake == nil {
		return
	}
	cmd, _ := stream.DecodeCommand(n.cfg.Stream, raw.Subject, raw.Header, raw.Data)
	merchant, key := letterKey(n.cfg.Stream, cmd, raw.Subject, raw.Header)
	if merchant == "" {
		return
	}
	errText := stream.SanitizeHeader(errString(cause))
	if actsOnPayment(cmd, raw.Data, n.cfg.Stream.Limits) {
		n.markOperation(ctx, cmd, merchant, key, errText, log)
		return
	}
	marked, err := n.intake.MarkIntakeForOperator(ctx, merchant, key, stream.ReasonMaxDeliveries, errText)
	switch {
	case err != nil:
		log.Warn("could not record on the gateway's intake that the payment waits for an operator; the gateway shows the record's state", "error", err)
	case marked:
		log.Info("gateway intake marked waiting for an operator", "reason", stream.ReasonMaxDeliveries)
	}
}

// markOperation is markIntake for a refund, a capture or a cancel
// (cmd, decoded): only the door's intake of that very operation (its
// fingerprint, no currency: OperationMarker) is marked waiting for an
// operator, as the worker's operationLetter marks one, so GET
// /v1/refunds/{key} (captures, cancels) answers waiting_for_operator
// with the reason instead of "queued" for an operation no worker will
// process. Never a payment's intake under the same key.
func (n *maxDeliveriesNet) markOperation(ctx context.Context, cmd *payment.Command, merchant, key, errText string, log *slog.Logger) {
	om, ok := n.intake.(OperationMarker)
	if !ok || cmd == nil {
		return
	}
	marked, err := om.MarkOperationForOperator(ctx, merchant, key, ledger.Fingerprint(cmd), stream.ReasonMaxDeliveries, errText)
	switch {
	case err != nil:
		log.Warn("could not record on the gateway's intake that the operation waits for an operator", "error", err)
	case marked:
		log.Info("gateway intake of the operation marked waiting for an operator", "reason", stream.ReasonMaxDeliveries)
	}
}
