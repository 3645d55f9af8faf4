package stream

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/payment"
)

// HeaderReplayOf marks a message republished from the dead-letter stream:
// <dlq stream>:<dead letter sequence>. It is not a Dlq- header, so it
// survives if the replayed message is dead-lettered again.
const HeaderReplayOf = "Paydedup-Replay-Of"

// MsgID is the Nats-Msg-Id publishers set for a payment command, so the
// stream's duplicate window drops quick double-publishes.
func MsgID(merchantID, idempotencyKey string) string { return merchantID + ":" + idempotencyKey }

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
// replay:<dlq stream>:<seq>. Two replays of one letter (two operators, a
// retry after a lost PubAck) publish one message within the payments
// stream's duplicate window.
func ReplayMsgID(cfg Config, seq uint64) string {
	return "replay:" + cfg.DLQStream + ":" + strconv.FormatUint(seq, 10)
}

// DecodeCommand reads a command from a message as the worker does: strict
// JSON within cfg's limits, the subject's merchant token, and the optional
// Idempotency-Key header. The gateway's publisher runs it on the message it
// is about to publish.
func DecodeCommand(cfg Config, subject string, header nats.Header, data []byte) (*payment.Command, error) {
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
