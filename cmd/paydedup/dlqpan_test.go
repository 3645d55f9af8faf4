package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// Issue 54, items 1 to 3, through the CLI: a card number in fullwidth
// digits, JSON-escaped separators in a body that is not one JSON value
// (trailing data, a member given twice), every digit a \u00NN escape, and
// an error cut by dlq list's 100-character column just before the last
// digit reach no output of dlq list, show or status, as text or JSON.
// Before, each was shown: the scan counted ASCII digits only, read a
// JSON body's escapes only when it was one valid value, and list cut the
// error before masking it.
func TestDLQOutputMasksEveryScriptEscapeAndCut(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, testenv.PostgresURL(t), true)
	const pan, wide = "4111111111111111", "４１１１ １１１１ １１１１ １１１１"
	escaped := strings.Repeat(`\u0031`, 15)
	escaped = `\u0034` + escaped
	var seq uint64
	file := func(reason payment.Reason, body, errText string, h nats.Header) {
		t.Helper()
		seq++
		d := stream.Letter{Reason: string(reason), Err: errors.New("x"), OrigSubject: w.cfg.SubjectPrefix + ".m_1",
			OrigStream: w.cfg.Name, OrigSeq: seq, Deliveries: 1, Header: h, Data: []byte(body), FailedAt: time.Now()}
		m := d.Msg(w.cfg)
		// The error as an older worker stored it, before SanitizeHeader
		// masked: the CLI must mask what is already stored.
		m.Header.Set(stream.HeaderDLQError, errText)
		if _, err := w.js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	h := nats.Header{}
	h.Set("X-Note", wide)
	file(payment.ReasonMalformedJSON, `{"merchant_id":"m_1","idempotency_key":"k1","description":"4111\t1111\t1111\t1111"} trailing`,
		strings.Repeat("-", 82)+pan+" declined", h)
	file(payment.ReasonDuplicateField, `{"merchant_id":"m_1","idempotency_key":"k2","description":"4111\t1111\t1111\t1111","description":"ok"}`,
		"duplicate_field: description: appears more than once", nil)
	file(payment.ReasonMalformedJSON, `{"merchant_id":"m_1","idempotency_key":"k3","description":"`+escaped+`"`, "unexpected EOF", nil)
	file(payment.ReasonInvalidCurrency, `{"merchant_id":"m_1","idempotency_key":"`+wide+`","currency":"٤١١١-١١١١-١١١١-١١١١"}`,
		`invalid_currency: currency: "٤١١١-١١١١-١١١١-١١١١" is not a lower-case ISO 4217 code`, nil)
	for _, args := range [][]string{
		{"dlq", "list"}, {"dlq", "list", "--json"},
		{"dlq", "show", "1"}, {"dlq", "show", "1", "--json"}, {"dlq", "show", "2"}, {"dlq", "show", "2", "--json"},
		{"dlq", "show", "3"}, {"dlq", "show", "3", "--json"}, {"dlq", "show", "4"}, {"dlq", "show", "4", "--json"},
		{"status"}, {"status", "--json"},
	} {
		out, _, err := w.run("", args...)
		if err != nil && args[0] != "status" { // status exits non-zero here: the world has no consumer
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		if start, end, ok := redact.FindPAN(out); ok {
			t.Errorf("%v shows a card number, %q:\n%s", args, out[start:end], out)
		}
		for _, s := range []string{pan[:13], "４１１１", "٤١١١", `\u0034\u0031`} {
			if strings.Contains(out, s) {
				t.Errorf("%v shows %q:\n%s", args, s, out)
			}
		}
	}
}

// list --json names a letter's kind and the payment it acts on, each with
// its card numbers masked like every text a publisher wrote.
func TestDLQEntryShowsKindAndPaymentMasked(t *testing.T) {
	t.Parallel()
	e := entry(dlq.Info{Seq: 1, MerchantID: "m_1", IdempotencyKey: "r-1", Kind: "refund", PaymentKey: "pay-4111111111111111"})
	if e.Kind != "refund" || e.PaymentKey != "pay-"+redact.PANMask {
		t.Fatalf("entry kind %q payment %q, want refund and pay-%s", e.Kind, e.PaymentKey, redact.PANMask)
	}
}

// Two columns side by side can show a card number that neither field
// holds alone ("4111 1111" then "1111 1111"): whoever reads the table reads
// them as one, so the table is masked as a whole too.
func TestDLQListMasksNumbersAcrossColumns(t *testing.T) {
	t.Parallel()
	d := dlq.Info{Seq: 1, MerchantID: "m 4111 1111", IdempotencyKey: "1111 1111 k", Verified: true}
	var b strings.Builder
	if err := printList(&b, []dlq.Info{d}); err != nil {
		t.Fatal(err)
	}
	if start, end, ok := redact.FindPAN(b.String()); ok {
		t.Fatalf("dlq list shows %q across its columns:\n%s", b.String()[start:end], b.String())
	}
	if !strings.Contains(b.String(), redact.PANMask) {
		t.Fatalf("no mask:\n%s", b.String())
	}
}

// The same for show --json's headers: two values of one header in their
// JSON list, "4111 1111" then "1111 1111", read as one number.
func TestDLQShowJSONMasksNumbersAcrossHeaderValues(t *testing.T) {
	t.Parallel()
	d := dlq.Info{Seq: 1, Header: nats.Header{"X-Note": {"a 4111 1111", "1111 1111 b"}}, Data: []byte("{}")}
	var b strings.Builder
	if err := printJSONTo(&b, showJSON(d)); err != nil {
		t.Fatal(err)
	}
	if start, end, ok := redact.FindPAN(b.String()); ok {
		t.Fatalf("show --json shows %q across header values:\n%s", b.String()[start:end], b.String())
	}
	if !strings.Contains(b.String(), maskedHeaders) {
		t.Fatalf("the headers are not masked as one:\n%s", b.String())
	}
}

// dlq show prints a body by the console's policy (redact.ShownBody): card
// members (a card's last four digits, its expiry, billing details) are
// replaced and an expanded payment method shrinks to its id, as on the
// console's letter page.
func TestDLQShowHidesCardMembers(t *testing.T) {
	t.Parallel()
	d := dlq.Info{Seq: 1, Data: []byte(`{"payment_method":{"id":"pm_1","card":{"last4":"4242","exp_month":12}},"billing_details":{"name":"Ada"},"amount":5}`)}
	var b strings.Builder
	printShow(&b, d, "PAYMENTS_DLQ", nil)
	out := b.String()
	for _, s := range []string{"4242", "exp_month", "Ada"} {
		if strings.Contains(out, s) {
			t.Errorf("dlq show shows %q:\n%s", s, out)
		}
	}
	if !strings.Contains(out, `"payment_method": "pm_1"`) || !strings.Contains(out, redact.ShownBody(d.Data)) {
		t.Errorf("dlq show does not show the body as redact.ShownBody does:\n%s", out)
	}
}
