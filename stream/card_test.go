package stream_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/paydedup/paydedup/internal/redact"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

const testPAN = "4111111111111111"

// A card number in the subject or in any stored header is refused as
// card_data naming where it is; trace context and a numeric merchant beside
// a numeric key in Nats-Msg-Id are not card data.
func TestDecodeCommandCardDataHeaders(t *testing.T) {
	t.Parallel()
	cfg := stream.Config{}.WithDefaults()
	body := func(merchant, key string) []byte {
		return []byte(`{"merchant_id":"` + merchant + `","idempotency_key":"` + key + `","amount":1999,"currency":"usd","payment_method":"pm_card_visa"}`)
	}
	for _, c := range []struct {
		name, merchant, key string
		header              nats.Header
		field               string // "" when it must decode
	}{
		{"header value", "m_1", "k", nats.Header{"X-Note": {"card " + testPAN}}, "header X-Note"},
		{"second value", "m_1", "k", nats.Header{"X-Note": {"fine", "4111-1111-1111-1111"}}, "header X-Note"},
		{"header name", "m_1", "k", nats.Header{"X-" + testPAN: {"x"}}, "a header name"},
		{"Idempotency-Key header", "m_1", testPAN, nats.Header{stream.HeaderIdempotencyKey: {testPAN}}, "header Idempotency-Key"},
		{"Nats-Msg-Id part", "m_1", "k", nats.Header{nats.MsgIdHdr: {"m_1:" + testPAN}}, "header Nats-Msg-Id"},
		{"subject", testPAN, "k", nil, "subject"},
		{"trace context of every tracer", "m_1", "k", nats.Header{
			"x-datadog-trace-id":    {testPAN},
			"X-Datadog-Parent-Id":   {testPAN},
			"x-datadog-origin":      {testPAN},
			"B3":                    {testPAN + "-" + testPAN + "-1"},
			"X-B3-TraceId":          {testPAN},
			"X-B3-SpanId":           {testPAN},
			"Uber-Trace-Id":         {testPAN + ":" + testPAN + ":0:1"},
			"X-Amzn-Trace-Id":       {"Root=1-" + testPAN},
			"X-Cloud-Trace-Context": {testPAN + "/" + testPAN + ";o=1"},
			"Sentry-Trace":          {testPAN + "-1"},
			"TRACEPARENT":           {testPAN}}, ""},
		{"baggage, which the application writes", "m_1", "k", nats.Header{"Baggage": {"userId=" + testPAN}}, "header Baggage"},
		{"a name only like a tracer's", "m_1", "k", nats.Header{"X-B3": {testPAN}}, "header X-B3"},
		{"datadog without its dash", "m_1", "k", nats.Header{"X-Datadog": {testPAN}}, "header X-Datadog"},
		{"numeric merchant and key", "1001", "100000000042", nats.Header{nats.MsgIdHdr: {"1001:100000000042"}, stream.HeaderIdempotencyKey: {"100000000042"}}, ""},
		{"traceparent of decimal ids", "m_1", "k", nats.Header{
			"traceparent": {"00-41111111111111114111111111111111-4111111111111111-01"},
			"tracestate":  {"nr=0-0-33-5043-27ddd2d8890283b4-5569065a5b1313bd-1-0.1-1518469636035"}}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := stream.DecodeCommand(cfg, cfg.SubjectPrefix+"."+c.merchant, c.header, body(c.merchant, c.key))
			if c.field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var ve *payment.ValidationError
			if !errors.As(err, &ve) || ve.Reason != payment.ReasonCardData || ve.Field != c.field {
				t.Fatalf("error %v, want %s naming %q", err, payment.ReasonCardData, c.field)
			}
			if strings.Contains(err.Error(), "1111") {
				t.Fatalf("the error quotes the number: %v", err)
			}
		})
	}
}

