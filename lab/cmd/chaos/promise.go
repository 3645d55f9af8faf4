package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strings"
	"syscall"

	"github.com/paydedup/paydedup/client"
	"github.com/paydedup/paydedup/lab/stripesim"
)

// The client's side of the gateway mode (-gateway-clients): what each
// answer told the client, from the documented contract only (docs/clients.md,
// docs/http-api.md, openapi.yaml), never from the gateway's code, and the promise
// check at the end of the run.

// told is what one answer told the client about one key.
type told int

const (
	toldUnknown     told = iota // 503, 409, 429, a timeout, a reset, publish_unknown: retry with the same key and body
	toldAccepted                // 202, or a GET of a payment in flight: charged once or refused, later
	toldCharged                 // 201, or a GET of a succeeded payment
	toldRefused                 // 402, a GET of a declined payment, a 4xx with a reason: final, never charged
	toldNotAccepted             // a problem type ending not-accepted, or 500 internal: never charged, a new key is safe
	toldNothing                 // 404 not-found of a GET: the gateway has no such payment (yet)
	toldAuthorized              // 201 or a GET of an authorized payment (capture_method manual), or of one canceled since: held, never moved
)

// problem types the client reads, by their documented endings, and the
// one payment status that is no answer yet.
const (
	problemNotAccepted  = "not-accepted"
	problemInternal     = "internal"        // 500: "a fault of the service; nothing was accepted"
	statePublishUnknown = "publish_unknown" // sent, not confirmed: retry the POST
)

// answer is one answer as the client saw it.
type answer struct {
	method  string // POST or GET
	status  int    // 0: no HTTP answer (err)
	problem string // the problem type's last segment, if any
	state   string // a payment's status, on 200/201/202
	err     error  // a transport failure
}

// label names the answer in the run's counts: "POST 503 unavailable",
// "GET 200 declined", "POST timeout".
func (a answer) label() string {
	switch {
	case a.status == 0:
		return a.method + " " + transportClass(a.err)
	case a.problem != "":
		return fmt.Sprintf("%s %d %s", a.method, a.status, a.problem)
	case a.state != "" && a.method == "GET":
		return fmt.Sprintf("%s %d %s", a.method, a.status, a.state)
	}
	return fmt.Sprintf("%s %d", a.method, a.status)
}

// transportClass names a failure without an HTTP answer: each is unknown
// to the client (the request may have been handled).
func transportClass(err error) string {
	var ne net.Error
	switch {
	case err == nil:
		return "no answer"
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "reset"
	}
	return "error"
}

// classify maps an answer to what it told, following the client contract.
func classify(a answer) told {
	switch {
	case a.status == 0:
		return toldUnknown
	case a.problem == problemNotAccepted:
		return toldNotAccepted
	case a.status == 500 && a.problem == problemInternal:
		return toldNotAccepted
	case (a.status == 200 || a.status == 201) && (a.state == "authorized" || a.state == "canceled"):
		return toldAuthorized
	case a.status == 201:
		return toldCharged
	case a.status == 202:
		return toldAccepted
	case a.status == 402:
		return toldRefused
	case a.status == 200:
		switch a.state {
		case "succeeded", "partially_refunded", "refunded":
			return toldCharged
		case "declined":
			return toldRefused
		case statePublishUnknown:
			return toldUnknown // may be queued: a POST with the same key and body settles it
		}
		return toldAccepted // queued, processing, retrying: in flight
	case a.status == 404 && a.method == "GET":
		return toldNothing
	case a.status == 409 || a.status == 429 || a.status >= 500:
		return toldUnknown
	case a.status >= 400 && a.status < 500 && a.status != 401 && a.status != 404:
		return toldRefused // 400, 413, 415, 422: final for the key, with a reason
	}
	return toldUnknown
}

// keyLog is everything one key was answered, in order.
type keyLog struct {
	order    int // the client's payment this key paid
	key      string
	declines bool // the card the simulator declines
	invalid  bool // a body the gateway must refuse (400)
	// authorize: a capture_method manual payment, whose money is held,
	// not moved, until a capture (lifecycle.go).
	authorize bool
	answers   []answer
	gaveUp    bool // the client stopped retrying without a final answer

	// The negative control (-clients-new-key-on-503): slip stops the
	// key's payment at its first 503, and slipped says it did.
	slip    func()
	slipped bool

	deadLetters []string // the reasons of the key's dead letters, for the report
}

