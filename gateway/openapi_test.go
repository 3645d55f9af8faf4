package gateway_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/paydedup/paydedup/gateway"
)

// unavailableKey is an API key, well formed, whose lookup fails, as when
// the gateway's database is down.
const unavailableKey = "pd_00000000fa11_lookupFailslookupFailslookupFailslookupFail"

type failingAuth struct{ gateway.Store }

func (f failingAuth) Authenticate(ctx context.Context, apiKey string) (string, error) {
	if apiKey == unavailableKey {
		return "", errors.New("database unreachable")
	}
	return f.Store.Authenticate(ctx, apiKey)
}

// openAPIChecker validates real exchanges against openapi.yaml and
// remembers which documented answers were seen.
type openAPIChecker struct {
	t      *testing.T
	w      *world
	doc    *openapi3.T
	router routers.Router
	seen   map[string]bool // "POST /v1/payments 202"
}

func newOpenAPIChecker(t *testing.T, w *world) *openAPIChecker {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile("../openapi.yaml")
	if err != nil {
		t.Fatalf("load openapi.yaml: %v", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("openapi.yaml is not a valid OpenAPI document: %v", err)
	}
	doc.Servers = openapi3.Servers{{URL: w.base}}
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &openAPIChecker{t: t, w: w, doc: doc, router: router, seen: map[string]bool{}}
}

// exchange sends one request and validates the answer (and, when
// validRequest, the request too) against the document. It returns the
// answer.
func (c *openAPIChecker) exchange(validRequest bool, method, path, apiKey, body string, hdr map[string]string) response {
	c.t.Helper()
	req, err := http.NewRequest(method, c.w.base+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		c.t.Fatalf("%s %s: not in openapi.yaml: %v", method, path, err)
	}
	opts := &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, IncludeResponseStatus: true, MultiError: true}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
	if validRequest {
		if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
			c.t.Errorf("%s %s: the request the gateway accepts does not match openapi.yaml: %v", method, path, err)
		}
		req.Body = io.NopCloser(strings.NewReader(body)) // the validation read it
	}
	resp, err := c.w.client.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header, Options: opts}
	out.SetBodyBytes(b)
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		c.t.Errorf("%s %s: answer %d does not match openapi.yaml: %v\nheaders %v\nbody %s", method, path, resp.StatusCode, err, resp.Header, bytes.TrimSpace(b))
	}
	c.seen[fmt.Sprintf("%s %s %d", method, route.Path, resp.StatusCode)] = true
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// The gateway's real answers, one of every kind it gives, match
// openapi.yaml; and every answer the document lists was seen, except those
// only a fault or a worker's dead letter produces.
func TestGatewayAnswersMatchOpenAPI(t *testing.T) {
	t.Parallel()
	opt := refunder()
	opt.store = func(s gateway.Store) gateway.Store { return failingAuth{s} }
	w := setupWith(t, gateway.Config{}, opt)
	c := newOpenAPIChecker(t, w)
	post := func(valid bool, apiKey, key, body string, hdr ...string) response {
		t.Helper()
		h := map[string]string{}
		if key != "" {
			h["Idempotency-Key"] = key
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			h[hdr[i]] = hdr[i+1]
		}
		return c.exchange(valid, http.MethodPost, "/v1/payments", apiKey, body, h)
	}
	get := func(key string, hdr ...string) response {
		t.Helper()
		h := map[string]string{}
		for i := 0; i+1 < len(hdr); i += 2 {
			h[hdr[i]] = hdr[i+1]
		}
		return c.exchange(false, http.MethodGet, "/v1/payments/"+key, w.keyA, "", h)
	}
	ok := payBody(1999, "pm_card_visa")

	wantStatus(t, post(false, "", "k-auth", ok), http.StatusUnauthorized)
	wantStatus(t, post(false, "not-a-key", "k-auth", ok), http.StatusUnauthorized)
	wantStatus(t, post(false, unavailableKey, "k-auth", ok), http.StatusServiceUnavailable)
	wantStatus(t, post(false, w.keyA, "", ok), http.StatusBadRequest)
	wantStatus(t, post(false, w.keyA, "k-bad", payBody(-5, "pm_card_visa")), http.StatusBadRequest)
	wantStatus(t, post(false, w.keyA, "k-bad", `{"amount":5,"currency":"usd","payment_method":"pm_card_visa","merchant_id":"m_b"}`), http.StatusBadRequest)
	wantStatus(t, post(false, w.keyA, "k-type", ok, "Content-Type", "text/plain"), http.StatusUnsupportedMediaType)
	big := fmt.Sprintf(`{"amount":5,"currency":"usd","payment_method":"pm_card_visa","description":%q}`, strings.Repeat("x", 70<<10))
	wantStatus(t, post(false, w.keyA, "k-big", big), http.StatusRequestEntityTooLarge)
	// Card data, in a field or in the key: the card-data problem.
	card := `{"amount":5,"currency":"usd","payment_method":"pm_card_visa","description":"4111 1111 1111 1111"}`
	for _, r := range []response{post(true, w.keyA, "k-card", card), post(true, w.keyA, "4111111111111111", ok)} {
		wantStatus(t, r, http.StatusUnprocessableEntity)
		if p := r.problem(t); p.Type != gateway.ProblemCardData {
			t.Errorf("card data: problem %+v", p)
		}
	}

	// No worker yet: accepted, queued, held against a concurrent retry,
	// and guarded against another payment under the same key.
	wantStatus(t, post(true, w.keyA, "k-queued", ok), http.StatusAccepted)
	wantStatus(t, get("k-queued"), http.StatusOK)
	wantStatus(t, post(true, w.keyA, "k-queued", ok), http.StatusConflict)
	wantStatus(t, post(true, w.keyA, "k-queued", payBody(2000, "pm_card_visa")), http.StatusUnprocessableEntity)
	wantStatus(t, get("k-unknown"), http.StatusNotFound)
	wantStatus(t, c.exchange(false, http.MethodGet, "/v1/payments/k-queued", "", "", nil), http.StatusUnauthorized)

	// A payment's operations, each under its own key.
	op := func(valid bool, apiKey, payment, what, key, body string, hdr ...string) response {
		t.Helper()
		h := map[string]string{}
		if key != "" {
			h["Idempotency-Key"] = key
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			h[hdr[i]] = hdr[i+1]
		}
		return c.exchange(valid, http.MethodPost, "/v1/payments/"+payment+"/"+what, apiKey, body, h)
	}
	wantStatus(t, op(true, w.keyA, "k-queued", "refunds", "r-queued", `{"amount":100}`), http.StatusAccepted)
	wantStatus(t, op(true, w.keyA, "k-queued", "refunds", "r-queued", `{"amount":100}`), http.StatusConflict)
	wantStatus(t, op(false, w.keyA, "k-queued", "refunds", "r-bad", `{"amount":0}`), http.StatusUnprocessableEntity)
	wantStatus(t, op(false, w.keyA, "k-queued", "refunds", "r-bad", `{"amount":5,"reason":"x"}`), http.StatusBadRequest)
	wantStatus(t, op(false, w.keyA, "k-queued", "refunds", "r-bad", `{"amount":5}`, "Content-Type", "text/plain"), http.StatusUnsupportedMediaType)
	wantStatus(t, op(false, w.keyA, "k-queued", "refunds", "r-bad", fmt.Sprintf(`{"amount":%q}`, strings.Repeat("1", 70<<10))), http.StatusRequestEntityTooLarge)
	wantStatus(t, op(false, "", "k-queued", "refunds", "r-bad", `{"amount":5}`), http.StatusUnauthorized)
	wantStatus(t, op(true, w.keyA, "k-unknown", "refunds", "r-bad", `{"amount":5}`), http.StatusNotFound)
	for _, what := range []string{"capture", "cancel"} {
		wantStatus(t, op(true, w.keyA, "k-queued", what, "o-"+what, ``), http.StatusAccepted)
		wantStatus(t, op(true, w.keyA, "k-queued", what, "o-"+what, ``), http.StatusConflict)
		wantStatus(t, op(false, w.keyA, "k-queued", what, "o-bad", `{"x":1}`), http.StatusBadRequest)
		wantStatus(t, op(true, "", "k-queued", what, "o-"+what, ``), http.StatusUnauthorized)
		wantStatus(t, c.exchange(false, http.MethodGet, "/v1/"+what+"s/o-"+what, w.keyA, "", nil), http.StatusOK)
		wantStatus(t, c.exchange(false, http.MethodGet, "/v1/"+what+"s/o-none", w.keyA, "", nil), http.StatusNotFound)
		wantStatus(t, c.exchange(false, http.MethodGet, "/v1/"+what+"s/o-"+what, "", "", nil), http.StatusUnauthorized)
	}
	wantStatus(t, c.exchange(false, http.MethodGet, "/v1/refunds/r-queued", w.keyA, "", nil), http.StatusOK)
	wantStatus(t, c.exchange(false, http.MethodGet, "/v1/refunds/r-none", w.keyA, "", nil), http.StatusNotFound)
	wantStatus(t, c.exchange(false, http.MethodGet, "/v1/refunds/r-queued", "", "", nil), http.StatusUnauthorized)

	w.startWorker()
	wantStatus(t, post(true, w.keyA, "k-charged", ok, "Prefer", "wait=20"), http.StatusCreated)
	replay := post(true, w.keyA, "k-charged", ok)
	wantStatus(t, replay, http.StatusCreated)
	if replay.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("a replayed charge has Idempotent-Replayed %q", replay.header.Get("Idempotent-Replayed"))
	}
	wantStatus(t, post(true, w.keyA, "k-declined", payBody(1999, "pm_card_chargeDeclined"), "Prefer", "wait=20"), http.StatusPaymentRequired)
	wantStatus(t, get("k-charged", "Prefer", "wait=1"), http.StatusOK)
	w.waitStatus("m_a", "k-queued", "completed")
	wantStatus(t, get("k-queued"), http.StatusOK)
	wantStatus(t, op(true, w.keyA, "k-charged", "refunds", "r-charged", `{"amount":100}`), http.StatusAccepted)
	w.refundFinal("r-charged")
	wantStatus(t, op(true, w.keyA, "k-charged", "refunds", "r-charged", `{"amount":100}`), http.StatusOK)
	wantStatus(t, c.exchange(false, http.MethodGet, "/v1/refunds/r-charged", w.keyA, "", nil), http.StatusOK)
	wantStatus(t, get("k-charged"), http.StatusOK)

	// Not an operation, so not in the document: still a problem.
	r := w.do(http.MethodPut, "/v1/payments", w.keyA, ok, nil)
	wantStatus(t, r, http.StatusMethodNotAllowed)
	if p := r.problem(t); p.Type != gateway.ProblemMethodNotAllowed || r.header.Get("Allow") != http.MethodPost {
		t.Errorf("PUT: problem %+v, Allow %q", p, r.header.Get("Allow"))
	}

	// Only a fault of the service, or a command the worker dead-letters
	// (which the gateway's own checks keep from being published), gives
	// these; only an overload gives a 429 (TestBatchOverloadSheds), or
	// failed authentications a GET's (TestFailedAuthenticationsAreThrottled);
	// only a publish unsettled for seconds a GET's 409
	// (TestBatchAcceptsBeforeThePublishMark holds one).
	unseen := map[string]bool{"POST /v1/payments 500": true, "POST /v1/payments 429": true, "GET /v1/payments/{key} 400": true,
		"GET /v1/payments/{key} 409": true, "GET /v1/payments/{key} 429": true,
		"GET /v1/payments/{key} 413": true, "GET /v1/payments/{key} 422": true, "GET /v1/payments/{key} 503": true}
	// A payment's operations: the faults and overloads as above; a refund
	// the provider refuses (402) only a provider's refusal gives; a
	// capture's and a cancel's other answers are a refund's
	// (TestCaptureThroughTheDoor, TestCancelThroughTheDoor).
	for _, code := range []string{"402", "429", "503"} {
		unseen["POST /v1/payments/{key}/refunds "+code] = true
	}
	for _, code := range []string{"409", "429", "503"} {
		unseen["GET /v1/refunds/{key} "+code] = true
	}
	for _, what := range []string{"capture", "cancel"} {
		for _, code := range []string{"200", "402", "404", "413", "415", "422", "429", "503"} {
			unseen["POST /v1/payments/{key}/"+what+" "+code] = true
		}
		for _, code := range []string{"409", "429", "503"} {
			unseen["GET /v1/"+what+"s/{key} "+code] = true
		}
	}
	var missing []string
	for path, item := range c.doc.Paths.Map() {
		for method, op := range item.Operations() {
			for code := range op.Responses.Map() {
				k := fmt.Sprintf("%s %s %s", method, path, code)
				if !c.seen[k] && !unseen[k] {
					missing = append(missing, k)
				}
			}
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Errorf("openapi.yaml documents answers the test never saw (exercise them, or say why not): %v", missing)
	}
}
