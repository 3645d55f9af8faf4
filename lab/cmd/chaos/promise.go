package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"
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
	case a.status == 201:
		return toldCharged
	case a.status == 202:
		return toldAccepted
	case a.status == 402:
		return toldRefused
	case a.status == 200:
		switch a.state {
		case "succeeded":
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
	answers  []answer
	gaveUp   bool // the client stopped retrying without a final answer

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
		v.unknown += b2i(!accepted && !charged && !refused && !notAccepted)
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
		if (accepted || charged) && !refused && n == 0 {
			broke(k, "accepted, never charged, and no refusal told (row %s)", or(rowStatus[merchant+":"+k.key], "missing"))
		}
		if k.invalid && (accepted || charged) {
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