// A card_data letter keeps no card number: body (as bytes and behind JSON
// escapes), original headers, Dlq-Orig-Msg-Id and the original subject are
// masked, Dlq-Auth verifies over what is stored, and the letter still
// parses. Before the door, the letter kept them all byte for byte.
func TestCardDataLetterMasked(t *testing.T) {
	t.Parallel()
	cfg := stream.Config{DLQKey: []byte("a-dlq-key-of-thirty-two-bytes-or-more")}.WithDefaults()
	data := `{"merchant_id":"` + testPAN + `","idempotency_key":"4111 1111 1111 1111","amount":1999,"currency":"usd",` +
		`"payment_method":"pm_card_visa","description":"card 5555\u0020\u0035555\t5555 4444","metadata":{"` + testPAN + `":"378282246310005"}}`
	h := nats.Header{}
	h.Set(stream.HeaderIdempotencyKey, "4111 1111 1111 1111")
	h.Set(nats.MsgIdHdr, testPAN+":4111 1111 1111 1111")
	h.Set("X-Note", "5555-5555-5555-4444")
	h.Set("X-"+testPAN, "x")
	subject := cfg.SubjectPrefix + "." + testPAN
	err := payment.CardDataError("merchant_id")
	d := stream.Letter{Reason: string(payment.ReasonCardData), Err: err, OrigSubject: subject, OrigStream: "PAYMENTS",
		OrigSeq: 7, Deliveries: 1, Header: h, Data: []byte(data)}
	for _, maxSize := range []int{0, 400} { // whole, and cut to fit a small max_payload
		m := d.MsgWithin(cfg, maxSize)
		if _, err := stream.VerifyLetter(cfg, m.Header, m.Data); err != nil {
			t.Fatalf("max %d: %v", maxSize, err)
		}
		p, err := stream.ParseDeadLetter(m.Header)
		if err != nil {
			t.Fatalf("max %d: %v", maxSize, err)
		}
		if p.Reason != string(payment.ReasonCardData) || m.Subject != cfg.DLQPrefix+".card_data" {
			t.Errorf("max %d: reason %q on %s", maxSize, p.Reason, m.Subject)
		}
		if p.OrigSubject != cfg.SubjectPrefix+"."+strings.ReplaceAll(redact.PANMask, " ", "_") {
			t.Errorf("max %d: original subject %q", maxSize, p.OrigSubject)
		}
		if maxSize == 0 && !strings.Contains(string(m.Data), redact.PANMask) {
			t.Errorf("body not masked but dropped: %s", m.Data)
		}
		var all []string
		all = append(all, string(m.Data), m.Subject)
		for k, vs := range m.Header {
			if k == stream.HeaderDLQAuth || k == stream.HeaderDLQBodySHA256 {
				continue // hex digests of what is stored
			}
			all = append(all, k)
			all = append(all, vs...)
		}
		for _, s := range all {
			if redact.ContainsPAN(s) || strings.Contains(s, "1111") || strings.Contains(s, "5555") || strings.Contains(s, "8282") {
				t.Errorf("max %d: the letter keeps a card number: %q", maxSize, s)
			}
		}
	}
	// Any other reason keeps the message byte for byte: replaying it must
	// publish the same command.
	d.Reason = string(payment.ReasonMalformedJSON)
	if m := d.Msg(cfg); string(m.Data) != data || m.Header.Get("X-Note") != "5555-5555-5555-4444" {
		t.Error("a letter of another reason was masked")
	}
}

// The header check runs on every message the worker reads: without card
// data it allocates nothing, so DecodeCommand costs what Decode does.
func TestDecodeCommandCardDataCheckAllocatesNothing(t *testing.T) {
	cfg := stream.Config{}.WithDefaults()
	data := []byte(`{"merchant_id":"m_1","idempotency_key":"order-42","amount":1999,"currency":"usd","payment_method":"pm_card_visa","description":"order 42"}`)
	h := nats.Header{}
	h.Set(stream.HeaderIdempotencyKey, "order-42")
	h.Set(nats.MsgIdHdr, "m_1:order-42")
	h.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	subject := cfg.SubjectPrefix + ".m_1"
	env := payment.Envelope{SubjectMerchant: "m_1", HeaderKey: "order-42", HeaderKeySet: true}
	decode := testing.AllocsPerRun(200, func() { _, _ = payment.Decode(data, env, payment.Limits{}) })
	full := testing.AllocsPerRun(200, func() { _, _ = stream.DecodeCommand(cfg, subject, h, data) })
	if full > decode {
		t.Fatalf("DecodeCommand makes %v allocations, Decode %v: the card-data check allocates", full, decode)
	}
}
