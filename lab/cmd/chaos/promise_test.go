package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/paydedup/paydedup/client"
	"github.com/paydedup/paydedup/lab/stripesim"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		a    answer
		want told
	}{
		{answer{method: "POST", status: 202, state: "queued"}, toldAccepted},
		{answer{method: "POST", status: 201, state: "succeeded"}, toldCharged},
		{answer{method: "POST", status: 402, state: "declined"}, toldRefused},
		{answer{method: "POST", status: 400, problem: "invalid-request"}, toldRefused},
		{answer{method: "POST", status: 422, problem: "idempotency-key-reused"}, toldRefused},
		{answer{method: "POST", status: 409, problem: "idempotency-key-in-use"}, toldUnknown},
		{answer{method: "POST", status: 429, problem: "rate-limited"}, toldUnknown},
		{answer{method: "POST", status: 503, problem: "unavailable"}, toldUnknown},
		{answer{method: "POST", status: 500, problem: "internal"}, toldNotAccepted},
		{answer{method: "POST", status: 500, problem: "unavailable"}, toldUnknown},
		{answer{method: "POST", status: 503, problem: "not-accepted"}, toldNotAccepted},
		{answer{method: "POST", err: syscall.ECONNRESET}, toldUnknown},
		{answer{method: "GET", status: 404, problem: "not-accepted"}, toldNotAccepted},
		{answer{method: "GET", status: 404, problem: "not-found"}, toldNothing},
		{answer{method: "GET", status: 200, state: "retrying"}, toldAccepted},
		{answer{method: "GET", status: 200, state: "publish_unknown"}, toldUnknown},
		{answer{method: "POST", status: 503, problem: "publish-outcome-unknown"}, toldUnknown},
		{answer{method: "GET", status: 200, state: "succeeded"}, toldCharged},
		{answer{method: "GET", status: 200, state: "declined"}, toldRefused},
		{answer{method: "GET", status: 401, problem: "unauthenticated"}, toldUnknown},
		{answer{method: "POST", status: 201, state: "authorized"}, toldAuthorized},
		{answer{method: "GET", status: 200, state: "canceled"}, toldAuthorized},
		{answer{method: "GET", status: 200, state: "partially_refunded"}, toldCharged},
		{answer{method: "GET", status: 200, state: "refunded"}, toldCharged},
	} {
		if got := classify(tc.a); got != tc.want {
			t.Errorf("classify(%s) = %d, want %d", tc.a.label(), got, tc.want)
		}
	}
	for err, want := range map[error]string{
		context.DeadlineExceeded: "timeout", syscall.ECONNREFUSED: "refused", io.ErrUnexpectedEOF: "reset",
		fmt.Errorf("read: %w", syscall.ECONNRESET): "reset", errors.New("tls"): "error",
	} {
		if got := transportClass(err); got != want {
			t.Errorf("transportClass(%v) = %q, want %q", err, got, want)
		}
	}
}

