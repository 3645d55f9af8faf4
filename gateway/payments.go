package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.opentelemetry.io/otel/propagation"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
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
	// Outcome is the provider's stored answer, once completed.
	Outcome *Outcome `json:"outcome,omitempty"`
	// Reason is the dead letter's reason of a payment waiting for an
	// operator.
	Reason string `json:"reason,omitempty"`
	// Delay says why a payment that waits for a worker (queued, retrying,
	// or processing with its outcome unknown) is not moving: the workers
	// are paused, or wait for the provider's rate limit. Absent while none is.
	Delay *Delay `json:"delay,omitempty"`
}

// Delay is what the paused workers report: the cause most of them give
// (provider_unavailable: the provider refuses or does not answer;
// provider_auth: it refuses the API key; postgres_unavailable; or
// rate_limited, the workers working but payments waiting for the
// provider's rate limit or the fleet's budget), since when, how many
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
	return p
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

func (g *base) keyReused(w http.ResponseWriter) {
	g.metrics.idempotency.WithLabelValues("mismatch").Inc()
	writeProblem(w, Problem{Type: ProblemKeyReused, Status: http.StatusUnprocessableEntity, Detail: problemDetailKeyReused})
}

func (g *base) keyInUse(w http.ResponseWriter, retry time.Duration) {
	g.metrics.idempotency.WithLabelValues("in_flight").Inc()
	setRetryAfter(w, retry)
	writeProblem(w, Problem{Type: ProblemKeyInUse, Status: http.StatusConflict, Detail: problemDetailKeyInUse})
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

// writeDeadLetter answers a key whose published command the worker
// dead-lettered: final, with the dead letter's reason. Bad input is 400
// (413 for its size), a key reused with another payment 422. (The worker
// records only these final reasons as final: a letter that waits for an
// operator, such as max_deliveries, may still be replayed and charge; it
// is answered waiting_for_operator, never so.)
func (g *base) writeDeadLetter(w http.ResponseWriter, in ledger.Intake) {
	status, typ := http.StatusUnprocessableEntity, ProblemRejected
	switch {
	case in.DeadLetterReason == string(payment.ReasonBodyTooLarge):
		status, typ = http.StatusRequestEntityTooLarge, ProblemTooLarge
	case in.DeadLetterReason == string(payment.ReasonCardData):
		typ = ProblemCardData
	case payment.IsInputReason(in.DeadLetterReason):
		status, typ = http.StatusBadRequest, ProblemInvalidRequest
	case in.DeadLetterReason == "key_reused":
		typ = ProblemKeyReused
	}
	detail := "The payment was not processed (" + in.DeadLetterReason + ")"
	if in.DeadLetterError != "" {
		detail += ": " + in.DeadLetterError
	}
	writeProblem(w, Problem{Type: typ, Status: status, Reason: in.DeadLetterReason,
		Detail: detail + ". This is final for this Idempotency-Key; send a corrected payment with a new key."})
}

// fate returns the intake of a key, for the request fingerprint hash,
// when it settles the answer beside the record rec (nil: none): the
// worker dead-lettered the command (final: Intake.DeadLettered), or the
// payment waits for an operator (Intake.WaitsForOperator).
func (g *base) fate(ctx context.Context, merchant, key string, hash []byte, rec *ledger.Record) (ledger.Intake, bool) {
	in, err := g.store.GetIntake(ctx, merchant, key)
	if err != nil || !bytes.Equal(in.RequestHash, hash) || !in.DeadLettered() && !in.WaitsForOperator(rec) {
		return ledger.Intake{}, false
	}
	return in, true
}

// fateAnswer is the answer of a POST from an intake fate returned, with
// the key's record (zero: none).
func fateAnswer(rec ledger.Record, in ledger.Intake) answer {
	if in.DeadLettered() {
		return answer{kind: ansDeadLetter, in: in}
	}
	return answer{kind: ansWaiting, in: in, rec: rec}
}

// traceHeaders are the trace context headers that travel with the command:
// the request's server span (or, without a tracer, the client's own
// context) as the propagator writes it.
func (g *Gateway) traceHeaders(r *http.Request) map[string]string {
	carrier := propagation.MapCarrier{}
	g.prop.Inject(r.Context(), carrier)
	return carrier
}

// preparer is the optional Check of a Publisher (*stream.CommandPublisher)
// that keeps the message it built, for the batch publish to send as is.
type preparer interface {
	Prepare(cmd *payment.Command, extra map[string]string) (*stream.Checked, error)
}

// check is the Publisher's Check, keeping the message for the batch to
// publish when the Publisher can.
func (g *Gateway) check(cmd *payment.Command, extra map[string]string) (*stream.Checked, error) {
	if pp, ok := g.pub.(preparer); ok {
		return pp.Prepare(cmd, extra)
	}
	return nil, g.pub.Check(cmd, extra)
}

// postPayment is POST /v1/payments.
func (g *Gateway) postPayment(w http.ResponseWriter, r *http.Request) {
	merchant := merchantFrom(r.Context())
	// Card data is refused at the door, the key's before anything else,
	// even a key otherwise invalid (decodeCommand refuses the body's, the
	// publisher's check the headers the command carries): nothing of it is
	// stored, published or logged.
	for _, v := range r.Header.Values("Idempotency-Key") {
		if err := payment.CheckCardData("Idempotency-Key", v); err != nil {
			invalidRequest(w, err)
			return
		}
	}
	key, prob := parseIdempotencyKey(r.Header)
	if prob != nil {
		writeProblem(w, *prob)
		return
	}
	if !jsonBody(r.Header.Get("Content-Type")) {
		writeProblem(w, Problem{Type: ProblemUnsupportedMedia, Status: http.StatusUnsupportedMediaType, Detail: problemDetailUnsupported})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(g.cfg.Limits.MaxBodyBytes)))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			// Closed, not drained (up to 256 KiB, waiting on a client
			// that may never send it): MaxBytesReader tells net/http to
			// close only when given its own ResponseWriter, and w is
			// wrapped.
			w.Header().Set("Connection", "close")
			writeProblem(w, Problem{Type: ProblemTooLarge, Status: http.StatusRequestEntityTooLarge,
				Detail: "The body exceeds " + strconv.Itoa(g.cfg.Limits.MaxBodyBytes) + " bytes.", Reason: string(payment.ReasonBodyTooLarge)})
			return
		}
		writeProblem(w, Problem{Type: ProblemInvalidRequest, Status: http.StatusBadRequest, Detail: "The body could not be read."})
		return
	}
	cmd, err := decodeCommand(body, merchant, key, g.cfg.Limits)
	if err != nil {
		invalidRequest(w, err)
		return
	}
	log := g.log.With("merchant_id", merchant, "idempotency_key", key)
	// The message that will be published, decoded as the worker will: what
	// the worker would dead-letter is refused here, before anything is
	// taken in.
	extra := g.traceHeaders(r)
	checked, err := g.check(cmd, extra)
	if err != nil {
		var ve *payment.ValidationError
		if errors.As(err, &ve) {
			invalidRequest(w, ve)
			return
		}
		log.Error("the payment's message cannot be built", "error", err)
		writeProblem(w, Problem{Type: ProblemInternal, Status: http.StatusInternalServerError, Detail: problemDetailInternal})
		return
	}
	wait := parseWait(r.Header, g.cfg.MaxWait)
	fp := ledger.Fingerprint(cmd)

	// A waiter subscribes before anything is read or published, so a
	// completion committed after any read below wakes it.
	var sub *ledger.Subscription
	if wait > 0 {
		sub = g.comp.Subscribe(merchant, key)
		defer sub.Close()
	}

	it := &item{cmd: cmd, fp: fp, extra: extra, checked: checked, keyHash: apiKeyHashFrom(r.Context()), log: log, done: make(chan answer, 1)}
	if err := g.batch.enqueue(it); err != nil {
		g.shed(w, err)
		return
	}
	a := <-it.done // the batch answers within its own deadlines
	ctx := r.Context()
	if wait > 0 { // only a wait reads after this: no timer per POST otherwise
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.cfg.RequestTimeout+wait)
		defer cancel()
	}
	if a.kind != ansAccepted {
		g.decided(ctx, w, a, sub, wait, merchant, key, fp)
		return
	}
	g.accepted(ctx, w, a.in, sub, wait, fp)
}

