package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// The operations on a payment the door takes, each under its own
// Idempotency-Key, as Stripe's refunds, captures and cancels are:
//
//	POST /v1/payments/{key}/refunds  {"amount": n}  (optional: the rest)
//	POST /v1/payments/{key}/capture  {"amount": n}  (optional: the whole)
//	POST /v1/payments/{key}/cancel   (no body, or {})
//
// {key} is the payment's idempotency key, of the API key's merchant. Each
// becomes a command of its kind (payment.KindRefund, KindCapture,
// KindCancel) naming the payment in payment_key, and is taken in by the
// batched intake as a payment is (the same guard row, publish and
// answers), so the same key and body replays, another body under the key
// (another amount, another operation, another payment) is 422. The
// ledger's rules are the worker's: a refund over what is left is refused
// by it, with its reason.

// decodeOperation reads an operation's body: empty, or a JSON object
// with at most "amount" (not for a cancel), a positive integer in minor
// units within lim (with its defaults). A field it does not know is
// refused as the payment door refuses one (400 unknown_field); an amount
// that is not a positive integer is 422, naming it. ok false: it
// answered.
func decodeOperation(w http.ResponseWriter, body []byte, kind string, lim payment.Limits) (amount int64, ok bool) {
	if len(bytes.TrimSpace(body)) == 0 {
		return 0, true
	}
	bad := func(reason payment.Reason, field, msg string) (int64, bool) {
		invalidRequest(w, &payment.ValidationError{Reason: reason, Field: field, Msg: msg})
		return 0, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return bad(payment.ReasonMalformedJSON, "", "the body must be a JSON object")
	}
	seen := false
	for dec.More() {
		tok, err := dec.Token()
		k, isKey := tok.(string)
		if err != nil || !isKey {
			return bad(payment.ReasonMalformedJSON, "", "the body must be a JSON object")
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return bad(payment.ReasonMalformedJSON, k, "is not valid JSON")
		}
		if k != "amount" || kind == payment.KindCancel {
			return bad(payment.ReasonUnknownField, k, "is not a field of this request")
		}
		if seen {
			return bad(payment.ReasonDuplicateField, k, "appears more than once")
		}
		seen = true
		n, err := strconv.ParseInt(string(raw), 10, 64)
		switch {
		case err != nil && bytes.Equal(raw, []byte("null")):
			continue // absent
		case err != nil || n <= 0:
			writeProblem(w, Problem{Type: ProblemInvalidRequest, Status: http.StatusUnprocessableEntity, Field: "amount",
				Reason: string(payment.ReasonInvalidAmount), Detail: "must be a positive integer in minor units, or absent"})
			return 0, false
		case n > lim.MaxAmount: // Config.WithDefaults set it
			writeProblem(w, Problem{Type: ProblemInvalidRequest, Status: http.StatusUnprocessableEntity, Field: "amount",
				Reason: string(payment.ReasonAmountOverLimit), Detail: "exceeds the largest amount"})
			return 0, false
		}
		amount = n
	}
	if _, err := dec.Token(); err != nil {
		return bad(payment.ReasonMalformedJSON, "", "the body must be a JSON object")
	}
	if _, err := dec.Token(); err == nil {
		return bad(payment.ReasonMalformedJSON, "", "the body must hold one JSON object")
	}
	return amount, true
}