func TestCheckPromises(t *testing.T) {
	post := func(status int, problem string) answer {
		return answer{method: "POST", status: status, problem: problem}
	}
	get := func(status int, state string) answer { return answer{method: "GET", status: status, state: state} }
	notAccepted := answer{method: "GET", status: 404, problem: "not-accepted"}
	for _, tc := range []struct {
		name    string
		keys    []*keyLog
		charges map[string]int
		rows    map[string]string
		broken  string // a substring of the one broken promise; "" for none
	}{
		{name: "accepted, charged once", keys: []*keyLog{{key: "a", answers: []answer{post(202, "")}}}, charges: map[string]int{"m:a": 1}},
		{name: "accepted, declined and told", keys: []*keyLog{{key: "a", declines: true, answers: []answer{post(202, ""), get(200, "declined")}}}},
		{name: "accepted, never charged, nothing told", keys: []*keyLog{{key: "a", answers: []answer{post(202, ""), get(200, "retrying")}}},
			rows: map[string]string{"m:a": "failed"}, broken: "accepted, never charged, and no refusal told (row failed)"},
		{name: "authorized, canceled, never charged", keys: []*keyLog{{key: "a", authorize: true, answers: []answer{post(202, ""), get(200, "authorized"), get(200, "canceled")}}}},
		{name: "authorized, captured once", keys: []*keyLog{{key: "a", authorize: true, answers: []answer{post(202, ""), get(200, "authorized"), get(200, "succeeded")}}},
			charges: map[string]int{"m:a": 1}},
		{name: "authorized, captured twice", keys: []*keyLog{{key: "a", authorize: true, answers: []answer{get(200, "authorized")}}},
			charges: map[string]int{"m:a": 2}, broken: "charged 2 times"},
		{name: "a charge told authorized", keys: []*keyLog{{key: "a", answers: []answer{{method: "POST", status: 201, state: "authorized"}}}},
			broken: "a charge told authorized"},
		{name: "charged twice", keys: []*keyLog{{key: "a", answers: []answer{post(201, "")}}}, charges: map[string]int{"m:a": 2}, broken: "charged 2 times"},
		{name: "not accepted, new key charged", keys: []*keyLog{
			{order: 1, key: "a", answers: []answer{post(503, "unavailable"), notAccepted}},
			{order: 1, key: "b", answers: []answer{post(202, "")}},
		}, charges: map[string]int{"m:b": 1}},
		{name: "not accepted, but charged", keys: []*keyLog{
			{order: 1, key: "a", answers: []answer{post(503, "unavailable"), notAccepted}},
			{order: 1, key: "b", answers: []answer{post(202, "")}},
		}, charges: map[string]int{"m:a": 1, "m:b": 1}, broken: "told not accepted, but charged"},
		{name: "refused, but charged", keys: []*keyLog{{key: "a", invalid: true, answers: []answer{post(400, "invalid-request")}}},
			charges: map[string]int{"m:a": 1}, broken: "told refused, but charged"},
		{name: "told charged, no charge", keys: []*keyLog{{key: "a", answers: []answer{post(201, "")}}}, broken: "told charged, but the provider has no charge"},
		{name: "unknown, charged once", keys: []*keyLog{{key: "a", gaveUp: true, answers: []answer{{method: "POST", err: context.DeadlineExceeded}}}}, charges: map[string]int{"m:a": 1}},
		{name: "unknown, never charged", keys: []*keyLog{{key: "a", gaveUp: true, answers: []answer{post(503, "unavailable")}}}},
		{name: "unavailable only, charged", keys: []*keyLog{{key: "a", gaveUp: true, answers: []answer{post(503, "unavailable"), {method: "GET", status: 404, problem: "not-found"}}}},
			charges: map[string]int{"m:a": 1}, broken: "every answer said nothing was accepted, yet charged"},
		{name: "unavailable, then accepted and charged", keys: []*keyLog{{key: "a", answers: []answer{post(503, "unavailable"), post(202, "")}}},
			charges: map[string]int{"m:a": 1}},
		{name: "publish unknown, given up, charged", keys: []*keyLog{{key: "a", gaveUp: true, answers: []answer{post(503, "publish-outcome-unknown")}}},
			charges: map[string]int{"m:a": 1}},
		{name: "pending row", keys: []*keyLog{{key: "a", answers: []answer{post(202, "")}}}, charges: map[string]int{"m:a": 1},
			rows: map[string]string{"m:a": "pending"}, broken: "still pending"},
		{name: "accepted then not accepted", keys: []*keyLog{{key: "a", answers: []answer{post(202, ""), notAccepted}}},
			broken: "told both accepted and not accepted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := checkPromises("m", tc.keys, tc.charges, tc.rows)
			switch {
			case tc.broken == "" && !v.ok():
				t.Fatalf("broken: %v", v.broken)
			case tc.broken != "" && (v.ok() || !strings.Contains(strings.Join(v.broken, "\n"), tc.broken)):
				t.Fatalf("want one broken promise with %q, got %q", tc.broken, v.broken)
			}
		})
	}
	// A payment charged under two keys is broken even when no key's own
	// answer was.
	v := checkPromises("m", []*keyLog{
		{order: 7, key: "a", gaveUp: true, answers: []answer{{method: "POST", err: context.DeadlineExceeded}}},
		{order: 7, key: "b", answers: []answer{post(202, "")}},
	}, map[string]int{"m:a": 1, "m:b": 1}, nil)
	if !strings.Contains(strings.Join(v.broken, "\n"), "payment 7 charged under 2 keys") {
		t.Fatalf("a payment charged under two keys: %q", v.broken)
	}
}

