package stripesim

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/paydedup/paydedup/provider"
)

// The operations after a charge, as Stripe has them: an intent created
// with capture_method=manual is left requires_capture (amount_capturable
// its amount) until POST /v1/payment_intents/{id}/capture takes all or
// part of it — once: Stripe captures an intent once unless the account
// has multicapture, which is not modelled, and a partial capture releases
// the rest — or until a cancel, or the end of Config.CaptureWindow, when
// the simulator cancels it. POST /v1/refunds refunds a succeeded intent,
// several times, never more than it received minus what its refunds hold
// (pending and succeeded ones); a refund may stay pending and fail later
// (Faults.RateRefundFail), which puts its money back and, with a
// WebhookURL, sends refund.updated. GET /v1/refunds
// lists them, newest first. Captures and refunds run whole under the
// simulator's lock, so no second request under their key ever finds the
// first in flight (no 409 for them); their keys replay the first answer
// byte for byte, and refuse other parameters, or a key a create or a
// cancel used, with Stripe's 400 idempotency_error. The in-process Client
// does not have these operations: they are served over HTTP only.

// simPathRefunds is the refunds' path.
const simPathRefunds = "/v1/refunds"

// refundFailureReason is the failure_reason of a refund that fails.
const refundFailureReason = "expired_or_canceled_card"

// Refund is one refund in the simulator's ledger, as it stands.
type Refund struct {
	ID            string `json:"id"`
	PaymentIntent string `json:"payment_intent"`
	// ProviderKey is the Idempotency-Key it was made under, "" if none.
	ProviderKey string `json:"provider_key"`
	// MerchantID and IdempotencyKey come from its metadata.
	MerchantID     string    `json:"merchant_id"`
	IdempotencyKey string    `json:"idempotency_key"`
	Amount         int64     `json:"amount"`
	Currency       string    `json:"currency"`
	Status         string    `json:"status"`
	FailureReason  string    `json:"failure_reason,omitempty"`
	Created        time.Time `json:"created"`
}

// simRefund is a refund as the simulator keeps it.
type simRefund struct {
	id, intentID, chargeID, currency, providerKey, reason string
	account                                               uint32
	amount                                                int64
	status, failureReason                                 string
	failAt                                                time.Time // zero: it does not fail
	metadata                                              []simMeta // sorted by key
	created                                               time.Time
	seq                                                   int // creation order
}

// IntentOp is one capture or cancel the simulator executed, in its
// ledger's report.
type IntentOp struct {
	// PaymentIntent is the intent captured or canceled.
	PaymentIntent string `json:"payment_intent"`
	// ProviderKey is the Idempotency-Key it was executed under, "" if none.
	ProviderKey string `json:"provider_key"`
	// MerchantID and IdempotencyKey are the intent's metadata: the
	// payment's, not the operation's.
	MerchantID     string `json:"merchant_id"`
	IdempotencyKey string `json:"idempotency_key"`
	// Amount is what a capture took, what a cancel released.
	Amount  int64     `json:"amount"`
	Created time.Time `json:"created"`
}

// simOpRec is a capture or a cancel as the simulator logs it.
type simOpRec struct {
	ord    int32
	key    string
	amount int64
	at     time.Time
}

// opRecsLocked renders a log of captures or cancels.
func (s *Simulator) opRecsLocked(log []simOpRec) []IntentOp {
	if len(log) == 0 {
		return nil
	}
	out := make([]IntentOp, len(log))
	for i, o := range log {
		c := s.recs.at(o.ord).charge(s.strTable)
		out[i] = IntentOp{PaymentIntent: c.ID, ProviderKey: o.key, MerchantID: c.MerchantID, IdempotencyKey: c.IdempotencyKey,
			Amount: o.amount, Created: o.at}
	}
	return out
}

// simOpKey is a capture's or a refund's idempotency key: the digest of its
// first request, when it came, and the answer it replays.
type simOpKey struct {
	params  [sha256.Size]byte
	created time.Time
	status  int
	body    []byte
}

// viewLocked is r, the intent at ord, unpacked with what a capture took.
func (s *Simulator) viewLocked(ord int32, r *simRec) *simIntent {
	in := r.view(s.strTable)
	if in.manual && r.statusIs(simSucceeded) {
		in.received = s.captured[ord]
	}
	return in
}

