package gateway_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/propagation"

	"github.com/paydedup/paydedup/gateway"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/payment"
)

// gatewayCardCase is a POST holding a card number and the field its 422
// must name.
type gatewayCardCase struct {
	name, key, body, field string
	hdr                    []string
}

func gatewayCardCases(pan string) []gatewayCardCase {
	with := func(extra string) string {
		return `{"amount":1999,"currency":"usd","payment_method":"pm_card_visa"` + extra + `}`
	}
	joined := strings.ReplaceAll(pan, " ", "")
	cases := []gatewayCardCase{
		{name: "description", key: "card-desc", body: with(`,"description":"card ` + pan + `"`), field: "description"},
		{name: "metadata value", key: "card-meta", body: with(`,"metadata":{"note":"` + pan + `"}`), field: "metadata.note"},
		{name: "metadata key", key: "card-metakey", body: with(`,"metadata":{"` + joined + `":"x"}`), field: "metadata"},
		{name: "payment method", key: "card-pm", body: `{"amount":1999,"currency":"usd","payment_method":"` + joined + `"}`, field: "payment_method"},
		{name: "Idempotency-Key", key: joined, body: with(""), field: "Idempotency-Key"},
		{name: "key in the body too", key: joined, body: with(`,"idempotency_key":"` + joined + `"`), field: "Idempotency-Key"},
		{name: "malformed body", key: "card-malformed", body: `{"description":"` + pan + `",`, field: "body"},
	}
	if isASCII(joined) {
		// Baggage carries ASCII only (anything else percent-encoded, which
		// no detector reads as a number). The application writes it, unlike
		// the tracers' ids, so the door reads it.
		cases = append(cases, gatewayCardCase{name: "baggage carried to the stream", key: "card-baggage", body: with(""),
			field: "header baggage", hdr: []string{"baggage", "note=" + joined}})
	}
	return cases
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// TestCardDataRefusedAtGateway: the HTTP door. A POST with card data in a
// field, in the Idempotency-Key or in a header the command would carry is
// answered 422 urn:paydedup:problem:card-data naming the field, never the
// value; nothing is taken in (no intake row) or published, and the
// gateway's logs never print the number (a refused one never reaches
// "payment accepted", which logs the key). Before the door, each was
// accepted 202, stored, published and logged with its key.
func TestCardDataRefusedAtGateway(t *testing.T) {
	t.Parallel()
	runGatewayCardDoor(t, "4111 1111 1111 1111")
}

func runGatewayCardDoor(t *testing.T, pan string) {
	var logs testenv.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	w := setup(t, gateway.Config{Logger: logger,
		Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})})
	joined := strings.ReplaceAll(pan, " ", "")
	for _, c := range gatewayCardCases(pan) {
		r := w.post(c.key, c.body, c.hdr...)
		if r.status != http.StatusUnprocessableEntity {
			t.Errorf("%s: status %d, want 422; body %s", c.name, r.status, r.body)
			continue
		}
		p := r.problem(t)
		if p.Type != gateway.ProblemCardData || p.Field != c.field || p.Reason != string(payment.ReasonCardData) {
			t.Errorf("%s: problem %+v, want %s naming %q", c.name, p, gateway.ProblemCardData, c.field)
		}
		if strings.Contains(string(r.body), pan) || strings.Contains(string(r.body), joined) {
			t.Errorf("%s: the answer echoes the number: %s", c.name, r.body)
		}
	}
	if n := w.count(`SELECT count(*) FROM gateway_intake`); n != 0 {
		t.Errorf("%d intake rows: card data was taken in", n)
	}
	if n := w.streamMsgs(); n != 0 {
		t.Errorf("%d messages published: card data was published", n)
	}
	// The door passes what is not card data.
	wantStatus(t, w.post("card-after", payBody(1999, "pm_card_visa")), http.StatusAccepted)
	out := logs.String()
	if !strings.Contains(out, "payment accepted") {
		t.Fatal(`no "payment accepted" line: the log capture proves nothing`)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, pan) || strings.Contains(line, joined) {
			t.Errorf("the gateway logged the card number: %s", line)
		}
	}
}

// TestCardDataUnicodeDigits is TestCardDataRefusedAtGateway with the number
// in fullwidth digits. It needs internal/redact's detector of any Unicode
// digit script (the pan branch): with today's, the fields are accepted
// (202) and the keys refused as invalid (400), not as card data.
func TestCardDataUnicodeDigits(t *testing.T) {
	t.Parallel()
	runGatewayCardDoor(t, "４１１１ １１１１ １１１１ １１１１")
}