// fakeGateway answers each (method, key) from a script, then 202; it
// records every request.
type fakeGateway struct {
	mu     sync.Mutex
	script map[string][]func(http.ResponseWriter)
	seen   []string // "POST key body"
}

func (f *fakeGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if r.Method == http.MethodGet {
		key = strings.TrimPrefix(r.URL.Path, "/v1/payments/")
	}
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.seen = append(f.seen, r.Method+" "+key+" "+string(body))
	id := r.Method + " " + key
	var next func(http.ResponseWriter)
	if s := f.script[id]; len(s) > 0 {
		next, f.script[id] = s[0], s[1:]
	}
	f.mu.Unlock()
	if next == nil {
		next = status(202, "")
	}
	next(w)
}

func status(code int, problem string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		if problem != "" {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(code)
			fmt.Fprintf(w, `{"type":"urn:paydedup:problem:%s","status":%d}`, problem, code)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		fmt.Fprint(w, `{"object":"payment","status":"queued"}`)
	}
}

// TestClientsRecordWhatTheyAreTold drives one client's payment (the Go
// client package, as the run wires it) through a scripted gateway: every
// answer it is given, the retried ones too, lands on its key's log for the
// promise check, every retry sends the same body under the same key, and
// a new key is used only after the client says "not accepted" (or, in the
// negative control, after a 503).
func TestClientsRecordWhatTheyAreTold(t *testing.T) {
	hang := func(w http.ResponseWriter) { time.Sleep(300 * time.Millisecond); status(202, "")(w) }
	for _, tc := range []struct {
		name    string
		script  map[string][]func(http.ResponseWriter)
		slip503 bool
		want    []string // methods and keys, in order
		told    string   // the answers on the keys' logs
	}{
		{name: "503 unavailable: same key", script: map[string][]func(http.ResponseWriter){
			"POST k0": {status(503, "unavailable")},
		}, want: []string{"POST k0", "POST k0"}, told: "k0: POST 503 unavailable, POST 202"},
		{name: "publish outcome unknown: same key", script: map[string][]func(http.ResponseWriter){
			"POST k0": {status(503, "publish-outcome-unknown")},
		}, want: []string{"POST k0", "POST k0"}, told: "k0: POST 503 publish-outcome-unknown, POST 202"},
		{name: "not accepted: new key", script: map[string][]func(http.ResponseWriter){
			"POST k0": {status(404, "not-accepted")},
		}, want: []string{"POST k0", "POST k1"}, told: "k0: POST 404 not-accepted; k1: POST 202"},
		{name: "409 asks how it stands, 429: same key", script: map[string][]func(http.ResponseWriter){
			"POST k0": {status(409, "idempotency-key-in-use"), status(429, "rate-limited")}, "GET k0": {status(503, "unavailable")},
		}, want: []string{"POST k0", "GET k0", "POST k0", "POST k0"},
			told: "k0: POST 409 idempotency-key-in-use, GET 503 unavailable, POST 429 rate-limited, POST 202"},
		{name: "500 internal: same key", script: map[string][]func(http.ResponseWriter){
			"POST k0": {status(500, "internal")},
		}, want: []string{"POST k0", "POST k0"}, told: "k0: POST 500 internal, POST 202"},
		{name: "timeout: same key", script: map[string][]func(http.ResponseWriter){
			"POST k0": {hang},
		}, want: []string{"POST k0", "POST k0"}, told: "k0: POST timeout, POST 202"},
		{name: "400: final", script: map[string][]func(http.ResponseWriter){
			"POST k0": {status(400, "invalid-request")},
		}, want: []string{"POST k0"}, told: "k0: POST 400 invalid-request"},
		{name: "the negative control: a new key after a 503", slip503: true, script: map[string][]func(http.ResponseWriter){
			"POST k0": {status(503, "unavailable")},
		}, want: []string{"POST k0", "POST k1"}, told: "k0: POST 503 unavailable; k1: POST 202"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeGateway{script: map[string][]func(http.ResponseWriter){}}
			for k, s := range tc.script {
				method, key, _ := strings.Cut(k, " ")
				f.script[method+" run-o3-"+key] = s
			}
			srv := httptest.NewServer(f)
			defer srv.Close()
			h := &harness{cfg: config{clientGiveUp: 10 * time.Second, gatewayClients: 1, clientsNewKeyOn503: tc.slip503}, gw: &gatewayRun{
				addr: strings.TrimPrefix(srv.URL, "http://"), apiKey: "k", run: "run", counts: map[string]int{}, byKey: map[string]*keyLog{},
				http: &http.Client{}, attempt: 100 * time.Millisecond,
			}}
			c, err := h.newClient()
			if err != nil {
				t.Fatal(err)
			}
			o := h.newOrder(3)
			body, _ := json.Marshal(o.payment)
			h.pay(context.Background(), c, o)
			var got []string
			for _, s := range f.seen {
				method, rest, _ := strings.Cut(s, " ")
				key, sent, _ := strings.Cut(rest, " ")
				got = append(got, method+" "+strings.TrimPrefix(key, "run-o3-"))
				if method == http.MethodPost && sent != string(body) {
					t.Errorf("%s sent %q, want the payment's body %q", key, sent, body)
				}
			}
			if strings.Join(got, ", ") != strings.Join(tc.want, ", ") {
				t.Fatalf("requests %q, want %q", got, tc.want)
			}
			var told []string
			for _, k := range h.gw.keys {
				labels := make([]string, len(k.answers))
				for i, a := range k.answers {
					labels[i] = a.label()
				}
				told = append(told, strings.TrimPrefix(k.key, "run-o3-")+": "+strings.Join(labels, ", "))
			}
			if strings.Join(told, "; ") != tc.told {
				t.Fatalf("told %q, want %q", strings.Join(told, "; "), tc.told)
			}
		})
	}
}

