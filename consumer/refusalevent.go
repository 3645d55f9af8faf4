package consumer

import (
	"cmp"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// finalForClient reports whether a dead letter's reason settles the payment
// for its client: nothing was charged and a replay would not change that.
func finalForClient(reason string) bool {
	return reason == stream.ReasonKeyReused || payment.IsInputReason(reason)
}

// inputReason is the dead-letter reason of a message that does not decode
// (decodeErr from stream.DecodeCommand): the validation's reason, else
// malformed_json.
func inputReason(decodeErr error) string {
	var ve *payment.ValidationError
	if errors.As(decodeErr, &ve) {
		return string(ve.Reason)
	}
	return string(payment.ReasonMalformedJSON)
}

// firstSeq is the stream sequence a message is told under: seq, its own,
// or for a copy published again (publishAgain) the first copy's, which
// its Paydedup-Requeue-Of header carries.
func firstSeq(h nats.Header, seq uint64) uint64 {
	if of, err := strconv.ParseUint(h.Get(stream.HeaderRequeueOf), 10, 64); err == nil && of > 0 {
		return of
	}
	return seq
}

// refusalFor is the outcome event of message seq (subject, header, data;
// cmd its decoded command, nil when it did not decode) dead-lettered for
// reason and filed at filedAt: refused when the reason is a refusal
// (finalForClient, or a refund, capture or cancel the ledger's rules
// refuse: ledger.IsLedgerRefusal), else waiting
// for an operator (Waiting: every other reason waits for a person, as the
// gateway's intake is marked); under the first copy's sequence
// (firstSeq), its merchant (the decoded command's, else the subject's),
// its key (the decoded command's, else the Idempotency-Key header, else
// the body's), and its amount and currency as far as the body decodes (0
// and "" when not, the amount only within the limit, the currency only
// when it is a valid code). ok is false when the message has no stream
// sequence, the merchant or the key cannot be
// read as valid ones, or one of the values holds what looks like a card
// number (redact.ContainsPAN): an event never carries one.
func refusalFor(cfg stream.Config, cmd *payment.Command, subject string, header nats.Header, data []byte, seq uint64, reason string, filedAt time.Time) (ledger.Refusal, bool) {
	if reason == "" || seq == 0 {
		return ledger.Refusal{}, false
	}
	r := ledger.Refusal{StreamSeq: firstSeq(header, seq), Reason: reason, FiledAt: filedAt,
		Waiting: !(finalForClient(reason) || ledger.IsLedgerRefusal(reason))}
	if cmd != nil {
		r.MerchantID, r.IdempotencyKey, r.Amount, r.Currency = cmd.MerchantID, cmd.IdempotencyKey, cmd.Amount, cmd.Currency
	} else {
		r.MerchantID, _ = strings.CutPrefix(subject, cfg.SubjectPrefix+".")
		r.IdempotencyKey = header.Get(stream.HeaderIdempotencyKey)
		if sent := payment.DecodeAsSent(data, cfg.Limits); sent != nil {
			if r.IdempotencyKey == "" {
				r.IdempotencyKey = sent.IdempotencyKey
			}
			r.Amount = sent.Amount
			if payment.ValidCurrency(sent.Currency) {
				r.Currency = sent.Currency
			}
		}
	}
	// An amount past the limit is the refusal's own reason and never
	// reported: a card number typed as the amount is such a one (the door
	// reads strings, not numbers).
	if limit := cmp.Or(cfg.Limits.MaxAmount, payment.DefaultMaxAmount); r.Amount > limit || r.Amount < -limit {
		r.Amount = 0
	}
	if payment.ValidateMerchant(r.MerchantID) != nil || payment.ValidateKey(r.IdempotencyKey) != nil ||
		redact.ContainsPAN(r.MerchantID) || redact.ContainsPAN(r.IdempotencyKey) || redact.ContainsPAN(r.Currency) {
		return ledger.Refusal{}, false
	}
	return r, true
}