// opKeyTakenLocked reports whether a capture or a refund holds key id.
func (s *Simulator) opKeyTakenLocked(id simKeyID, now time.Time) bool {
	if len(s.opKeys) == 0 {
		return false
	}
	e, ok := s.opKeys[id]
	return ok && now.Sub(e.created) < s.keyTTL
}

// keyTakenLocked reports whether a create or a cancel holds key id.
func (s *Simulator) keyTakenLocked(id simKeyID, now time.Time) bool {
	e, ok := s.keys[id]
	if !ok {
		return false
	}
	return e.inFlight() || now.Sub(s.keyMetaLocked(id, e).created) < s.keyTTL
}

// op runs act for account under idempotency key ("" for none; params is
// the request's digest) with the lock held: a key seen within its window
// replays its first answer, or is an idempotency_error for other
// parameters. It returns the answer and whether it is a replay.
func (s *Simulator) op(account, key string, params [sha256.Size]byte, act func(now time.Time) (int, []byte)) (int, []byte, bool) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var kid simKeyID
	if key != "" {
		kid = simKeyID{key, s.accountLocked(account)}
		if e, ok := s.opKeys[kid]; ok {
			if now.Sub(e.created) < s.keyTTL {
				if e.params != params {
					return replyBody(mismatchReply(key))
				}
				return e.status, e.body, true
			}
			delete(s.opKeys, kid)
		}
		if s.keyTakenLocked(kid, now) {
			return replyBody(mismatchReply(key))
		}
	}
	status, body := act(now)
	if key != "" {
		kid.key = strings.Clone(key)
		s.opKeys[kid] = &simOpKey{params: params, created: now, status: status, body: body}
	}
	return status, body, false
}

func replyBody(r *simReply) (int, []byte, bool) {
	return r.status, renderSim(func(b []byte) []byte { return appendErrorJSON(b, r.err, nil) }), false
}

func errorBody(status int, e *simError) (int, []byte) {
	return status, renderSim(func(b []byte) []byte { return appendErrorJSON(b, e, nil) })
}

func unexpectedState(e string) *simError {
	return &simError{Type: "invalid_request_error", Code: "payment_intent_unexpected_state", Message: e}
}

// captureLocked captures amount (all when 0) of account's intent id
// under key, and logs the capture it executes.
func (s *Simulator) captureLocked(account, key, id string, amount int64, now time.Time) (int, []byte) {
	ord, ok := s.findLocked(account, id)
	if !ok {
		r := missingIntentReply(id)
		return errorBody(r.status, r.err)
	}
	r := s.currentLocked(ord, now)
	if status := simStatuses[r.status]; status != simRequiresCapture {
		return errorBody(http.StatusBadRequest, unexpectedState("This PaymentIntent could not be captured because it has a status of "+status+
			". Only a PaymentIntent with one of the following statuses may be captured: requires_capture."))
	}
	if amount == 0 {
		amount = r.amount
	}
	if amount > r.amount {
		return errorBody(http.StatusBadRequest, &simError{Type: "invalid_request_error", Code: "amount_too_large", Param: "amount_to_capture",
			Message: "The amount to capture (" + strconv.FormatInt(amount, 10) + ") is greater than the amount capturable (" + strconv.FormatInt(r.amount, 10) + ")."})
	}
	r.status = statusIndex(simSucceeded)
	s.publishLocked(ord, r)
	s.captured[ord] = amount
	s.captureLog = append(s.captureLog, simOpRec{ord: ord, key: strings.Clone(key), amount: amount, at: now})
	in := s.viewLocked(ord, &r)
	return http.StatusOK, renderSim(func(b []byte) []byte { return appendIntentJSON(b, in) })
}

// refundNowLocked moves ref to where it stands at now: a pending refund
// whose failure has come fails.
func refundNowLocked(ref *simRefund, now time.Time) {
	if ref.status == provider.RefundPending && !ref.failAt.IsZero() && !now.Before(ref.failAt) {
		ref.status, ref.failureReason = provider.RefundFailed, refundFailureReason
	}
}