// TestCheckOperations: the lifecycle's check against the provider's own
// ledger finds a refund or a capture executed twice, a payment refunded
// past what it received, a 202 that never ended, and an operation told
// one thing while the provider did another; a clean lifecycle passes.
func TestCheckOperations(t *testing.T) {
	const m = "m"
	pi, pi2 := "pi_1", "pi_2"
	charge := func(id, key string, amount int64) stripesim.Charge {
		return stripesim.Charge{ID: id, MerchantID: m, IdempotencyKey: key, Amount: amount, Status: "succeeded"}
	}
	refund := func(id, intent, key, pkey string, amount int64, status string) stripesim.Refund {
		return stripesim.Refund{ID: id, PaymentIntent: intent, MerchantID: m, IdempotencyKey: key, ProviderKey: pkey, Amount: amount, Status: status}
	}
	capture := func(intent, payKey, pkey string, amount int64) stripesim.IntentOp {
		return stripesim.IntentOp{PaymentIntent: intent, MerchantID: m, IdempotencyKey: payKey, ProviderKey: pkey, Amount: amount}
	}
	opResult := func(kind string, status client.Status, amount int64) *client.OperationResult {
		return &client.OperationResult{Object: kind, Status: status, Amount: amount}
	}
	accepted := []answer{{method: "POST", status: 202, state: "queued"}}
	refundOp := func(key string, status client.Status, amount int64) *opLog {
		return &opLog{kind: client.KindRefund, key: key, payKey: "p", answers: accepted, last: opResult(client.KindRefund, status, amount)}
	}
	captureOp := func(status client.Status, amount int64) *opLog {
		return &opLog{kind: client.KindCapture, key: "p-capture0", payKey: "p", answers: accepted, last: opResult(client.KindCapture, status, amount)}
	}
	clean := func() stripesim.Ledger {
		return stripesim.Ledger{
			Charges:  []stripesim.Charge{charge(pi, "p", 600)},
			Captures: []stripesim.IntentOp{capture(pi, "p", "pk-cap", 600)},
			Refunds:  []stripesim.Refund{refund("re_1", pi, "p-refund0", "pk-r0", 200, "succeeded"), refund("re_2", pi, "p-refund1", "pk-r1", 400, "succeeded")},
		}
	}
	cleanOps := func() []*opLog {
		return []*opLog{captureOp(client.StatusSucceeded, 600), refundOp("p-refund0", client.StatusSucceeded, 200), refundOp("p-refund1", client.StatusSucceeded, 400)}
	}
	for _, tc := range []struct {
		name   string
		ops    []*opLog
		ledger func(*stripesim.Ledger)
		broken string // a substring of a broken promise; "" for none
		double int
		over   int
	}{
		{name: "clean"},
		{name: "a double refund", ledger: func(l *stripesim.Ledger) {
			l.Refunds = append(l.Refunds, refund("re_3", pi, "p-refund0", "pk-r0", 200, "succeeded"))
		}, broken: "refund m:p-refund0 executed 2 times", double: 2, over: 1},
		{name: "an over-refund", ledger: func(l *stripesim.Ledger) {
			l.Refunds[1].Amount = 500
		}, broken: "refunded 700, more than it received (600)", over: 1},
		{name: "a refund of a payment never charged", ledger: func(l *stripesim.Ledger) {
			l.Refunds = append(l.Refunds, refund("re_9", pi2, "q-refund0", "pk-q", 100, "pending"))
		}, broken: "pi_2 (m:?) refunded 100, more than it received (0)", over: 1},
		{name: "a double capture", ledger: func(l *stripesim.Ledger) {
			l.Captures = append(l.Captures, capture(pi, "p", "pk-cap2", 600))
		}, broken: "captured 2 times", double: 1},
		{name: "a capture under one provider key twice", ledger: func(l *stripesim.Ledger) {
			l.Charges = append(l.Charges, charge(pi2, "q", 100))
			l.Captures = append(l.Captures, capture(pi2, "q", "pk-cap", 100))
		}, broken: "provider key pk-cap: 2 captures", double: 1},
		{name: "a 202 never ended", ops: []*opLog{captureOp(client.StatusSucceeded, 600), refundOp("p-refund0", client.StatusSucceeded, 200),
			refundOp("p-refund1", client.StatusProcessing, 400)}, broken: "accepted (202), never shown final (last processing)"},
		{name: "told succeeded, the provider has none", ledger: func(l *stripesim.Ledger) {
			l.Refunds = l.Refunds[:1]
		}, broken: "p-refund1: refund succeeded (400), the provider has 0 refunds under its key"},
		{name: "told refused, the provider refunded", ops: []*opLog{captureOp(client.StatusSucceeded, 600), refundOp("p-refund0", client.StatusSucceeded, 200),
			{kind: client.KindRefund, key: "p-refund1", payKey: "p", asked: 600, expect: "over_refundable",
				answers: []answer{{method: "POST", status: 422, problem: "payment-rejected"}}}},
			broken: "p-refund1: refused by the ledger's rules, yet the provider has 1 refunds under its key"},
		{name: "an over-refund not refused", ops: []*opLog{captureOp(client.StatusSucceeded, 600), refundOp("p-refund0", client.StatusSucceeded, 200),
			{kind: client.KindRefund, key: "p-refund1", payKey: "p", asked: 600, expect: "over_refundable", answers: accepted,
				last: opResult(client.KindRefund, client.StatusSucceeded, 400)}},
			broken: "p-refund1: asked more than is left, want over_refundable"},
		{name: "an over-refund the client gave up on", ops: []*opLog{captureOp(client.StatusSucceeded, 600), refundOp("p-refund0", client.StatusSucceeded, 200),
			refundOp("p-refund1", client.StatusSucceeded, 400),
			{kind: client.KindRefund, key: "p-refund2", payKey: "p", asked: 600, expect: "over_refundable", gaveUp: true,
				answers: []answer{{method: "POST", status: 503, problem: "unavailable"}}}}},
		{name: "a capture told succeeded for another amount", ops: []*opLog{captureOp(client.StatusSucceeded, 500),
			refundOp("p-refund0", client.StatusSucceeded, 200), refundOp("p-refund1", client.StatusSucceeded, 400)},
			broken: "p-capture0: capture succeeded (500), the provider captured 1 times (600)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := clean()
			if tc.ledger != nil {
				tc.ledger(&l)
			}
			ops := tc.ops
			if ops == nil {
				ops = cleanOps()
			}
			v := checkOperations(m, ops, l)
			switch {
			case tc.broken == "" && !v.ok():
				t.Fatalf("broken: %q", v.broken)
			case tc.broken != "" && !slices.ContainsFunc(v.broken, func(b string) bool { return strings.Contains(b, tc.broken) }):
				t.Fatalf("broken %q, want one with %q", v.broken, tc.broken)
			case v.double != tc.double || v.overRefunded != tc.over:
				t.Fatalf("double=%d over_refunded=%d, want %d and %d (%q)", v.double, v.overRefunded, tc.double, tc.over, v.broken)
			}
		})
	}
}