// postOperation is POST /v1/payments/{key}/refunds, /capture or /cancel
// (kind says which).
func (g *Gateway) postOperation(kind string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		merchant, paymentKey := merchantFrom(r.Context()), r.PathValue("key")
		key, ok := doorKey(w, r)
		if !ok {
			return
		}
		if payment.ValidateKey(paymentKey) != nil {
			notFound(w)
			return
		}
		body, ok := g.readBody(w, r)
		if !ok {
			return
		}
		if len(bytes.TrimSpace(body)) > 0 && !jsonBody(r.Header.Get("Content-Type")) {
			writeProblem(w, Problem{Type: ProblemUnsupportedMedia, Status: http.StatusUnsupportedMediaType, Detail: problemDetailUnsupported})
			return
		}
		amount, ok := decodeOperation(w, body, kind, g.cfg.Limits)
		if !ok {
			return
		}
		cmd := &payment.Command{MerchantID: merchant, IdempotencyKey: key, Kind: kind, PaymentKey: paymentKey, Amount: amount}
		log := g.log.With("merchant_id", merchant, "idempotency_key", key, "payment_key", paymentKey, "kind", kind)
		extra := g.traceHeaders(r)
		checked, err := g.check(cmd, extra)
		if err != nil {
			var ve *payment.ValidationError
			if errors.As(err, &ve) {
				invalidRequest(w, ve)
				return
			}
			log.Error("the operation's message cannot be built", "error", err)
			writeProblem(w, Problem{Type: ProblemInternal, Status: http.StatusInternalServerError, Detail: problemDetailInternal})
			return
		}
		fp := ledger.Fingerprint(cmd)
		ctx := r.Context()
		// A refund, capture or cancel the worker claimed answers from its
		// row: the same request is replayed, another is 422.
		read := g.refundOp
		if kind != payment.KindRefund {
			read = g.paymentOp
		}
		o, what, err := read(ctx, merchant, key)
		switch {
		case err == nil && !bytes.Equal(o.hash, fp):
			g.keyReused(w)
			return
		case err == nil && o.inFlight:
			g.keyInUse(w, inFlightRetryAfter)
			return
		case err == nil:
			g.metrics.idempotency.WithLabelValues("replayed").Inc()
			w.Header().Set("Location", opLocation(kind, key))
			w.Header().Set(HeaderIdempotentReplay, "true")
			writeJSON(w, o.status, o.op)
			return
		case !errors.Is(err, ledger.ErrNotFound):
			g.logRequestError(r, log, what, err)
			unavailable(w)
			return
		}
		if reason, ok, err := g.refused(ctx, merchant, key, fp); err != nil {
			g.logRequestError(r, log, "read refusal", err)
			unavailable(w)
			return
		} else if ok {
			g.opRefused(w, reason)
			return
		}
		if known, err := g.paymentKnown(r, merchant, paymentKey); err != nil {
			g.logRequestError(r, log, "read payment", err)
			unavailable(w)
			return
		} else if !known {
			notFound(w)
			return
		}
		it := &item{cmd: cmd, fp: fp, extra: extra, checked: checked, keyHash: apiKeyHashFrom(ctx), log: log, done: make(chan answer, 1)}
		if err := g.batch.enqueue(it); err != nil {
			g.shed(w, err)
			return
		}
		g.writeOperation(w, <-it.done, cmd)
	}
}

// workerOp is the worker's row of an operation's key (a refund's, a
// capture's or a cancel's) as the door answers from it.
type workerOp struct {
	kind     string
	hash     []byte    // the request's fingerprint
	inFlight bool      // claimed, or its outcome lost: the key is in use
	status   int       // the HTTP status of the answer it settles
	op       Operation // what the client is shown
}

// refundOp reads the refund the worker claimed under key, naming the read
// for the log; ledger.ErrNotFound when there is none.
func (g *Gateway) refundOp(ctx context.Context, merchant, key string) (workerOp, string, error) {
	ref, err := g.store.GetRefund(ctx, merchant, key)
	if err != nil {
		return workerOp{}, "read refund", err
	}
	inFlight := ref.Status == ledger.RefundPending || ref.Status == ledger.RefundUnknown
	return workerOp{kind: payment.KindRefund, hash: ref.RequestHash, inFlight: inFlight,
		status: refundAnswerStatus(ref), op: operationOfRefund(ref)}, "read refund", nil
}