// refundParams are the validated parameters of POST /v1/refunds.
type refundParams struct {
	intentID string
	amount   int64
	reason   string
	metadata []simMeta
}

var refundReasons = []string{"duplicate", "fraudulent", "requested_by_customer"}

func parseRefund(form url.Values) (refundParams, *simError) {
	var p refundParams
	if e := unknownParam(form, func(k string) bool {
		return k == "payment_intent" || k == "amount" || k == "reason" || isMetadataParam(k)
	}); e != nil {
		return p, e
	}
	if p.intentID = form.Get("payment_intent"); p.intentID == "" {
		return p, invalidParam("payment_intent", "parameter_missing", "One of the following params should be provided for this request: payment_intent or charge.")
	}
	if a := form.Get("amount"); a != "" {
		n, err := strconv.ParseInt(a, 10, 64)
		if err != nil || n < 1 {
			return p, invalidParam("amount", "parameter_invalid_integer", "Invalid positive integer: "+a)
		}
		p.amount = n
	}
	if p.reason = form.Get("reason"); p.reason != "" && !slices.Contains(refundReasons, p.reason) {
		return p, invalidParam("reason", "parameter_invalid_string", "Invalid reason: must be one of "+strings.Join(refundReasons, ", "))
	}
	for k, vs := range form {
		if isMetadataParam(k) {
			p.metadata = append(p.metadata, simMeta{k[len("metadata[") : len(k)-1], vs[0]})
		}
	}
	slices.SortFunc(p.metadata, cmpMetaKey)
	return p, nil
}

// refundLocked refunds p for account under key, refused past what the
// intent received minus what its refunds hold.
func (s *Simulator) refundLocked(account, key string, p refundParams, now time.Time) (int, []byte) {
	ord, ok := s.findLocked(account, p.intentID)
	if !ok {
		e := missingIntentReply(p.intentID).err
		e.Param = "payment_intent"
		return errorBody(http.StatusNotFound, e)
	}
	r := s.currentLocked(ord, now)
	in := s.viewLocked(ord, &r)
	if in.status != simSucceeded {
		return errorBody(http.StatusBadRequest, unexpectedState("This PaymentIntent has a status of "+in.status+
			" and no successful charge to refund."))
	}
	received := in.amount
	if in.manual {
		received = in.received
	}
	held := int64(0)
	for _, ref := range s.refunds[ord] {
		refundNowLocked(ref, now)
		if ref.status == provider.RefundPending || ref.status == provider.RefundSucceeded || ref.status == provider.RefundRequiresAction {
			held += ref.amount
		}
	}
	left := received - held
	amount := p.amount
	switch {
	case left <= 0:
		return errorBody(http.StatusBadRequest, &simError{Type: "invalid_request_error", Code: "charge_already_refunded",
			Message: "Charge " + in.latestCharge + " has already been refunded."})
	case amount == 0:
		amount = left
	case amount > left:
		return errorBody(http.StatusBadRequest, &simError{Type: "invalid_request_error", Code: "amount_too_large", Param: "amount",
			Message: "Refund amount (" + strconv.FormatInt(amount, 10) + ") is greater than unrefunded amount on charge (" + strconv.FormatInt(left, 10) + ")"})
	}
	ref := &simRefund{
		id: "re_" + s.randIDLocked(intentIDLen-3), intentID: in.id, chargeID: in.latestCharge, currency: in.currency,
		providerKey: strings.Clone(key), reason: p.reason, account: r.account, amount: amount,
		status: provider.RefundSucceeded, metadata: p.metadata, created: now,
	}
	if f := s.faults.RateRefundFail; f > 0 && s.rng.Float64() < f {
		ref.status, ref.failAt = provider.RefundPending, now.Add(s.processing)
		if s.hooks != nil {
			s.scheduleRefundWebhook(ref, s.processing)
		}
	}
	s.refundN++
	ref.seq = s.refundN
	s.refunds[ord] = append(s.refunds[ord], ref)
	return http.StatusOK, refundJSON(ref)
}