// accepted answers a POST whose command was published: 202, or with
// Prefer: wait, its outcome if it completes within the wait.
func (g *Gateway) accepted(ctx context.Context, w http.ResponseWriter, in ledger.Intake, sub *ledger.Subscription, wait time.Duration, fp []byte) {
	merchant, key := in.MerchantID, in.IdempotencyKey
	w.Header().Set("Location", location(key))
	if wait == 0 {
		writeJSON(w, http.StatusAccepted, paymentOf(ledger.AcceptedState(in)))
		return
	}
	w.Header().Set(HeaderPreferenceApplied, "wait="+strconv.Itoa(int(wait/time.Second)))
	rec, dl, ok := g.waitCompleted(ctx, sub, merchant, key, fp, wait)
	switch {
	case ok && !bytes.Equal(rec.RequestHash, fp): // a queue publisher won the key with another payload
		g.keyReused(w)
	case ok:
		writeOutcome(w, rec, false)
	case dl.DeadLettered():
		g.writeDeadLetter(w, dl)
	case dl.OperatorReason != "":
		g.write(w, answer{kind: ansWaiting, in: dl, rec: rec})
	default:
		g.writeCurrent(ctx, w, http.StatusAccepted, merchant, key, paymentOf(ledger.AcceptedState(in)))
	}
}

