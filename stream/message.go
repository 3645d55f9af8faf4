package stream

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/payment"
)

// HeaderReplayOf marks a message republished from the dead-letter stream:
// <dlq stream>:<dead letter sequence>. It is not a Dlq- header, so it
// survives if the replayed message is dead-lettered again.
const HeaderReplayOf = "Paydedup-Replay-Of"

// HeaderRequeues counts how many times the max-deliveries net published a
// command again after it ran out of deliveries with no worker settling it
// (see RequeueMsgID). A replay starts the count again.
const HeaderRequeues = "Paydedup-Requeues"

// HeaderRequeueOf names the stream sequence of the message a worker or the
// max-deliveries net published again (see RequeueMsgID): the first
// copy's, carried by every later copy, so that what is told of the
// command under its sequence (a refused event's id) is one for all its
// copies. A replay drops it: the replayed message is told as a new one.
const HeaderRequeueOf = "Paydedup-Requeue-Of"

// MsgID is the Nats-Msg-Id publishers set for a payment command, so the
// stream's duplicate window drops quick double-publishes.
//
// The ids of every publisher are told apart: a merchant id is
// [A-Za-z0-9_-], so a command's id never starts with "~", and only the
// project's own second copies (RepublishMsgID, ReplayMsgID, RequeueMsgID) do, each with
// its own word and a field order that parses one way. No key, merchant or
// dead-letter sequence makes one publisher's id another's.
func MsgID(merchantID, idempotencyKey string) string { return merchantID + ":" + idempotencyKey }

// msgIDOwnPrefix starts the ids of the project's own second copies: never
// a merchant id's first byte.
const msgIDOwnPrefix = "~"

// RepublishMsgID is the Nats-Msg-Id of the gateway's n-th new copy (n ≥ 1)
// of a command whose first copy the stream no longer holds:
// ~republish:<n>:<merchant_id>:<idempotency_key>. The first id may still be
// inside the duplicate window, which would drop the copy.
func RepublishMsgID(merchantID, idempotencyKey string, n int) string {
	return msgIDOwnPrefix + "republish:" + strconv.Itoa(n) + ":" + merchantID + ":" + idempotencyKey
}

// CommandMsg builds the message for a payment command body: subject
// <SubjectPrefix>.<merchant_id>, the Idempotency-Key header and Nats-Msg-Id
// <merchant_id>:<idempotency_key>. The body is sent byte for byte.
func CommandMsg(cfg Config, merchantID, idempotencyKey string, body []byte) *nats.Msg {
	cfg = cfg.WithDefaults()
	m := nats.NewMsg(cfg.SubjectPrefix + "." + merchantID)
	m.Data = body
	if idempotencyKey != "" {
		m.Header.Set(HeaderIdempotencyKey, idempotencyKey)
		m.Header.Set(nats.MsgIdHdr, MsgID(merchantID, idempotencyKey))
	}
	return m
}

// ReplayMsgID is the Nats-Msg-Id of the replay of dead letter seq:
// ~replay:<seq>:<dlq stream>. Two replays of one letter (two operators, a
// retry after a lost PubAck) publish one message within the payments
// stream's duplicate window; no command's id is ever a replay's (see MsgID).
func ReplayMsgID(cfg Config, seq uint64) string {
	return msgIDOwnPrefix + "replay:" + strconv.FormatUint(seq, 10) + ":" + cfg.DLQStream
}

// ResignMsgID is the Nats-Msg-Id of dead letter seq filed anew under the
// DLQ key keyID (dlq resign): ~resign:<seq>:<dlq stream>:<key id>. Two
// re-signings of one letter (a retry after a lost PubAck, two operators)
// file one copy within the dead-letter stream's duplicate window.
func ResignMsgID(cfg Config, seq uint64, keyID string) string {
	return msgIDOwnPrefix + "resign:" + strconv.FormatUint(seq, 10) + ":" + cfg.DLQStream + ":" + keyID
}

// RequeueMsgID is the Nats-Msg-Id of the max-deliveries net's new copy of
// message seq of the payments stream, which ran out of deliveries with no
// worker settling it: ~requeue:<seq>:<stream>. Two copies of one message
// (the net's retry after a lost PubAck, two workers' nets handling one
// advisory) publish one message within the stream's duplicate window.
func RequeueMsgID(cfg Config, seq uint64) string {
	return msgIDOwnPrefix + "requeue:" + strconv.FormatUint(seq, 10) + ":" + cfg.Name
}

