package console

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/dlq"
	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/lab/pantest"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/stream"
)

// FuzzLetterPageHoldsNoCardNumber renders the dead letter page and the
// payment lookup (the provider outcome, the row's last error) from a
// letter and a row whose every text holds a card number in any digit
// script, with any separator and escape (pantest.Build), between any two
// texts, and checks the HTML shows none by the detector's own definition.
func FuzzLetterPageHoldsNoCardNumber(f *testing.F) {
	for i, s := range [][2]string{{"", ""}, {"card ", " 12/28"}, {`{"description":"`, `"} trailing`}, {"<b>", "</b>"}, {"&amp;", "\xff"}} {
		f.Add(uint32(i*977), uint64(4111111111111111), s[0], s[1])
	}
	c, err := New(nil, nil, Config{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, pick uint32, body uint64, prefix, suffix string) {
		p := pantest.Build(pick, body)
		s := prefix + p.Text + suffix
		d := dlq.Info{Seq: 7, MerchantID: s, IdempotencyKey: s, Invalid: s, Unverified: s, Subject: s,
			ParsedDeadLetter: stream.ParsedDeadLetter{Reason: s, Error: s, OrigSubject: s, OrigStream: s, Deliveries: 2, FailedAt: time.Unix(1, 0), Truncated: true},
			Header:           nats.Header{"X-Note": {s, s}, s: {"v"}}, Data: []byte(s)}
		rec := ledger.Record{MerchantID: s, IdempotencyKey: s, Status: ledger.Status(s), Currency: s, ChargeID: s, LastError: s, TraceID: s, Response: []byte(s)}
		r := httptest.NewRequest("GET", "/letters/7", nil)
		pages := map[string]func() page{
			"letter": func() page { return c.page(r, "dead letter 7", viewLetter(d)) },
			"payment": func() page {
				return c.page(r, "payment lookup", paymentData{Searched: true, MerchantID: s, IdempotencyKey: s, Record: viewRecord(rec)})
			},
		}
		for name, mk := range pages {
			w := httptest.NewRecorder()
			pg := mk()
			pg.Errors = []string{s}
			c.render(w, 200, map[string]string{"letter": "letter.html", "payment": "payment.html"}[name], pg)
			if out := w.Body.String(); w.Code != 200 {
				t.Fatalf("%s: %d %s", name, w.Code, out)
			} else if start, end, ok := redact.FindPAN(out); ok {
				t.Fatalf("the %s page shows a card number %q (from %q, the number %s as %q)", name, out[start:end], s, p.Digits, p.Text)
			}
		}
	})
}