// decided answers a POST decided without a publish of its own. A key in
// flight (a worker holds it, or its command waits in the stream) honours
// Prefer: wait as a new key's POST does: its outcome (replayed) once it
// completes within the wait, the dead letter's reason if the worker
// dead-lettered it, else the 409 with its Retry-After.
func (g *Gateway) decided(ctx context.Context, w http.ResponseWriter, a answer, sub *ledger.Subscription, wait time.Duration, merchant, key string, fp []byte) {
	if wait == 0 || a.kind != ansInUse && a.kind != ansNotRepublished {
		g.write(w, a)
		return
	}
	w.Header().Set(HeaderPreferenceApplied, "wait="+strconv.Itoa(int(wait/time.Second)))
	rec, dl, ok := g.waitCompleted(ctx, sub, merchant, key, fp, wait)
	if !ok && dl.IdempotencyKey == "" && ctx.Err() == nil {
		// A key that came straight from the queue wakes no waiter: read it
		// once more.
		if got, err := g.records.Get(ctx, merchant, key); err == nil && got.Status == ledger.StatusCompleted {
			rec, ok = got, true
		}
	}
	switch {
	case ok && !bytes.Equal(rec.RequestHash, fp):
		g.keyReused(w)
	case ok:
		g.write(w, answer{kind: ansReplay, rec: rec})
	case dl.IdempotencyKey != "":
		g.write(w, fateAnswer(rec, dl))
	default:
		g.write(w, a)
	}
}

// republishOf numbers a publish under in for its Nats-Msg-Id: 0 (the
// command's own id) unless in was published and the stream has lost that
// copy (heldAgain), then the attempt: the old id may still be inside the
// duplicate window, which would drop the new copy. An intake taken over
// with no mark of a publish (its publisher died, its PubAck or its mark
// was lost) is bound to its payload, so its retry publishes the same
// command under the same id: a copy that did land is dropped by the
// duplicate window, and a later one is harmless (the worker's claim).
func republishOf(in ledger.Intake) int {
	if in.Published() && in.Attempt > 1 {
		return in.Attempt
	}
	return 0
}

// heldAgain handles a retry after the republish hold, whose intake it
// acquired: while the stream still holds the published copy (the worker
// is behind), publishing again only adds a copy, so the key is held for
// another period instead (true). false: publish again.
func (g *base) heldAgain(ctx context.Context, in ledger.Intake, log *slog.Logger) bool {
	stored, err := g.pub.Stored(ctx, in.MerchantID, in.IdempotencyKey, in.StreamSeq)
	if err != nil {
		log.Warn("cannot tell whether the stream holds the published copy; publishing again", "error", err)
		return false
	}
	if !stored {
		return false
	}
	if err := g.store.IntakePublished(ctx, in, in.StreamSeq, g.cfg.RepublishAfter); err != nil && !errors.Is(err, ledger.ErrLeaseLost) {
		log.Warn("could not hold the intake again", "error", err)
	}
	return true
}