// DecodeCommand reads a command from a message as the worker does: strict
// JSON within cfg's limits, the subject's merchant token, and the optional
// Idempotency-Key header. The gateway's publisher runs it on the message it
// is about to publish.
//
// A message with card data in its subject or any header (cardDataHeaders)
// is refused as card_data before its body is read; in the body, Decode
// refuses it.
func DecodeCommand(cfg Config, subject string, header nats.Header, data []byte) (*payment.Command, error) {
	if err := payment.CheckCardData("subject", subject); err != nil {
		return nil, err
	}
	if err := cardDataHeaders(header); err != nil {
		return nil, err
	}
	env := payment.Envelope{}
	if tok, ok := strings.CutPrefix(subject, cfg.SubjectPrefix+"."); ok {
		env.SubjectMerchant = tok
		if tok == "" || strings.Contains(tok, ".") {
			return nil, &payment.ValidationError{Reason: payment.ReasonMerchantMismatch, Field: "subject",
				Msg: fmt.Sprintf("subject %q must be %s.<merchant_id>", subject, cfg.SubjectPrefix)}
		}
	}
	if vals, ok := header[HeaderIdempotencyKey]; ok {
		env.HeaderKeySet = true
		if len(vals) > 0 {
			env.HeaderKey = vals[0]
		}
	}
	return payment.Decode(data, env, cfg.Limits)
}

// cardDataHeaders returns the card_data error naming the first header (by
// name) whose name or value looks like it holds a card number. Every header
// is stored with the message and its dead letter, but the trace context
// is left out (traceContextHeader): tracers make it, nobody types it, and
// a span id of sixteen decimal digits or a vendor's millisecond timestamp
// would refuse a payment for what is not card data.
// Nats-Msg-Id is checked between its colons: it joins the merchant id and
// the key, each checked on its own, and a numeric merchant beside a
// numeric key is not a card number. It runs on every message, so the
// common case (no card data) allocates nothing: the names are sorted only
// once one is found.
func cardDataHeaders(h nats.Header) error {
	found := false
	for k, vs := range h {
		if headerCardData(k, vs) != "" {
			found = true
			break
		}
	}
	if !found {
		return nil
	}
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		if field := headerCardData(k, h[k]); field != "" {
			return payment.CardDataError(field)
		}
	}
	return nil
}

// traceContextHeaders are the trace-context headers tracers propagate, by
// lower-case name; a name ending in '-' stands for every name it starts:
// W3C (traceparent, tracestate), Datadog, Zipkin B3, Jaeger, AWS X-Ray,
// Google Cloud and Sentry. Tracers write their ids, so a decimal id must
// not refuse a payment. W3C baggage is not among them: the application
// writes it, and the message stores it, so the door reads it.
var traceContextHeaders = []string{
	"traceparent", "tracestate",
	"x-datadog-",
	"b3", "x-b3-",
	"uber-trace-id",
	"x-amzn-trace-id",
	"x-cloud-trace-context",
	"sentry-trace",
}

// traceContextHeader reports whether header k is trace context, whatever
// its case, without allocating.
func traceContextHeader(k string) bool {
	for _, t := range traceContextHeaders {
		if strings.HasSuffix(t, "-") {
			if len(k) >= len(t) && strings.EqualFold(k[:len(t)], t) {
				return true
			}
		} else if strings.EqualFold(k, t) {
			return true
		}
	}
	return false
}

// headerCardData is the field a card_data error names for header k with
// values vs, or "" when neither holds what looks like a card number.
func headerCardData(k string, vs []string) string {
	if traceContextHeader(k) {
		return ""
	}
	if redact.ContainsPAN(k) {
		return "a header name"
	}
	for _, v := range vs {
		if k != nats.MsgIdHdr {
			if redact.ContainsPAN(v) {
				return "header " + k
			}
			continue
		}
		for rest := v; ; {
			part, after, more := strings.Cut(rest, ":")
			if redact.ContainsPAN(part) {
				return "header " + k
			}
			if !more {
				break
			}
			rest = after
		}
	}
	return ""
}