// paymentOp reads the capture or cancel the worker claimed under key, as
// refundOp reads a refund.
func (g *Gateway) paymentOp(ctx context.Context, merchant, key string) (workerOp, string, error) {
	o, err := g.store.GetPaymentOp(ctx, merchant, key)
	if err != nil {
		return workerOp{}, "read capture or cancel", err
	}
	return workerOp{kind: o.Kind, hash: o.RequestHash, inFlight: !o.Final(),
		status: paymentOpAnswerStatus(o), op: operationOfPaymentOp(o)}, "read capture or cancel", nil
}

// refused reports whether the worker refused the operation under key
// with fingerprint fp that the door published, and why: the ledger's
// rules refuse a refund (over_refundable...) with a refused outcome
// event and no row of its own (Store.RefusalOf; the worker also marks
// the door's intake dead-lettered, which the batch answers). A key with
// no intake is none; an unreadable intake or event is an error, never
// none: the batch could then publish the operation again, to be judged
// again.
func (g *Gateway) refused(ctx context.Context, merchant, key string, fp []byte) (string, bool, error) {
	in, err := g.store.GetIntake(ctx, merchant, key)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return "", false, nil
	case err != nil:
		return "", false, err
	case !in.Published() || !bytes.Equal(in.RequestHash, fp):
		return "", false, nil
	}
	return g.store.RefusalOf(ctx, merchant, key, in.StreamSeq)
}

// opRefused answers an operation the worker refused: final for its key.
func (g *Gateway) opRefused(w http.ResponseWriter, reason string) {
	g.metrics.idempotency.WithLabelValues("dead_lettered").Inc()
	writeProblem(w, Problem{Type: ProblemRejected, Status: http.StatusUnprocessableEntity, Reason: reason,
		Detail: "The operation was refused (" + reason + "). This is final for this Idempotency-Key; send a corrected request with a new key."})
}

// paymentKnown reports whether the merchant has a payment under key: a
// record, a ledger row, or a payment's intake (one with a currency: an
// operation's has none).
func (g *Gateway) paymentKnown(r *http.Request, merchant, key string) (bool, error) {
	ctx := r.Context()
	_, err := g.records.Get(ctx, merchant, key)
	if !errors.Is(err, ledger.ErrNotFound) {
		return err == nil, err
	}
	if _, err = g.records.GetPayment(ctx, merchant, key); !errors.Is(err, ledger.ErrNotFound) {
		return err == nil, err
	}
	in, err := g.store.GetIntake(ctx, merchant, key)
	if errors.Is(err, ledger.ErrNotFound) {
		return false, nil
	}
	return err == nil && in.Currency != "", err
}

// writeOperation answers an operation the batched intake decided: 202
// queued once published, the worker's outcome replayed, or the door's
// answer to the key (409, 422, a dead letter's reason, 503).
func (g *Gateway) writeOperation(w http.ResponseWriter, a answer, cmd *payment.Command) {
	op := Operation{Object: objectOf(cmd.Kind), IdempotencyKey: cmd.IdempotencyKey, PaymentKey: cmd.PaymentKey, Amount: cmd.Amount}
	switch a.kind {
	case ansAccepted:
		op.Status, op.CreatedAt = StateQueued, a.in.CreatedAt.UTC()
		w.Header().Set("Location", opLocation(cmd.Kind, cmd.IdempotencyKey))
		writeJSON(w, http.StatusAccepted, op)
	case ansReplay: // a capture or cancel the worker completed under its key
		g.metrics.idempotency.WithLabelValues("replayed").Inc()
		op = operationOfRecord(cmd.Kind, cmd.PaymentKey, a.rec)
		w.Header().Set("Location", opLocation(cmd.Kind, cmd.IdempotencyKey))
		w.Header().Set(HeaderIdempotentReplay, "true")
		status := http.StatusOK
		if op.Status == OpRefused {
			status = http.StatusPaymentRequired
		}
		writeJSON(w, status, op)
	case ansWaiting:
		g.metrics.idempotency.WithLabelValues("waiting_for_operator").Inc()
		op.Status, op.Reason, op.CreatedAt = StateWaitingForOperator, a.in.OperatorReason, a.in.CreatedAt.UTC()
		w.Header().Set("Location", opLocation(cmd.Kind, cmd.IdempotencyKey))
		writeJSON(w, http.StatusAccepted, op)
	case ansDeadLetter:
		if ledger.IsLedgerRefusal(a.in.DeadLetterReason) { // the worker refused it (operationLetter)
			g.opRefused(w, a.in.DeadLetterReason)
			return
		}
		g.write(w, a)
	default:
		g.write(w, a)
	}
}

