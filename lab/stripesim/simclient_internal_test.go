package stripesim

import (
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/provider"
	"github.com/paydedup/paydedup/provider/stripe"
)

// randText returns a string built to break encoders: JSON and URL
// metacharacters, brackets, control bytes, multi-byte runes, U+2028,
// U+FFFD and invalid UTF-8.
func randText(r *rand.Rand, maxLen int) string {
	pieces := []string{
		"a", "Z", "0", "_", "-", ".", "~", " ", "+", "%", "%5B", "&", "=", "?", "/", ";", "#",
		"[", "]", "'", `"`, `\`, "<", ">", "\x00", "\x01", "\t", "\n", "\r", "\b", "\f", "\x7f",
		"é", "ключ", "日本", "\u2028", "\u2029", "\ufffd", "😀", "\xff", "\xc3", "\xe2\x80", "\xed\xa0\x80",
	}
	n := r.IntN(maxLen + 1)
	var b strings.Builder
	for range n {
		b.WriteString(pieces[r.IntN(len(pieces))])
	}
	return b.String()
}

func TestAppendJSONStringMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		s := randText(r, 12)
		if i < 256 {
			s = string([]byte{byte(i)}) // every single byte
		}
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendJSONString(nil, s); string(got) != string(want) {
			t.Fatalf("appendJSONString(%q) = %s, want %s", s, got, want)
		}
		var back string
		if err := json.Unmarshal(want, &back); err != nil {
			t.Fatal(err)
		}
		if got := afterJSON(s); got != back {
			t.Fatalf("afterJSON(%q) = %q, want %q", s, got, back)
		}
	}
}

// The simulator's former response types, rendered by encoding/json: the
// reference its hand-written JSON must match byte for byte.
type refIntent struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	Amount             int64             `json:"amount"`
	AmountReceived     int64             `json:"amount_received"`
	CaptureMethod      string            `json:"capture_method"`
	ConfirmationMethod string            `json:"confirmation_method"`
	Created            int64             `json:"created"`
	Currency           string            `json:"currency"`
	Description        *string           `json:"description"`
	LastPaymentError   *refError         `json:"last_payment_error"`
	LatestCharge       *string           `json:"latest_charge"`
	Livemode           bool              `json:"livemode"`
	Metadata           map[string]string `json:"metadata"`
	PaymentMethod      *string           `json:"payment_method"`
	PaymentMethodTypes []string          `json:"payment_method_types"`
	Status             string            `json:"status"`
}

type refError struct {
	Type          string     `json:"type"`
	Code          string     `json:"code,omitempty"`
	DeclineCode   string     `json:"decline_code,omitempty"`
	Message       string     `json:"message"`
	Param         string     `json:"param,omitempty"`
	PaymentIntent *refIntent `json:"payment_intent,omitempty"`
}

type refEnvelope struct {
	Error *refError `json:"error"`
}

func strPtr(s string) *string { return &s }

// randIntent returns an intent as process would make it, and its reference.
func randIntent(r *rand.Rand) (*simIntent, *refIntent) {
	in := &simIntent{
		id:      "pi_" + randText(r, 4),
		amount:  r.Int64N(1 << 40),
		created: time.Unix(r.Int64N(1<<33), 0),
		// Currencies are checked before an intent exists, but the renderer
		// must not care.
		currency:       randText(r, 3),
		description:    randText(r, 6),
		hasDescription: r.IntN(2) == 0,
		paymentMethod:  "pm_" + randText(r, 3),
		methodTypes:    simCardOnly,
	}
	if r.IntN(3) == 0 {
		in.methodTypes = []string{"card", randText(r, 3)}
		slices.Sort(in.methodTypes)
	}
	ref := &refIntent{
		ID: in.id, Object: "payment_intent", Amount: in.amount, CaptureMethod: "automatic",
		ConfirmationMethod: "automatic", Created: in.created.Unix(), Currency: in.currency,
		Metadata: map[string]string{}, PaymentMethodTypes: in.methodTypes,
	}
	for range r.IntN(6) {
		k, v := randText(r, 4), randText(r, 6)
		if _, dup := ref.Metadata[k]; !dup {
			ref.Metadata[k] = v
			in.metadata = append(in.metadata, simMeta{k, v})
		}
	}
	slices.SortFunc(in.metadata, cmpMetaKey)
	if in.hasDescription {
		ref.Description = strPtr(in.description)
	}
	switch r.IntN(3) {
	case 0:
		in.status = simSucceeded
		in.latestCharge = "ch_" + randText(r, 4)
		ref.AmountReceived = in.amount
		ref.LatestCharge = strPtr(in.latestCharge)
		ref.PaymentMethod = strPtr(in.paymentMethod)
	case 1:
		in.status = simRequiresPaymentMethod
		in.decline = []*simDecline{simGenericDecline, simInsufficientFunds, simExpiredCard}[r.IntN(3)]
		in.paymentMethod = ""
		e := in.decline.cardError()
		ref.LastPaymentError = &refError{Type: e.Type, Code: e.Code, DeclineCode: e.DeclineCode, Message: e.Message}
	default:
		in.status = simRequiresConfirmation
		if r.IntN(2) == 0 {
			in.paymentMethod = ""
		} else {
			ref.PaymentMethod = strPtr(in.paymentMethod)
		}
	}
	ref.Status = in.status
	return in, ref
}

func mustMarshal(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestSimJSONMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	for range 3000 {
		in, ref := randIntent(r)
		if got, want := string(appendIntentJSON(nil, in)), mustMarshal(t, ref); got != want {
			t.Fatalf("intent:\n got %s\nwant %s", got, want)
		}

		// The create answer: the intent, or the 402 card_error carrying it.
		want := mustMarshal(t, ref)
		if in.decline != nil {
			e := *ref.LastPaymentError
			e.PaymentIntent = ref
			want = mustMarshal(t, refEnvelope{&e})
		}
		if got := string(appendCreateAnswer(nil, in)); got != want {
			t.Fatalf("create answer:\n got %s\nwant %s", got, want)
		}

		e := simError{Type: randText(r, 3), Code: randText(r, 2), DeclineCode: randText(r, 2), Message: randText(r, 8), Param: randText(r, 2)}
		refE := refError{Type: e.Type, Code: e.Code, DeclineCode: e.DeclineCode, Message: e.Message, Param: e.Param}
		if got, want := string(appendErrorJSON(nil, &e, nil)), mustMarshal(t, refEnvelope{&refE}); got != want {
			t.Fatalf("error:\n got %s\nwant %s", got, want)
		}
	}
}

func TestSimSearchPageJSON(t *testing.T) {
	t.Parallel()
	type refPage struct {
		Object   string            `json:"object"`
		Data     []json.RawMessage `json:"data"`
		HasMore  bool              `json:"has_more"`
		NextPage *string           `json:"next_page"`
		URL      string            `json:"url"`
	}
	r := rand.New(rand.NewPCG(5, 6))
	for n := range 4 {
		var page []*simIntent
		ref := refPage{Object: "search_result", Data: []json.RawMessage{}, URL: "/v1/payment_intents/search"}
		for range n {
			in, refIn := randIntent(r)
			page = append(page, in)
			ref.Data = append(ref.Data, json.RawMessage(mustMarshal(t, refIn)))
		}
		for _, more := range []bool{false, true} {
			ref.HasMore, ref.NextPage = more, nil
			if more {
				ref.NextPage = strPtr("simpage_" + []string{"7", "8", "9", "10"}[n])
			}
			if got, want := string(appendSearchPage(nil, page, more, 7)), mustMarshal(t, ref); got != want {
				t.Fatalf("page:\n got %s\nwant %s", got, want)
			}
		}
	}
}

func TestAppendQueryEscape(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(7, 8))
	for i := range 5000 {
		s := randText(r, 10)
		if i < 256 {
			s = string([]byte{byte(i)})
		}
		if got, want := string(appendQueryEscape(nil, s)), url.QueryEscape(s); got != want {
			t.Fatalf("appendQueryEscape(%q) = %s, want %s", s, got, want)
		}
	}
}

func TestCmpFormKey(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(9, 10))
	keys := []string{"", "a", "a1", "a b", "a]", "a]b", "a^", "aa", "A", "[", "]", "^"}
	for range 200 {
		keys = append(keys, randText(r, 3))
	}
	for _, a := range keys {
		for _, b := range keys {
			want := strings.Compare("metadata["+a+"]", "metadata["+b+"]")
			if got := cmpFormKey(simMeta{key: a}, simMeta{key: b}); got != want {
				t.Fatalf("cmpFormKey(%q, %q) = %d, want %d", a, b, got, want)
			}
		}
	}
}

// wireBody is an http.RoundTripper that keeps the body of the last request
// and answers it with a succeeded intent, without a network.
type wireBody struct{ body string }

func (w *wireBody) RoundTrip(r *http.Request) (*http.Response, error) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	w.body = string(b)
	return &http.Response{
		StatusCode: http.StatusOK,
		Header:     http.Header{"Content-Type": {"application/json"}},
		Body:       io.NopCloser(strings.NewReader(`{"id":"pi_1","object":"payment_intent","status":"succeeded"}`)),
		Request:    r,
	}, nil
}

// TestChargeFormMatchesStripeGo checks that the canonical form Client
// digests is the one the HTTP handler digests for the adapter's request: the
// body the Stripe adapter sends, parsed and re-encoded by url.Values. It is
// what lets a key replay across the two paths.
func TestChargeFormMatchesStripeGo(t *testing.T) {
	t.Parallel()
	wire := &wireBody{}
	adapter, err := stripe.New(stripe.Config{SecretKey: "sk_test_form", APIBase: "http://sim.invalid",
		HTTPClient: &http.Client{Transport: wire}})
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(11, 12))
	for i := range 3000 {
		req := provider.ChargeRequest{
			ProviderKey:    "pdk_x",
			MerchantID:     randText(r, 4),
			IdempotencyKey: randText(r, 6),
			Amount:         r.Int64N(1<<40) - 1<<20,
			Currency:       randText(r, 3),
			PaymentMethod:  randText(r, 4),
		}
		if r.IntN(2) == 0 {
			req.Description = randText(r, 6)
		}
		if r.IntN(4) > 0 {
			req.Metadata = map[string]string{}
			for range r.IntN(6) {
				req.Metadata[randText(r, 3)] = randText(r, 4)
			}
			if i%7 == 0 {
				req.Metadata[provider.MetadataMerchantID] = "overridden"
			}
		}
		if _, err := adapter.Charge(context.Background(), req); err != nil {
			t.Fatalf("request %+v: %v", req, err)
		}
		body := wire.body
		parsed, err := url.ParseQuery(body)
		if err != nil {
			t.Fatalf("parse %q: %v", body, err)
		}

		p := chargeParams(req)
		got, bodyLen := appendChargeForm(nil, &p)
		if want := parsed.Encode(); string(got) != want {
			t.Fatalf("request %+v:\n got %s\nwant %s", req, got, want)
		}
		if bodyLen != len(body) {
			t.Fatalf("body length %d, want %d (%s)", bodyLen, len(body), body)
		}

		// And chargeParams reads the request as parseCreate reads the body,
		// up to the checks parseCreate runs first.
		fromForm, perr := parseCreate(parsed)
		if e := p.checkCharge(); (e == nil) != (perr == nil) || e != nil && *e != *perr {
			t.Fatalf("request %+v: checkCharge %+v, parseCreate %+v", req, e, perr)
		}
		if perr == nil {
			fromForm.methodTypes, p.methodTypes = nil, nil
			if !equalParams(fromForm, p) {
				t.Fatalf("request %+v:\nchargeParams %+v\n parseCreate %+v", req, p, fromForm)
			}
		}
	}
}

func equalParams(a, b createParams) bool {
	return a.amount == b.amount && a.currency == b.currency && a.paymentMethod == b.paymentMethod &&
		a.confirm == b.confirm && a.description == b.description && a.hasDescription == b.hasDescription &&
		slices.Equal(a.metadata, b.metadata) && slices.Equal(a.methodTypes, b.methodTypes)
}

func TestValidHeaderValue(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		v    string
		want bool
	}{
		{"pdk_plain", true},
		{"with space", true},
		{"tab\tinside", true},
		{"ключ", true},
		{"\xff", true},
		{"nul\x00", false},
		{"ctl\x01", false},
		{"nl\n", false},
		{"cr\r", false},
		{"del\x7f", false},
	} {
		if got := validHeaderValue(tt.v); got != tt.want {
			t.Errorf("validHeaderValue(%q) = %v, want %v", tt.v, got, tt.want)
		}
	}
}
