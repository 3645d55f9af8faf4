package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// Payment states shown to clients: ledger.State's words (see there).
const (
	StateQueued             = string(ledger.StateQueued)
	StateProcessing         = string(ledger.StateProcessing)
	StateRetrying           = string(ledger.StateRetrying)
	StateSucceeded          = string(ledger.StateSucceeded)
	StateDeclined           = string(ledger.StateDeclined)
	StatePublishUnknown     = string(ledger.StatePublishUnknown)
	StateWaitingForOperator = string(ledger.StateWaitingForOperator)
	StateAuthorized         = string(ledger.StateAuthorized)
	// StateRefunded and StatePartiallyRefunded are a succeeded payment's
	// once refunds of it succeeded: all of its amount, or part of it.
	StateRefunded          = ledger.StatusRefunded
	StatePartiallyRefunded = ledger.StatusPartiallyRefunded
	// StateCanceled is an authorized payment whose authorization was
	// canceled: nothing moved (Stripe's canceled).
	StateCanceled = ledger.PaymentCanceled
)

// Payment is the gateway's representation of a payment. For a completed
// payment it is built only from the stored record, so every replay is the
// same bytes.
type Payment struct {
	Object         string     `json:"object"`
	IdempotencyKey string     `json:"idempotency_key"`
	Status         string     `json:"status"`
	Amount         int64      `json:"amount"`
	Currency       string     `json:"currency"`
	ChargeID       string     `json:"charge_id,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	CompletedAt    *time.Time `json:"completed_at,omitempty"`
	// AmountCapturable is how much of an authorized payment can still be
	// captured (Stripe's amount_capturable); absent in any other state.
	AmountCapturable *int64 `json:"amount_capturable,omitempty"`
	// AmountReceived is what the payment moved (Stripe's
	// amount_received): its amount once succeeded, 0 while authorized;
	// absent in any other state.
	AmountReceived *int64 `json:"amount_received,omitempty"`
	// AmountRefunded is the sum of its succeeded refunds and of those
	// the provider holds pending (as Stripe's amount_refunded), over all
	// of them, and Refunds lists its refunds (its own key, amount and
	// state), oldest first, the first pgstore.MaxRefundsShown: a GET shows
	// them for a succeeded payment (which then reads refunded or
	// partially_refunded).
	AmountRefunded *int64          `json:"amount_refunded,omitempty"`
	Refunds        []RefundSummary `json:"refunds,omitempty"`
	// RefundsHasMore says Refunds lists the first refunds only (Stripe's
	// has_more): AmountRefunded still counts them all.
	RefundsHasMore bool `json:"refunds_has_more,omitempty"`
	// Outcome is the provider's stored answer, once completed.
	Outcome *Outcome `json:"outcome,omitempty"`
	// Reason is the dead letter's reason of a payment waiting for an
	// operator.
	Reason string `json:"reason,omitempty"`
	// Delay says why a payment that waits for a worker (queued, retrying,
	// or processing with its outcome unknown) is not moving: the workers
	// are paused, wait for the provider's rate limit, or serve other
	// merchants' payments in turn. Absent while none is.
	Delay *Delay `json:"delay,omitempty"`
}

// Delay is what the paused workers report: the cause most of them give
// (provider_unavailable: the provider refuses or does not answer;
// provider_auth: it refuses the API key; postgres_unavailable;
// rate_limited, the workers working but payments waiting for the
// provider's rate limit or the fleet's budget; or behind_another_merchant,
// the workers serving the merchants waiting in turn), since when, how many
// workers, and when they try again. Payments resume on their own when it ends; none
// of their deliveries is spent meanwhile. Or, with no pause, that no worker
// takes commands off the queue at all (DelayNoWorker, WorkersPaused 0):
// the payment moves once one runs.
type Delay struct {
	Cause         string    `json:"cause"`
	Since         time.Time `json:"since,omitzero"`
	WorkersPaused int       `json:"workers_paused"`
	// RetryAt is when the soonest of those workers tries again; the
	// payment moves then if the outage is over. Absent when no worker
	// says.
	RetryAt *time.Time `json:"retry_at,omitempty"`
}

// Outcome is the stored provider response of a completed payment.
type Outcome struct {
	Status int             `json:"status"`
	Body   json.RawMessage `json:"body"`
}

// paymentOf is the payment a client is shown in state st
// (ledger.StateOf): every answer that carries a payment is built here.
func paymentOf(st ledger.PaymentState) Payment {
	p := Payment{Object: "payment", IdempotencyKey: st.IdempotencyKey, Status: string(st.Status), Amount: st.Amount,
		Currency: st.Currency, ChargeID: st.ChargeID, CreatedAt: st.CreatedAt.UTC(), Reason: st.Reason}
	if st.Completed {
		at := st.CompletedAt.UTC()
		p.CompletedAt = &at
		p.Outcome = &Outcome{Status: st.ResponseStatus, Body: st.Response}
	}
	switch st.Status {
	case ledger.StateAuthorized:
		capturable, received := st.AmountCapturable, int64(0)
		p.AmountCapturable, p.AmountReceived = &capturable, &received
	case ledger.StateSucceeded:
		received := st.Amount
		p.AmountReceived = &received
	}
	return p
}

// withLifecycle moves p, the payment in state st, to where its lifecycle
// l stands (ledger.LifeOf, the rules the console shows it by too): an
// authorized payment to succeeded once captured (with what the capture
// received: Store.PaymentLife) or canceled; and a succeeded one counts
// its refunds (Store.RefundsOf): the amount refunded (succeeded, or
// pending at the provider, as Stripe's amount_refunded), the first
// refunds' summaries (more: not all are listed), and its status refunded
// (all of it) or partially_refunded.
func withLifecycle(p *Payment, st ledger.PaymentState, l ledger.Lifecycle) {
	life := ledger.LifeOf(st, l)
	p.Status, p.AmountCapturable, p.AmountReceived = life.Status, life.AmountCapturable, life.AmountReceived
	if life.AmountRefunded == nil {
		return
	}
	for _, r := range l.Refunds {
		p.Refunds = append(p.Refunds, RefundSummary{IdempotencyKey: r.IdempotencyKey, Amount: r.Amount, Status: refundStatus(r.Status), Reason: r.Reason})
	}
	p.RefundsHasMore = l.RefundsTotal > len(l.Refunds)
	p.AmountRefunded = life.AmountRefunded
}

// paymentFromRecord is the payment a key's record shows.
func paymentFromRecord(rec ledger.Record) Payment { return paymentOf(ledger.StateOf(nil, &rec, nil)) }

// waitingPayment is the payment of a key that waits for an operator
// (Intake.WaitsForOperator): its record's fields when it has one (rec
// not zero), else its intake's.
func waitingPayment(rec ledger.Record, in ledger.Intake) Payment {
	return paymentOf(ledger.OperatorWaitState(in, recordOrNil(rec)))
}

// recordOrNil is &rec, or nil for the zero record (none was read).
func recordOrNil(rec ledger.Record) *ledger.Record {
	if rec.IdempotencyKey == "" {
		return nil
	}
	return &rec
}

// outcomeStatus is the HTTP status of a completed payment: 201 Created for
// a charge, 402 Payment Required for any definitive refusal (a card decline,
// or parameters the provider rejected: the gateway validated the request,
// so a 400 here would blame the client's syntax). The provider's own status
// is in Outcome.Status.
func outcomeStatus(rec ledger.Record) int {
	if rec.ResponseStatus >= 200 && rec.ResponseStatus < 300 {
		return http.StatusCreated
	}
	return http.StatusPaymentRequired
}

func location(key string) string { return "/v1/payments/" + url.PathEscape(key) }

// writeOutcome answers with a completed payment. replayed marks an answer
// to a retry (the IETF draft's and Stripe's Idempotent-Replayed).
func writeOutcome(w http.ResponseWriter, rec ledger.Record, replayed bool) {
	w.Header().Set("Location", location(rec.IdempotencyKey))
	if replayed {
		w.Header().Set(HeaderIdempotentReplay, "true")
	}
	writeJSON(w, outcomeStatus(rec), paymentFromRecord(rec))
}

// invalidRequest answers a command the worker would not accept: 413 for
// its size, 400 for anything else, naming the field and the reason.
func invalidRequest(w http.ResponseWriter, err error) {
	var ve *payment.ValidationError
	if !errors.As(err, &ve) {
		ve = &payment.ValidationError{Reason: payment.ReasonMalformedJSON, Msg: err.Error()}
	}
	status := http.StatusBadRequest
	typ := ProblemInvalidRequest
	switch ve.Reason {
	case payment.ReasonBodyTooLarge:
		status, typ = http.StatusRequestEntityTooLarge, ProblemTooLarge
	case payment.ReasonCardData:
		// Well-formed, but refused for what it holds: 422, not 400.
		status, typ = http.StatusUnprocessableEntity, ProblemCardData
	}
	writeProblem(w, Problem{Type: typ, Status: status, Detail: ve.Msg, Field: ve.Field, Reason: string(ve.Reason)})
}

// decodeCommand decodes a POST body, which is a payment command without
// merchant_id: the merchant comes from the API key. It is put in front of
// the body's fields and payment.Decode does the strict decoding, so the
// gateway accepts exactly what the worker accepts. A merchant_id in the
// body is an unknown field here.
//
// Stripe's capture_method chooses the command's kind: "manual" publishes
// an authorize, "automatic" (the default) a charge. It is taken out of
// the body before the strict decoding (captureMethod), which then judges
// the rest as the worker will.
func decodeCommand(body []byte, merchant, key string, lim payment.Limits) (*payment.Command, error) {
	env := payment.Envelope{HeaderKey: key, HeaderKeySet: true}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return payment.Decode(body, env, lim) // fails: not an object
	}
	trimmed, method, err := captureMethod(trimmed)
	if err != nil {
		return nil, err
	}
	rest := trimmed[1:]
	m, _ := json.Marshal(merchant)
	full := append([]byte(`{"merchant_id":`), m...)
	if r := bytes.TrimLeft(rest, " \t\r\n"); len(r) > 0 && r[0] != '}' {
		full = append(full, ',')
	}
	full = append(full, rest...)
	if lim.MaxBodyBytes > 0 {
		lim.MaxBodyBytes += len(full) - len(trimmed)
	}
	cmd, err := payment.Decode(full, env, lim)
	var ve *payment.ValidationError
	if errors.As(err, &ve) && ve.Field == "merchant_id" && ve.Reason == payment.ReasonDuplicateField {
		return nil, &payment.ValidationError{Reason: payment.ReasonUnknownField, Field: "merchant_id",
			Msg: "must not be sent: the merchant comes from the API key"}
	}
	if err == nil && cmd.ActsOnPayment() {
		return nil, &payment.ValidationError{Reason: payment.ReasonInvalidKind, Field: "kind",
			Msg: "a " + cmd.Kind + " is not a payment: this door takes charges and authorizations"}
	}
	if err != nil || method == "" {
		return cmd, err
	}
	want := payment.KindCharge
	if method == captureManual {
		want = payment.KindAuthorize
	}
	switch {
	case cmd.Kind == "" && want == payment.KindCharge:
	case cmd.Kind == "":
		cmd.Kind = want
	case cmd.Kind != want:
		return nil, &payment.ValidationError{Reason: payment.ReasonInvalidKind, Field: "capture_method",
			Msg: fmt.Sprintf("%q contradicts kind %q", method, cmd.Kind)}
	}
	return cmd, nil
}

// Stripe's capture methods a POST may name.
const (
	captureAutomatic = "automatic"
	captureManual    = "manual"
)

// captureMethod takes the top-level field capture_method out of the JSON
// object body: it returns the object without it and the method named
// ("" when absent). A body it cannot walk is returned as it is, for the
// strict decoding to name what is wrong with it. The other fields are
// kept in their order, their values byte for byte, so the strict decoding
// still sees every duplicate and every unknown field.
func captureMethod(body []byte) ([]byte, string, error) {
	if !bytes.Contains(body, []byte("capture_method")) && !bytes.Contains(body, []byte(`\u`)) {
		return body, "", nil // the common case: no walk
	}
	type pair struct {
		key string
		raw json.RawMessage
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return body, "", nil
	}
	var (
		pairs  []pair
		method string
		found  bool
	)
	for dec.More() {
		tok, err := dec.Token()
		k, ok := tok.(string)
		if err != nil || !ok {
			return body, "", nil
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return body, "", nil
		}
		if k != "capture_method" {
			pairs = append(pairs, pair{k, raw})
			continue
		}
		if found {
			return nil, "", &payment.ValidationError{Reason: payment.ReasonDuplicateField, Field: "capture_method", Msg: "appears more than once"}
		}
		found = true
		if json.Unmarshal(raw, &method) != nil || method != captureAutomatic && method != captureManual {
			return nil, "", &payment.ValidationError{Reason: payment.ReasonInvalidKind, Field: "capture_method",
				Msg: `must be "automatic" or "manual"`}
		}
	}
	if !found {
		return body, "", nil
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return body, "", nil
	}
	rest := body[dec.InputOffset():]
	out := []byte{'{'}
	for i, p := range pairs {
		if i > 0 {
			out = append(out, ',')
		}
		k, _ := json.Marshal(p.key)
		out = append(append(append(out, k...), ':'), p.raw...)
	}
	out = append(append(out, '}'), rest...)
	return out, method, nil
}

// Operation objects, as a client is shown them.
const (
	ObjectRefund  = "refund"
	ObjectCapture = "capture"
	ObjectCancel  = "cancel"
)

// Operation states shown to clients, besides the payment's queued,
// processing, publish_outcome_unknown and waiting_for_operator.
const (
	// OpSucceeded: the provider did it (refunded, captured, canceled).
	OpSucceeded = "succeeded"
	// OpFailed: the provider's refund failed or was canceled after it
	// was made: the money is back on the payment.
	OpFailed = "failed"
	// OpRefused: never done: the ledger's rules (over_refundable,
	// payment_not_charged...) or the provider refused it; Reason says why.
	OpRefused = "refused"
)

// Operation is a refund, capture or cancel as the door shows it: what was
// asked (its key, its payment, its amount: 0 asks for the rest of a
// refund, the whole of a capture) and where it stands.
type Operation struct {
	Object         string `json:"object"`
	IdempotencyKey string `json:"idempotency_key"`
	PaymentKey     string `json:"payment_key,omitempty"`
	Status         string `json:"status"`
	// Amount is what the operation moves, once the worker fixed it (a
	// refund of the rest: what was left), else what was asked (0: the
	// rest, the whole).
	Amount      int64      `json:"amount"`
	Currency    string     `json:"currency,omitempty"`
	RefundID    string     `json:"refund_id,omitempty"`
	Reason      string     `json:"reason,omitempty"`
	CreatedAt   time.Time  `json:"created_at,omitzero"`
	CompletedAt *time.Time `json:"completed_at,omitempty"`
}

// RefundSummary is one refund of a payment, as its GET lists them.
type RefundSummary struct {
	IdempotencyKey string `json:"idempotency_key"`
	Amount         int64  `json:"amount"`
	Status         string `json:"status"`
	Reason         string `json:"reason,omitempty"`
}

// objectOf is the object of an operation of kind.
func objectOf(kind string) string {
	switch kind {
	case payment.KindCapture:
		return ObjectCapture
	case payment.KindCancel:
		return ObjectCancel
	}
	return ObjectRefund
}

// opLocation is where an operation's own state is read.
func opLocation(kind, key string) string {
	switch kind {
	case payment.KindCapture:
		return "/v1/captures/" + url.PathEscape(key)
	case payment.KindCancel:
		return "/v1/cancels/" + url.PathEscape(key)
	}
	return "/v1/refunds/" + url.PathEscape(key)
}

// refundStatus is the state a client is shown of a refund's row: one
// claimed or whose outcome was lost is processing (it may hold money).
func refundStatus(status string) string {
	switch status {
	case ledger.RefundSucceeded:
		return OpSucceeded
	case ledger.RefundFailed:
		return OpFailed
	case ledger.RefundRefused:
		return OpRefused
	}
	return StateProcessing
}

// operationOfRefund is a refund's row as its client is shown it.
func operationOfRefund(r ledger.Refund) Operation {
	op := Operation{Object: ObjectRefund, IdempotencyKey: r.IdempotencyKey, PaymentKey: r.PaymentKey, Status: refundStatus(r.Status),
		Amount: r.Amount, Currency: r.Currency, RefundID: r.RefundID, Reason: r.Reason, CreatedAt: r.CreatedAt.UTC()}
	if !r.CompletedAt.IsZero() {
		at := r.CompletedAt.UTC()
		op.CompletedAt = &at
	}
	return op
}

// operationOfRecord is a capture or cancel the worker claimed under its
// own key (an idempotency record) as its client is shown it.
func operationOfRecord(kind, paymentKey string, rec ledger.Record) Operation {
	op := Operation{Object: objectOf(kind), IdempotencyKey: rec.IdempotencyKey, PaymentKey: paymentKey, Status: StateProcessing,
		Amount: rec.Amount, Currency: rec.Currency, CreatedAt: rec.CreatedAt.UTC()}
	if rec.Status == ledger.StatusCompleted {
		op.Status = OpSucceeded
		if rec.ResponseStatus < 200 || rec.ResponseStatus > 299 {
			op.Status = OpRefused
		}
		at := rec.CompletedAt.UTC()
		op.CompletedAt = &at
	}
	return op
}

// paymentOpStatus is the state a client is shown of a capture's or a
// cancel's row: one claimed or whose outcome was lost is processing.
func paymentOpStatus(status string) string {
	switch status {
	case ledger.OpSucceeded:
		return OpSucceeded
	case ledger.OpRefused:
		return OpRefused
	}
	return StateProcessing
}

// operationOfPaymentOp is a capture's or a cancel's row (payment_ops) as
// its client is shown it: a succeeded capture's amount is what it
// received.
func operationOfPaymentOp(o ledger.PaymentOp) Operation {
	op := Operation{Object: objectOf(o.Kind), IdempotencyKey: o.IdempotencyKey, PaymentKey: o.PaymentKey, Status: paymentOpStatus(o.Status),
		Amount: o.Amount, Currency: o.Currency, Reason: o.Reason, CreatedAt: o.CreatedAt.UTC()}
	if o.AmountReceived > 0 {
		op.Amount = o.AmountReceived
	}
	if !o.CompletedAt.IsZero() {
		at := o.CompletedAt.UTC()
		op.CompletedAt = &at
	}
	return op
}

// paymentOpAnswerStatus is the HTTP status of a capture or cancel its
// row settles: 200 done, 402 refused.
func paymentOpAnswerStatus(o ledger.PaymentOp) int {
	if o.Status == ledger.OpRefused {
		return http.StatusPaymentRequired
	}
	return http.StatusOK
}

// refundAnswerStatus is the HTTP status of a refund its row settles: 200
// done (or held pending by the provider: 202), 402 never done or undone.
func refundAnswerStatus(r ledger.Refund) int {
	switch r.Status {
	case ledger.RefundSucceeded:
		return http.StatusOK
	case ledger.RefundFailed, ledger.RefundRefused:
		return http.StatusPaymentRequired
	}
	return http.StatusAccepted
}