// publishFailed settles the intake of a command whose publish failed and
// returns how to answer it. A refusal (stream.Refused: the stream stored
// nothing of it) gives the intake up, so a corrected retry is new: 422
// when another command holds its Nats-Msg-Id, 503 "nothing accepted"
// otherwise (saying so when the stream does not exist). Any other failure
// is an unknown outcome: the command may be stored and charged, so the
// intake stays bound to its payload, its lease released so that the
// client's retry with the same body publishes again at once (same
// Nats-Msg-Id), and the answer is 503 "outcome unknown".
func (g *base) publishFailed(ctx context.Context, in ledger.Intake, err error, log *slog.Logger) answerKind {
	g.metrics.publishes.WithLabelValues("error").Inc()
	if !stream.Refused(err) {
		log.Error("publish outcome unknown (no PubAck): the command may be queued; the key stays bound to its payload", "error", err)
		if rerr := g.store.ReleaseIntake(ctx, in); rerr != nil && !errors.Is(rerr, ledger.ErrLeaseLost) {
			log.Warn("could not release the intake; a retry takes it over once its lease passes", "error", rerr)
		}
		return ansPublishUnknown
	}
	log.Error("publish refused; nothing was stored", "error", err)
	if aerr := g.store.AbandonIntake(ctx, in); aerr != nil && !errors.Is(aerr, ledger.ErrLeaseLost) {
		log.Warn("could not release the intake; it is taken over once its lease passes", "error", aerr)
	}
	switch {
	case errors.Is(err, stream.ErrMsgIDTaken):
		return ansReused
	case errors.Is(err, stream.ErrStreamMissing):
		return ansNoStream
	}
	return ansNotQueued
}

// shed answers a request the batched intake has no room for: 503 when
// the queue is full, 429 when its merchant holds its share of it; both
// say when to retry. Nothing was taken in.
func (g *Gateway) shed(w http.ResponseWriter, err error) {
	setRetryAfter(w, overloadRetryAfter)
	if errors.Is(err, errMerchantBusy) {
		g.metrics.idempotency.WithLabelValues("shed_merchant").Inc()
		writeProblem(w, Problem{Type: ProblemRateLimited, Status: http.StatusTooManyRequests, Detail: problemDetailRateLimited})
		return
	}
	g.metrics.idempotency.WithLabelValues("shed").Inc()
	writeProblem(w, Problem{Type: ProblemUnavailable, Status: http.StatusServiceUnavailable, Detail: problemDetailUnavailable})
}

// logRequestError logs a failed step of a request: at debug level when the
// client went away (its context was cancelled, so the step was cut short:
// nothing to fix), as an error otherwise.
func (g *Gateway) logRequestError(r *http.Request, log *slog.Logger, what string, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		log.Debug(what+": the client went away", "error", err)
		return
	}
	log.Error(what, "error", err)
}