// what folds the key's answers.
func (k *keyLog) what() (accepted, charged, refused, notAccepted bool) {
	for _, a := range k.answers {
		switch classify(a) {
		case toldAccepted:
			accepted = true
		case toldCharged:
			charged = true
		case toldRefused:
			refused = true
		case toldNotAccepted:
			notAccepted = true
		}
	}
	return
}

// authorized reports whether an answer told the key's payment was
// authorized (or canceled since): its money held, not moved, so no
// charge is owed until a capture.
func (k *keyLog) authorized() bool {
	return slices.ContainsFunc(k.answers, func(a answer) bool { return classify(a) == toldAuthorized })
}

// nothingAccepted reports whether every answer to the key said, as
// documented, that nothing was accepted: 503 unavailable, 429, 500
// internal, not-accepted, or a GET's plain 404.
func (k *keyLog) nothingAccepted() bool {
	for _, a := range k.answers {
		switch {
		case a.status == 503 && a.problem == "unavailable", a.status == 429,
			a.status == 500 && a.problem == problemInternal, a.problem == problemNotAccepted,
			a.method == "GET" && a.status == 404 && a.problem == "not-found":
		default:
			return false
		}
	}
	return len(k.answers) > 0
}

// told lists the key's answers and dead letters, for a report.
func (k *keyLog) told() string {
	seen := make([]string, len(k.answers))
	for i, a := range k.answers {
		seen[i] = a.label()
	}
	s := "answers: " + strings.Join(seen, ", ")
	if len(k.deadLetters) > 0 {
		s += "; dead letters: " + strings.Join(k.deadLetters, ", ")
	}
	return s
}

// promiseVerdict is the promise check of the gateway's keys.
type promiseVerdict struct {
	keys, orders                          int
	accepted, charged, refused, notAccept int // keys told so (a key may count twice: accepted then charged)
	unknown                               int // keys that never got an answer beyond "retry"
	chargedOnce                           int // keys the provider charged exactly once
	broken                                []string
}

func (v promiseVerdict) ok() bool { return len(v.broken) == 0 }

// checkPromises judges every key against the provider's charges (by
// "merchant:key") and the store's row status: each key answered 202/201
// ends charged exactly once or with a refusal the client was told; each key
// told "not accepted" was never charged; a refused key was never charged;
// no key was charged twice, no payment under two keys; no row pending.
func checkPromises(merchant string, keys []*keyLog, charges map[string]int, rowStatus map[string]string) promiseVerdict {
	var v promiseVerdict
	broke := func(k *keyLog, format string, args ...any) {
		v.broken = append(v.broken, fmt.Sprintf("%s: %s (%s)", k.key, fmt.Sprintf(format, args...), k.told()))
	}
	paid := map[int][]*keyLog{}
	orders := map[int]bool{}
	for _, k := range keys {
		v.keys++
		orders[k.order] = true
		n := charges[merchant+":"+k.key]
		if n > 0 {
			paid[k.order] = append(paid[k.order], k)
		}
		if n == 1 {
			v.chargedOnce++
		}
		accepted, charged, refused, notAccepted := k.what()
		v.accepted += b2i(accepted)
		v.charged += b2i(charged)
		v.refused += b2i(refused)
		v.notAccept += b2i(notAccepted)
		authorized := k.authorized()
		v.unknown += b2i(!accepted && !charged && !refused && !notAccepted && !authorized)
		if n > 1 {
			broke(k, "charged %d times", n)
		}
		if notAccepted && n > 0 {
			broke(k, "told not accepted, but charged")
		}
		if k.nothingAccepted() && n > 0 {
			broke(k, "every answer said nothing was accepted, yet charged")
		}
		if notAccepted && (accepted || charged) {
			broke(k, "told both accepted and not accepted")
		}
		if refused && n > 0 {
			broke(k, "told refused, but charged")
		}
		if refused && charged {
			broke(k, "told both charged and refused")
		}
		if charged && n == 0 {
			broke(k, "told charged, but the provider has no charge")
		}
		if (accepted || charged) && !refused && !authorized && n == 0 {
			broke(k, "accepted, never charged, and no refusal told (row %s)", or(rowStatus[merchant+":"+k.key], "missing"))
		}
		if authorized && !k.authorize {
			broke(k, "a charge told authorized")
		}
		if k.invalid && (accepted || charged || authorized) {
			broke(k, "an invalid payment accepted")
		}
		if k.declines && charged {
			broke(k, "a declining card told charged")
		}
		if s := rowStatus[merchant+":"+k.key]; s == "pending" {
			broke(k, "its row is still pending")
		}
	}
	v.orders = len(orders)
	for order, ks := range paid {
		if len(ks) > 1 {
			var each []string
			for _, k := range ks {
				each = append(each, k.key+" ("+k.told()+")")
			}
			v.broken = append(v.broken, fmt.Sprintf("payment %d charged under %d keys: %s", order, len(ks), strings.Join(each, "; ")))
		}
	}
	slices.Sort(v.broken)
	return v
}