// refundObject is a refund as Stripe renders it.
type refundObject struct {
	ID            string            `json:"id"`
	Object        string            `json:"object"`
	Amount        int64             `json:"amount"`
	Charge        string            `json:"charge"`
	Created       int64             `json:"created"`
	Currency      string            `json:"currency"`
	FailureReason *string           `json:"failure_reason"`
	Metadata      map[string]string `json:"metadata"`
	PaymentIntent string            `json:"payment_intent"`
	Reason        *string           `json:"reason"`
	Status        string            `json:"status"`
}

func (ref *simRefund) object() refundObject {
	o := refundObject{ID: ref.id, Object: "refund", Amount: ref.amount, Charge: ref.chargeID, Created: ref.created.Unix(),
		Currency: ref.currency, Metadata: make(map[string]string, len(ref.metadata)), PaymentIntent: ref.intentID, Status: ref.status}
	for _, m := range ref.metadata {
		o.Metadata[m.key] = m.value
	}
	if ref.failureReason != "" {
		o.FailureReason = &ref.failureReason
	}
	if ref.reason != "" {
		o.Reason = &ref.reason
	}
	return o
}

func refundJSON(ref *simRefund) []byte {
	b, err := json.Marshal(ref.object())
	if err != nil {
		// Strings, numbers and a map of strings cannot fail to encode.
		panic("stripesim: encode refund: " + err.Error())
	}
	return b
}

// refundsLocked lists every refund, oldest first, as it stands now.
func (s *Simulator) refundsLocked() []Refund {
	if s.refundN == 0 {
		return nil
	}
	now := s.now()
	out := make([]Refund, 0, s.refundN)
	for _, ref := range s.allRefundsLocked() {
		refundNowLocked(ref, now)
		rf := Refund{ID: ref.id, PaymentIntent: ref.intentID, ProviderKey: ref.providerKey, Amount: ref.amount,
			Currency: ref.currency, Status: ref.status, FailureReason: ref.failureReason, Created: ref.created}
		for _, m := range ref.metadata {
			switch m.key {
			case provider.MetadataMerchantID:
				rf.MerchantID = m.value
			case provider.MetadataIdempotencyKey:
				rf.IdempotencyKey = m.value
			}
		}
		out = append(out, rf)
	}
	return out
}

// FailRefund fails the succeeded refund id, as Stripe may after a refund
// succeeded (the card closed since): its money is back on the intent,
// free to refund again, and, with a WebhookURL, refund.failed is sent at
// once. A refund not succeeded is an error.
func (s *Simulator) FailRefund(id string) error {
	s.mu.Lock()
	var ref *simRefund
	for _, r := range s.allRefundsLocked() {
		if r.id == id {
			ref = r
		}
	}
	if ref == nil || ref.status != provider.RefundSucceeded {
		s.mu.Unlock()
		return fmt.Errorf("stripesim: fail refund %s: no succeeded refund", id)
	}
	ref.status, ref.failureReason = provider.RefundFailed, refundFailureReason
	if s.hooks != nil {
		s.hooks.after(0, func() { s.sendRefundFailed(ref) })
	}
	s.mu.Unlock()
	return nil
}

// allRefundsLocked lists every refund, oldest first.
func (s *Simulator) allRefundsLocked() []*simRefund {
	all := make([]*simRefund, 0, s.refundN)
	for _, refs := range s.refunds {
		all = append(all, refs...)
	}
	slices.SortFunc(all, func(a, b *simRefund) int { return a.seq - b.seq })
	return all
}

// Refunds returns every refund made, as it stands now, oldest first.
func (s *Simulator) Refunds() []Refund {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refundsLocked()
}

// The HTTP front end of the operations.

func (s *Simulator) captureIntent(w http.ResponseWriter, r *http.Request, account string, fate roll) {
	id := r.PathValue("id")
	if e := unknownParam(r.PostForm, func(k string) bool { return k == "amount_to_capture" }); e != nil {
		writeSimError(w, http.StatusBadRequest, e)
		return
	}
	var amount int64
	if a := r.PostForm.Get("amount_to_capture"); a != "" {
		n, err := strconv.ParseInt(a, 10, 64)
		if err != nil || n < 1 {
			writeSimError(w, http.StatusBadRequest, invalidParam("amount_to_capture", "parameter_invalid_integer", "Invalid positive integer: "+a))
			return
		}
		amount = n
	}
	key, params := opKey(w, r, "capture "+id)
	status, body, replayed := s.op(account, key, params, func(now time.Time) (int, []byte) {
		return s.captureLocked(account, key, id, amount, now)
	})
	s.answerOp(w, r, fate, status, body, replayed)
}

