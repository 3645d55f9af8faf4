package gateway

import (
	"bytes"
	"context"
	"net/http"
	"time"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// answerKind is how a request is answered.
type answerKind int

const (
	ansPending answerKind = iota // not decided yet
	ansAccepted
	ansReused
	ansReplay
	ansInUse
	ansDeadLetter
	ansNotRepublished
	ansUnavailable
	ansUnauthenticated
	ansPublishUnknown // no PubAck: the command may be stored; the key stays bound
	ansNotQueued      // the stream refused the publish: nothing stored, the key is free
	ansNoStream       // ansNotQueued because the stream does not exist
	ansWaiting        // the payment waits for an operator (202, waiting_for_operator); nothing published
)

// answer is the decision for one POST.
type answer struct {
	kind  answerKind
	rec   ledger.Record // ansReplay, ansWaiting (zero: no record)
	in    ledger.Intake // ansAccepted, ansDeadLetter, ansWaiting
	retry time.Duration // ansInUse
}

// fromRecord decides a POST from the key's record, when the record decides
// it: another fingerprint is 422, a completed key is replayed, a key a
// worker holds is 409. A failed record decides nothing (the command is
// published again if nobody is).
func (g *base) fromRecord(rec ledger.Record, fp []byte) (answer, bool) {
	switch {
	case !bytes.Equal(rec.RequestHash, fp):
		return answer{kind: ansReused}, true
	case rec.Status == ledger.StatusCompleted:
		return answer{kind: ansReplay, rec: rec}, true
	case rec.Status == ledger.StatusPending:
		// A charge takes a few seconds; the lease is only its bound.
		return answer{kind: ansInUse, retry: min(rec.LockedUntil.Sub(g.cfg.Clock.Now()), inFlightRetryAfter)}, true
	}
	return answer{}, false
}

// mayWaitForOperator reports whether a POST that fromRecord decided (a
// and decided are its answer) must read the key's intake first, for a
// dead letter that waits for an operator: a key whose lease ran out
// (a max_deliveries letter leaves it pending) is answered 409 otherwise. A
// failed record is not decided here: the batch's acquisition returns its
// intake row, which fromOperator reads.
func (g *base) mayWaitForOperator(rec ledger.Record, fp []byte, a answer, decided bool) bool {
	return decided && a.kind == ansInUse && rec.Status == ledger.StatusPending &&
		!rec.LockedUntil.After(g.cfg.Clock.Now()) && bytes.Equal(rec.RequestHash, fp)
}

// fromOperator decides a POST from the intake row the batch's acquisition
// returned (res) and the key's record (nil: none) when the payment waits
// for an operator (ledger.Intake.WaitsForOperator): 202 with its state,
// never a publish (an operator's replay decides whether it is charged),
// never a final answer (the replay may still charge it). An intake the
// request acquired must then be released (releaseWaiting).
func fromOperator(rec *ledger.Record, res ledger.IntakeResult, fp []byte) (answer, bool) {
	if res.Outcome != ledger.IntakeAcquired && res.Outcome != ledger.IntakeHeld ||
		!bytes.Equal(res.Intake.RequestHash, fp) || !res.Intake.WaitsForOperator(rec) {
		return answer{}, false
	}
	a := answer{kind: ansWaiting, in: res.Intake}
	if rec != nil {
		a.rec = *rec
	}
	return a, true
}

// inFlightRetryAfter is the Retry-After of a key a worker holds: about a
// provider call's time, not its lease (the most a call may take).
const inFlightRetryAfter = 2 * time.Second

// fromLedger decides a POST whose key has no record from its ledger row.
func fromLedger(p ledger.Payment, cmd *payment.Command) (answer, bool) {
	if p.Amount != cmd.Amount || p.Currency != cmd.Currency {
		return answer{kind: ansReused}, true
	}
	return answer{}, false
}

// write answers a decided POST (not ansAccepted: the caller goes on).
func (g *base) write(w http.ResponseWriter, a answer) {
	switch a.kind {
	case ansReused:
		g.keyReused(w)
	case ansReplay:
		g.metrics.idempotency.WithLabelValues("replayed").Inc()
		writeOutcome(w, a.rec, true)
	case ansInUse:
		g.keyInUse(w, a.retry)
	case ansNotRepublished:
		g.metrics.idempotency.WithLabelValues("not_republished").Inc()
		g.keyInUse(w, g.cfg.QueuedRetryAfter)
	case ansDeadLetter:
		g.metrics.idempotency.WithLabelValues("dead_lettered").Inc()
		g.writeDeadLetter(w, a.in)
	case ansWaiting:
		g.metrics.idempotency.WithLabelValues("waiting_for_operator").Inc()
		w.Header().Set("Location", location(a.in.IdempotencyKey))
		writeJSON(w, http.StatusAccepted, waitingPayment(a.rec, a.in))
	case ansUnauthenticated:
		g.unauthenticated(w)
	case ansPublishUnknown:
		publishUnknown(w)
	case ansNotQueued:
		notQueued(w, problemDetailNotQueued)
	case ansNoStream:
		notQueued(w, problemDetailNoStream)
	default:
		unavailable(w)
	}
}

// fateAnswer is the answer of a POST from an intake fate returned, with
// the key's record (zero: none).
func fateAnswer(rec ledger.Record, in ledger.Intake) answer {
	if in.DeadLettered() {
		return answer{kind: ansDeadLetter, in: in}
	}
	return answer{kind: ansWaiting, in: in, rec: rec}
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

func (g *base) keyReused(w http.ResponseWriter) {
	g.metrics.idempotency.WithLabelValues("mismatch").Inc()
	writeProblem(w, Problem{Type: ProblemKeyReused, Status: http.StatusUnprocessableEntity, Detail: problemDetailKeyReused})
}

func (g *base) keyInUse(w http.ResponseWriter, retry time.Duration) {
	g.metrics.idempotency.WithLabelValues("in_flight").Inc()
	setRetryAfter(w, retry)
	writeProblem(w, Problem{Type: ProblemKeyInUse, Status: http.StatusConflict, Detail: problemDetailKeyInUse})
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

func (g *base) unauthenticated(w http.ResponseWriter) {
	g.metrics.authFailures.Inc()
	w.Header().Set("WWW-Authenticate", bearerInvalid)
	writeProblem(w, Problem{Type: ProblemUnauthenticated, Status: http.StatusUnauthorized, Detail: problemDetailUnauthorized})
}