// waitCompleted waits up to wait for the key to complete: it reads the
// record, then sleeps until a notification, the end of the wait, the client
// leaving or a shutdown. No polling. A notification is a completion, or the
// worker dead-lettering the command published for hash (final, or for an
// operator): then the intake is returned (fate), with its reason, and the
// record as read (zero when none). When the wait ends otherwise, the
// intake is read once more.
func (g *Gateway) waitCompleted(ctx context.Context, sub *ledger.Subscription, merchant, key string, hash []byte, wait time.Duration) (ledger.Record, ledger.Intake, bool) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	woken := false
	var rec ledger.Record
	var recp *ledger.Record
	for {
		got, err := g.records.Get(ctx, merchant, key)
		rec, recp = ledger.Record{}, nil
		if err == nil {
			rec, recp = got, &got
		}
		if err == nil && rec.Status == ledger.StatusCompleted {
			g.metrics.waits.WithLabelValues("completed").Inc()
			return rec, ledger.Intake{}, true
		}
		if woken {
			if dl, ok := g.fate(ctx, merchant, key, hash, recp); ok {
				if dl.DeadLettered() {
					g.metrics.waits.WithLabelValues("dead_lettered").Inc()
				} else {
					g.metrics.waits.WithLabelValues("waiting_for_operator").Inc()
				}
				return rec, dl, false
			}
		}
		select {
		case <-sub.C:
			woken = true
			continue
		case <-timer.C:
			g.metrics.waits.WithLabelValues("timeout").Inc()
		case <-g.drain:
			g.metrics.waits.WithLabelValues("shutdown").Inc()
		case <-ctx.Done():
			g.metrics.waits.WithLabelValues("cancelled").Inc()
			return ledger.Record{}, ledger.Intake{}, false
		}
		dl, _ := g.fate(ctx, merchant, key, hash, recp)
		return rec, dl, false
	}
}

// writeCurrent answers with the payment as it stands: the worker's record
// when there is one, else fallback.
func (g *Gateway) writeCurrent(ctx context.Context, w http.ResponseWriter, status int, merchant, key string, fallback Payment) {
	p := fallback
	if rec, err := g.records.Get(ctx, merchant, key); err == nil {
		p = paymentFromRecord(rec)
	}
	writeJSON(w, status, p)
}

// publishSettleWait bounds how long a GET waits for a publish in flight
// to settle (settledIntake).
const publishSettleWait = 2 * time.Second

// settledIntake waits while in, unpublished, is still within its publish
// lease: a publish is in flight, or a batch answered 202 once its PubAck
// was in and has yet to record it (a GET then must not say "not
// accepted" of a payment its client was told is accepted). It reads the
// row again every 10 ms, for at most publishSettleWait, and returns it as
// it then is (ledger.ErrNotFound once the publish failed and was given up),
// with whether its publish is still unsettled.
func (g *Gateway) settledIntake(ctx context.Context, in ledger.Intake) (ledger.Intake, bool, error) {
	inFlight := func(in ledger.Intake) bool { return !in.Published() && in.LockedUntil.After(g.cfg.Clock.Now()) }
	if !inFlight(in) {
		return in, false, nil
	}
	wctx, cancel := context.WithTimeout(ctx, publishSettleWait)
	defer cancel()
	errUnsettled := errors.New("publish unsettled")
	err := backoff.Retry(func() error {
		got, err := g.store.GetIntake(ctx, in.MerchantID, in.IdempotencyKey)
		if err != nil {
			return backoff.Permanent(err)
		}
		if in = got; inFlight(in) {
			return errUnsettled
		}
		return nil
	}, backoff.WithContext(backoff.NewConstantBackOff(10*time.Millisecond), wctx))
	switch {
	case err == nil:
		return in, false, nil
	case errors.Is(err, errUnsettled) || errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		return in, true, nil
	}
	return in, false, err
}

// Errors of readPayment that are answers: the intake's publish was refused
// while a GET waited for it (404 not accepted), or is still unsettled (409).
var (
	errNotAccepted      = errors.New("publish refused")
	errPublishUnsettled = errors.New("publish unsettled")
)

// readPayment reads the rows a GET's state is made of: the key's record
// (nil: none) and, unless it is completed, its intake (nil: none; an
// unreadable intake beside a record counts as none, the record's state
// standing), a publish in flight waited for (settledIntake). Without
// either it returns ledger.ErrNotFound.
func (g *Gateway) readPayment(ctx context.Context, merchant, key string) (*ledger.Record, *ledger.Intake, error) {
	rec, err := g.records.Get(ctx, merchant, key)
	switch {
	case err == nil && rec.Status == ledger.StatusCompleted:
		return &rec, nil, nil
	case err == nil:
		in, err := g.store.GetIntake(ctx, merchant, key)
		if err != nil {
			return &rec, nil, nil
		}
		return &rec, &in, nil
	case !errors.Is(err, ledger.ErrNotFound):
		return nil, nil, fmt.Errorf("read idempotency record: %w", err)
	}
	in, err := g.store.GetIntake(ctx, merchant, key)
	if errors.Is(err, ledger.ErrNotFound) {
		return nil, nil, err
	}
	unsettled := false
	if err == nil {
		in, unsettled, err = g.settledIntake(ctx, in)
	}
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return nil, nil, errNotAccepted // its publish was refused while we waited
	case err != nil:
		return nil, nil, fmt.Errorf("read intake: %w", err)
	case unsettled:
		return nil, &in, errPublishUnsettled
	}
	return nil, &in, nil
}

