package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/lab/pantest"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// FuzzOutputsHoldNoCardNumber writes a card number in any digit script,
// with any separator and escape (pantest.Build), between any two texts,
// into every field of a dead letter, a log line and a command, and checks
// that no output shows one by the detector's own definition: redact.Body,
// redact.ShownBody (the body as the console and dlq show show it), dlq
// list and show as text and JSON, the binary's log handler (JSON and
// text), the validation error a command gets (clipped to 64 bytes) and the
// Dlq-Error header it is stored in.
// The console's pages have their own target (console's
// FuzzLetterPageHoldsNoCardNumber).
func FuzzOutputsHoldNoCardNumber(f *testing.F) {
	for i, s := range [][2]string{{"", ""}, {"card ", " 12/28"}, {`{"description":"`, `"} trailing`}, {"x", "y"}, {"\x1b[2J", "\xff"}, {"order 12 ", ""}} {
		f.Add(uint32(i*977), uint64(4111111111111111), s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pick uint32, body uint64, prefix, suffix string) {
		p := pantest.Build(pick, body)
		s := prefix + p.Text + suffix
		outs := map[string]string{}
		outs["redact.Body"] = string(redact.Body([]byte(s)))
		outs["redact.ShownBody"] = redact.ShownBody([]byte(s))

		d := dlq.Info{Seq: 7, MerchantID: s, IdempotencyKey: s, Invalid: s, Unverified: s, Subject: s,
			ParsedDeadLetter: stream.ParsedDeadLetter{Reason: s, Error: s, OrigSubject: s, OrigStream: s, Deliveries: 2, FailedAt: time.Unix(1, 0), Truncated: true},
			Header:           nats.Header{"X-Note": {s, s}, s: {"v"}}, Data: []byte(s)}
		var b bytes.Buffer
		printShow(&b, d, "PAYMENTS_DLQ", errors.New(s))
		outs["dlq show"] = b.String()
		b.Reset()
		if err := printJSONTo(&b, showJSON(d)); err != nil {
			t.Fatal(err)
		}
		outs["dlq show --json"] = b.String()
		b.Reset()
		if err := printList(&b, []dlq.Info{d, d}); err != nil {
			t.Fatal(err)
		}
		outs["dlq list"] = b.String()
		b.Reset()
		if err := printJSONTo(&b, entries([]dlq.Info{d})); err != nil {
			t.Fatal(err)
		}
		outs["dlq list --json"] = b.String()

		for _, format := range []string{"json", "text"} {
			b.Reset()
			var h slog.Handler = slog.NewJSONHandler(&b, nil)
			if format == "text" {
				h = slog.NewTextHandler(&b, nil)
			}
			l := slog.New(redact.NewHandler(h))
			l.With("idempotency_key", s).Warn(s, "description", s, "error", errors.New(s), slog.Group("g", "metadata", []byte(s)))
			outs["log "+format] = b.String()
		}

		q, _ := json.Marshal(s)
		for _, cmd := range []string{
			`{"merchant_id":"m_1","idempotency_key":"k","amount":1,"currency":` + string(q) + `,"payment_method":"pm_x"}`,
			`{"merchant_id":"m_1","idempotency_key":"k","amount":1,"currency":"usd","payment_method":"pm_x","metadata":{` + string(q) + `:"["}}`,
		} {
			if _, err := payment.Decode([]byte(cmd), payment.Envelope{HeaderKey: s, HeaderKeySet: true}, payment.Limits{}); err != nil {
				outs["validation error"] = err.Error()
				outs["Dlq-Error"] = stream.SanitizeHeader(err.Error())
			}
		}
		outs["Dlq-Error of the text"] = stream.SanitizeHeader(s)

		for name, out := range outs {
			if start, end, ok := redact.FindPAN(out); ok {
				t.Fatalf("%s shows a card number %q (from %q, the number %s as %q):\n%s", name, out[start:end], s, p.Digits, p.Text, out)
			}
		}
	})
}