// getOperation is GET /v1/refunds/{key}, /v1/captures/{key} and
// /v1/cancels/{key} (kind says which): the operation's own state, for
// its own merchant only. The worker's row when it has one; else the
// door's intake: queued, publish_outcome_unknown, refused with the dead
// letter's reason (the ledger's rules refused it, or its input), or
// waiting_for_operator.
func (g *Gateway) getOperation(kind string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		merchant, key := merchantFrom(r.Context()), r.PathValue("key")
		if payment.ValidateKey(key) != nil {
			notFound(w)
			return
		}
		ctx := r.Context()
		// The worker's row of the key, a refund's or a capture's or a
		// cancel's: shown on its own kind's route only.
		for _, read := range []func(context.Context, string, string) (workerOp, string, error){g.refundOp, g.paymentOp} {
			o, what, err := read(ctx, merchant, key)
			switch {
			case err == nil && o.kind == kind:
				writeJSON(w, http.StatusOK, o.op)
				return
			case err == nil:
				notFound(w)
				return
			case !errors.Is(err, ledger.ErrNotFound):
				g.logRequestError(r, g.log, what, err)
				unavailable(w)
				return
			}
		}
		rec, err := g.records.Get(ctx, merchant, key)
		switch {
		case err == nil && ledger.KindOfProviderKey(rec.ProviderKey) == kind:
			writeJSON(w, http.StatusOK, operationOfRecord(kind, "", rec))
			return
		case err == nil: // a payment's key, not an operation's
			notFound(w)
			return
		case !errors.Is(err, ledger.ErrNotFound):
			g.logRequestError(r, g.log, "read record", err)
			unavailable(w)
			return
		}
		in, err := g.store.GetIntake(ctx, merchant, key)
		if err == nil && in.Currency == "" {
			// Another kind's guard row (a refund's key under
			// /v1/captures/) is not this route's.
			var of string
			if of, err = g.store.IntakeKind(ctx, merchant, key); err == nil && of != "" && of != kind {
				notFound(w)
				return
			}
		}
		if err == nil && in.Currency == "" {
			in, _, err = g.settledIntake(ctx, in)
		}
		switch {
		case errors.Is(err, ledger.ErrNotFound) || err == nil && in.Currency != "":
			notFound(w)
			return
		case err != nil:
			g.logRequestError(r, g.log, "read intake", err)
			unavailable(w)
			return
		}
		op := Operation{Object: objectOf(kind), IdempotencyKey: key, Amount: in.Amount, CreatedAt: in.CreatedAt.UTC()}
		// A recorded refusal is final and read before the operator's mark,
		// as a retried POST reads it (g.refused) before anything else.
		var refusal string
		refused := false
		if !in.DeadLettered() && in.Published() {
			if reason, ok, err := g.store.RefusalOf(ctx, merchant, key, in.StreamSeq); err == nil && ok {
				refusal, refused = reason, true
			}
		}
		switch st := ledger.StateOf(&in, nil, nil); {
		case in.DeadLettered():
			op.Status, op.Reason = OpRefused, in.DeadLetterReason
		case refused:
			op.Status, op.Reason = OpRefused, refusal
		case in.WaitsForOperator(nil):
			op.Status, op.Reason = StateWaitingForOperator, in.OperatorReason
		default:
			op.Status = string(st.Status)
		}
		writeJSON(w, http.StatusOK, op)
	}
}