// readFailed answers a GET whose readPayment failed with err (in: the
// intake it read, if any).
func (g *Gateway) readFailed(w http.ResponseWriter, in *ledger.Intake, err error) {
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		notFound(w)
	case errors.Is(err, errNotAccepted):
		notAccepted(w)
	case errors.Is(err, errPublishUnsettled):
		g.keyInUse(w, in.LockedUntil.Sub(g.cfg.Clock.Now()))
	default:
		g.log.Error("read payment", "error", err)
		unavailable(w)
	}
}

// getPayment is GET /v1/payments/{key}: the payment's state
// (ledger.StateOf) and stored outcome, for its own merchant only. Another
// merchant's key and an unknown key get the same 404; a key whose publish
// failed is 404 "not accepted" (one whose publish is in flight is waited
// for, then 409 if still unsettled: settledIntake); a key whose command
// the worker dead-lettered answers the dead letter's reason, as a retried
// POST would; one that waits for an operator is 200 waiting_for_operator
// with the letter's reason, at once. Prefer: wait=N waits for the
// completion of a payment taken in by the gateway.
func (g *Gateway) getPayment(w http.ResponseWriter, r *http.Request) {
	merchant, key := merchantFrom(r.Context()), r.PathValue("key")
	if payment.ValidateKey(key) != nil {
		notFound(w)
		return
	}
	wait := parseWait(r.Header, g.cfg.MaxWait)
	ctx, cancel := context.WithTimeout(r.Context(), g.cfg.RequestTimeout+wait)
	defer cancel()
	var sub *ledger.Subscription
	if wait > 0 {
		sub = g.comp.Subscribe(merchant, key)
		defer sub.Close()
	}
	rec, in, err := g.readPayment(ctx, merchant, key)
	if err != nil {
		g.readFailed(w, in, err)
		return
	}
	st := ledger.StateOf(in, rec, nil)
	if st.Rejected {
		g.writeDeadLetter(w, *in)
		return
	}
	// Nothing moves a payment waiting for an operator until one replays
	// it, and only keys the gateway took in notify on completion: those
	// are answered at once.
	if wait > 0 && !st.Completed && st.Status != ledger.StateWaitingForOperator && in != nil {
		w.Header().Set(HeaderPreferenceApplied, "wait="+strconv.Itoa(int(wait/time.Second)))
		hash := in.RequestHash // the fingerprint a dead letter must match
		if rec != nil {
			hash = rec.RequestHash
		}
		got, dl, ok := g.waitCompleted(ctx, sub, merchant, key, hash, wait)
		switch {
		case ok:
			st = ledger.StateOf(nil, &got, nil)
		case dl.DeadLettered():
			g.writeDeadLetter(w, dl)
			return
		case dl.IdempotencyKey != "":
			st = ledger.OperatorWaitState(dl, recordOrNil(got))
		}
	}
	p := paymentOf(st)
	if st.WaitsForWorker() {
		p.Delay = g.pauses.get(ctx, g.store, g.log)
	}
	writeJSON(w, http.StatusOK, p)
}

// decodeCommand decodes a POST body, which is a payment command without
// merchant_id: the merchant comes from the API key. It is put in front of
// the body's fields and payment.Decode does the strict decoding, so the
// gateway accepts exactly what the worker accepts. A merchant_id in the
// body is an unknown field here.
func decodeCommand(body []byte, merchant, key string, lim payment.Limits) (*payment.Command, error) {
	env := payment.Envelope{HeaderKey: key, HeaderKeySet: true}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return payment.Decode(body, env, lim) // fails: not an object
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
	return cmd, err
}