func (s *Simulator) createRefund(w http.ResponseWriter, r *http.Request, account string, fate roll) {
	p, e := parseRefund(r.PostForm)
	if e != nil {
		// Like Stripe, a request that fails validation saves nothing under
		// its idempotency key.
		writeSimError(w, http.StatusBadRequest, e)
		return
	}
	key, params := opKey(w, r, "refund")
	status, body, replayed := s.op(account, key, params, func(now time.Time) (int, []byte) {
		return s.refundLocked(account, key, p, now)
	})
	s.answerOp(w, r, fate, status, body, replayed)
}

// opKey reads a POST's Idempotency-Key and the digest of what it asks
// (what, then its form in canonical order).
func opKey(w http.ResponseWriter, r *http.Request, what string) (string, [sha256.Size]byte) {
	key := strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	if key == "" {
		return "", [sha256.Size]byte{}
	}
	w.Header().Set("Idempotency-Key", key)
	return key, sha256.Sum256([]byte(what + "?" + r.PostForm.Encode()))
}

// answerOp writes a capture's or a refund's answer, unless the fate drops
// it after the operation acted.
func (s *Simulator) answerOp(w http.ResponseWriter, r *http.Request, fate roll, status int, body []byte, replayed bool) {
	if fate.dropAfter {
		s.fault("drop_after_charge", r.Method, r.URL.Path)
		dropConn(w)
		return
	}
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	writeSimRaw(w, status, body)
}

// listRefunds serves GET /v1/refunds: account's refunds, of one intent
// when payment_intent is given, created in the range that created (an
// exact second) and created[gte], [gt], [lte], [lt] give (Unix seconds, as
// Stripe's), newest first, after starting_after.
func (s *Simulator) listRefunds(w http.ResponseWriter, r *http.Request, account string, _ roll) {
	// The intents' list parameters (created, limit, starting_after), and
	// payment_intent.
	form := maps.Clone(r.Form)
	delete(form, "payment_intent")
	created, after, limit, e := parseList(form)
	if e != nil {
		writeSimError(w, http.StatusBadRequest, e)
		return
	}
	intentID := r.Form.Get("payment_intent")
	now := s.now()
	s.mu.Lock()
	var all []*simRefund
	if a, ok := s.accounts[account]; ok {
		for _, ref := range s.allRefundsLocked() {
			if ref.account == a && (intentID == "" || ref.intentID == intentID) {
				refundNowLocked(ref, now)
				all = append(all, ref)
			}
		}
	}
	slices.SortFunc(all, func(a, b *simRefund) int { return b.seq - a.seq })
	start := 0
	if after != "" {
		start = slices.IndexFunc(all, func(ref *simRefund) bool { return ref.id == after }) + 1
		if start == 0 {
			s.mu.Unlock()
			writeSimError(w, http.StatusBadRequest, invalidParam("starting_after", "resource_missing", "No such refund: '"+after+"'"))
			return
		}
	}
	page := struct {
		Object  string         `json:"object"`
		Data    []refundObject `json:"data"`
		HasMore bool           `json:"has_more"`
		URL     string         `json:"url"`
	}{Object: "list", Data: []refundObject{}, URL: simPathRefunds}
	// The cursor is found among every refund, the range applied after it
	// (as Stripe's starting_after names an object, not a position in the
	// filtered list).
	for _, ref := range all[start:] {
		if !created.match(ref.created) {
			continue
		}
		if len(page.Data) == limit {
			page.HasMore = true
			break
		}
		page.Data = append(page.Data, ref.object())
	}
	s.mu.Unlock()
	body, err := json.Marshal(page)
	if err != nil {
		panic("stripesim: encode refunds: " + err.Error())
	}
	writeSimRaw(w, http.StatusOK, body)
}