// opsVerdict is the check of the lifecycle's operations (lifecycle.go)
// against the provider's ledger.
type opsVerdict struct {
	captures, refunds, cancels int // operations sent, by kind
	succeeded                  int // operations that ended succeeded
	rejected                   int // refused by the ledger's rules (422), never sent
	double                     int // operations the provider executed twice
	overRefunded               int // payments refunded past what they received
	unended                    int // accepted operations never shown final
	broken                     []string
}

func (v opsVerdict) ok() bool { return len(v.broken) == 0 }

// checkOperations judges the operations against the provider's ledger
// (l), which it reads as a whole first: no refund executed twice (two
// provider refunds under one paydedup refund key, or one provider key),
// no capture or cancel executed twice (two of one intent, or under one
// provider key), no intent both captured and canceled, and no intent
// whose refunds that hold money (pending, succeeded) sum past what it
// received. Then each operation: one answered 202 (or shown in flight)
// ends shown final (succeeded, failed, refused); one shown succeeded is
// the provider's (one refund under its key, of its amount, succeeded; the
// payment's one capture, of its amount; its one cancel); one refused,
// by the provider or by the ledger's rules (422), was never executed;
// one asking more than is left, shown final, is refused over_refundable.
func checkOperations(merchant string, ops []*opLog, l stripesim.Ledger) opsVerdict {
	var v opsVerdict
	broke := func(format string, args ...any) { v.broken = append(v.broken, fmt.Sprintf(format, args...)) }

	// The provider's ledger as a whole.
	received := map[string]int64{} // by intent
	payment := map[string]string{} // intent → merchant:key
	for _, c := range l.Charges {
		received[c.ID] = c.Amount
		payment[c.ID] = c.MerchantID + ":" + c.IdempotencyKey
	}
	refundsByKey, refundsByPK := map[string][]stripesim.Refund{}, map[string][]stripesim.Refund{}
	held := map[string]int64{}
	var intents []string
	for _, r := range l.Refunds {
		if r.IdempotencyKey != "" {
			refundsByKey[r.MerchantID+":"+r.IdempotencyKey] = append(refundsByKey[r.MerchantID+":"+r.IdempotencyKey], r)
		}
		if r.ProviderKey != "" {
			refundsByPK[r.ProviderKey] = append(refundsByPK[r.ProviderKey], r)
		}
		if r.Status == "pending" || r.Status == "succeeded" || r.Status == "requires_action" {
			if _, ok := held[r.PaymentIntent]; !ok {
				intents = append(intents, r.PaymentIntent)
			}
			held[r.PaymentIntent] += r.Amount
		}
	}
	ids := func(rs []stripesim.Refund) string {
		s := make([]string, len(rs))
		for i, r := range rs {
			s[i] = fmt.Sprintf("%s %d %s", r.ID, r.Amount, r.Status)
		}
		return strings.Join(s, ", ")
	}
	for _, k := range slices.Sorted(maps.Keys(refundsByKey)) {
		if rs := refundsByKey[k]; len(rs) > 1 {
			v.double++
			broke("refund %s executed %d times at the provider (%s)", k, len(rs), ids(rs))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(refundsByPK)) {
		if rs := refundsByPK[k]; len(rs) > 1 {
			v.double++
			broke("provider key %s: %d refunds (%s)", k, len(rs), ids(rs))
		}
	}
	for _, in := range intents {
		if held[in] > received[in] {
			v.overRefunded++
			broke("intent %s (%s) refunded %d, more than it received (%d)", in, or(payment[in], merchant+":?"), held[in], received[in])
		}
	}
	capturesOf, cancelsOf := map[string][]stripesim.IntentOp{}, map[string][]stripesim.IntentOp{}
	for _, list := range []struct {
		what string
		ops  []stripesim.IntentOp
		of   map[string][]stripesim.IntentOp
	}{{"capture", l.Captures, capturesOf}, {"cancel", l.Cancels, cancelsOf}} {
		byIntent, byPK := map[string]int{}, map[string]int{}
		for _, o := range list.ops {
			byIntent[o.PaymentIntent]++
			if o.ProviderKey != "" {
				byPK[o.ProviderKey]++
			}
			list.of[o.MerchantID+":"+o.IdempotencyKey] = append(list.of[o.MerchantID+":"+o.IdempotencyKey], o)
		}
		for _, in := range slices.Sorted(maps.Keys(byIntent)) {
			if n := byIntent[in]; n > 1 {
				v.double++
				broke("intent %s (%s) %sd %d times at the provider", in, or(payment[in], "?"), list.what, n)
			}
		}
		for _, pk := range slices.Sorted(maps.Keys(byPK)) {
			if n := byPK[pk]; n > 1 {
				v.double++
				broke("provider key %s: %d %ss", pk, n, list.what)
			}
		}
	}
	for _, p := range slices.Sorted(maps.Keys(capturesOf)) {
		if len(cancelsOf[p]) > 0 {
			broke("payment %s both captured and canceled at the provider", p)
		}
	}

	// Each operation.
	for _, o := range ops {
		switch o.kind {
		case client.KindCapture:
			v.captures++
		case client.KindCancel:
			v.cancels++
		default:
			v.refunds++
		}
		accepted, rejected := o.opTold()
		final := o.final()
		v.rejected += b2i(rejected)
		v.succeeded += b2i(final == client.StatusSucceeded)
		obroke := func(format string, args ...any) {
			broke("%s %s: %s (payment %s; %s)", o.kind, o.key, fmt.Sprintf(format, args...), o.payKey, o.told())
		}
		last := "none"
		if o.last != nil {
			last = string(o.last.Status)
		}
		if accepted && !rejected && final == "" {
			v.unended++
			obroke("accepted (202), never shown final (last %s)", last)
		}
		if o.expect != "" && !rejected && final != "" && final != client.StatusRefused {
			obroke("asked more than is left, want %s; shown %s", o.expect, last)
		}
		if rejected && final != "" && final != client.StatusRefused {
			obroke("refused by the ledger's rules (422), then shown %s", final)
		}
		refused := rejected || final == client.StatusRefused
		var amount int64
		if o.last != nil {
			amount = o.last.Amount
		}
		switch o.kind {
		case client.KindRefund:
			rs := refundsByKey[merchant+":"+o.key]
			switch {
			case refused && len(rs) > 0:
				obroke("refused by the ledger's rules, yet the provider has %d refunds under its key (%s)", len(rs), ids(rs))
			case final == client.StatusSucceeded && (len(rs) != 1 || rs[0].Status != "succeeded" || rs[0].Amount != amount):
				obroke("refund succeeded (%d), the provider has %d refunds under its key (%s)", amount, len(rs), ids(rs))
			case final == client.StatusFailed && (len(rs) != 1 || rs[0].Status != "failed" && rs[0].Status != "canceled"):
				obroke("refund failed, the provider has %d refunds under its key (%s)", len(rs), ids(rs))
			}
		case client.KindCapture, client.KindCancel:
			of := capturesOf
			if o.kind == client.KindCancel {
				of = cancelsOf
			}
			done := of[merchant+":"+o.payKey]
			amounts := make([]string, len(done))
			for i, d := range done {
				amounts[i] = fmt.Sprint(d.Amount)
			}
			switch {
			case refused && len(done) > 0:
				obroke("refused, yet the provider %sd the payment %d times", o.kind, len(done))
			case final == client.StatusSucceeded && (len(done) != 1 || o.kind == client.KindCapture && done[0].Amount != amount):
				obroke("%s succeeded (%d), the provider %sd %d times (%s)", o.kind, amount, o.kind, len(done), strings.Join(amounts, ", "))
			}
		}
	}
	slices.Sort(v.broken)
	return v
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
