package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.opentelemetry.io/otel/propagation"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

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

// doorKey reads a POST's Idempotency-Key. Card data is refused at the
// door, the key's before anything else, even a key otherwise invalid
// (the strict decoding refuses the body's, the publisher's check the
// headers the command carries): nothing of it is stored, published or
// logged.
func doorKey(w http.ResponseWriter, r *http.Request) (string, bool) {
	for _, v := range r.Header.Values("Idempotency-Key") {
		if err := payment.CheckCardData("Idempotency-Key", v); err != nil {
			invalidRequest(w, err)
			return "", false
		}
	}
	key, prob := parseIdempotencyKey(r.Header)
	if prob != nil {
		writeProblem(w, *prob)
		return "", false
	}
	return key, true
}

// readBody reads a POST's body within the body limit; false: it answered.
func (g *Gateway) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
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
			return nil, false
		}
		writeProblem(w, Problem{Type: ProblemInvalidRequest, Status: http.StatusBadRequest, Detail: "The body could not be read."})
		return nil, false
	}
	return body, true
}

// postPayment is POST /v1/payments.
func (g *Gateway) postPayment(w http.ResponseWriter, r *http.Request) {
	merchant := merchantFrom(r.Context())
	key, ok := doorKey(w, r)
	if !ok {
		return
	}
	if !jsonBody(r.Header.Get("Content-Type")) {
		writeProblem(w, Problem{Type: ProblemUnsupportedMedia, Status: http.StatusUnsupportedMediaType, Detail: problemDetailUnsupported})
		return
	}
	body, ok := g.readBody(w, r)
	if !ok {
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
	if rec == nil && in.Currency == "" {
		// A refund's, capture's or cancel's intake (it has no currency):
		// read on its own route.
		notFound(w)
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
	var life ledger.Lifecycle
	if st.Status == ledger.StateAuthorized {
		// A capture or a cancel moves the ledger row, not the
		// authorize's record.
		status, received, err := g.store.PaymentLife(ctx, merchant, key)
		if err != nil && !errors.Is(err, ledger.ErrNotFound) {
			g.logRequestError(r, g.log, "read payment's ledger row", err)
			unavailable(w)
			return
		}
		life.LedgerStatus, life.AmountReceived = status, received
	}
	if ledger.LifeOf(st, life).Status == StateSucceeded {
		var err error
		life.Refunds, life.RefundsTotal, life.AmountRefunded, err = g.store.RefundsOf(ctx, merchant, key)
		if err != nil {
			g.logRequestError(r, g.log, "read refunds", err)
			unavailable(w)
			return
		}
	}
	withLifecycle(&p, st, life)
	writeJSON(w, http.StatusOK, p)
}
