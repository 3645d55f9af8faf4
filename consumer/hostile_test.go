package consumer_test

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/lab/testenv"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// hostileCase is one kind of hostile message and the one reason it must be
// dead-lettered with.
type hostileCase struct {
	name     string
	merchant string // subject token; "m_h" when empty
	body     string
	hdr      map[string]string
	reason   payment.Reason
}

// hostileBody is a valid command body with its key, then edit applied.
func hostileBody(key string, edit func(map[string]any)) string {
	m := map[string]any{"merchant_id": "m_h", "idempotency_key": key, "amount": 100, "currency": "usd", "payment_method": "pm_card_visa"}
	if edit != nil {
		edit(m)
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func hostileCases() []hostileCase {
	nested := func(depth int) string {
		return strings.Repeat(`{"a":`, depth) + `"x"` + strings.Repeat(`}`, depth)
	}
	manyMeta := map[string]string{}
	for i := range payment.MaxMetadataEntries + 1 {
		manyMeta[fmt.Sprintf("k%02d", i)] = "v"
	}
	const pre = `{"merchant_id":"m_h","idempotency_key":"`
	const post = `","amount":100,"currency":"usd","payment_method":"pm_card_visa"`
	return []hostileCase{
		{name: "body over the size limit", body: hostileBody("h-size", func(m map[string]any) { m["description"] = strings.Repeat("x", payment.DefaultMaxBodyBytes) }), reason: payment.ReasonBodyTooLarge},
		{name: "invalid UTF-8", body: pre + "h-utf8" + "\",\"amount\":100,\"currency\":\"usd\",\"payment_method\":\"pm_\xc3\x28\"}", reason: payment.ReasonInvalidEncoding},
		{name: "overlong UTF-8 encoding of a quote", body: pre + "h-overlong\xc0\xa2" + post + "}", reason: payment.ReasonInvalidEncoding},
		{name: "deeply nested metadata", body: pre + "h-nest" + post + `,"metadata":` + nested(2000) + "}", reason: payment.ReasonMalformedJSON},
		{name: "deeply nested arrays", body: strings.Repeat("[", 30000) + strings.Repeat("]", 30000), reason: payment.ReasonMalformedJSON},
		{name: "huge integer amount", body: pre + "h-bigint" + `","amount":` + strings.Repeat("9", 5000) + `,"currency":"usd","payment_method":"pm_card_visa"}`, reason: payment.ReasonInvalidAmount},
		{name: "huge exponent amount", body: pre + "h-exp" + `","amount":1e999999,"currency":"usd","payment_method":"pm_card_visa"}`, reason: payment.ReasonInvalidAmount},
		{name: "amount one past int64", body: pre + "h-int64" + `","amount":9223372036854775808,"currency":"usd","payment_method":"pm_card_visa"}`, reason: payment.ReasonInvalidAmount},
		{name: "amount as a float", body: pre + "h-float" + `","amount":100.0,"currency":"usd","payment_method":"pm_card_visa"}`, reason: payment.ReasonInvalidAmount},
		{name: "huge number in metadata", body: pre + "h-metanum" + post + `,"metadata":{"n":` + strings.Repeat("1", 3000) + `}}`, reason: payment.ReasonInvalidMetadata},
		{name: "duplicate amount", body: pre + "h-dup" + `","amount":1,"amount":100000,"currency":"usd","payment_method":"pm_card_visa"}`, reason: payment.ReasonDuplicateField},
		{name: "duplicate metadata key", body: pre + "h-dupmeta" + post + `,"metadata":{"a":"1","a":"2"}}`, reason: payment.ReasonDuplicateField},
		{name: "duplicate key spelled with an escape", body: pre + "h-dupesc" + `","amount":1,"am\u006funt":100000,"currency":"usd","payment_method":"pm_card_visa"}`, reason: payment.ReasonDuplicateField},
		{name: "field name in another case", body: pre + "h-case" + `","amount":1,"AMOUNT":100000,"currency":"usd","payment_method":"pm_card_visa"}`, reason: payment.ReasonUnknownField},
		{name: "field name with a Kelvin sign", body: `{"merchant_id":"m_h","idempotency_\u212aey":"h-kelvin","amount":100,"currency":"usd","payment_method":"pm_card_visa"}`, reason: payment.ReasonUnknownField},
		{name: "NUL in the key", body: pre + `h-nul\u0000x` + post + "}", reason: payment.ReasonInvalidKey},
		{name: "escape character in the key", body: pre + `h-esc\u001b[2J` + post + "}", reason: payment.ReasonInvalidKey},
		{name: "control character in a metadata key", body: pre + "h-metactl" + post + `,"metadata":{"a\u0007":"v"}}`, reason: payment.ReasonInvalidMetadata},
		{name: "NUL in the header key", body: hostileBody("", func(m map[string]any) { delete(m, "idempotency_key") }), hdr: map[string]string{"Idempotency-Key": "h-hdr\x00nul"}, reason: payment.ReasonInvalidKey},
		{name: "256-character key", body: hostileBody(strings.Repeat("k", payment.MaxKeyLen+1), nil), reason: payment.ReasonInvalidKey},
		{name: "4096-character header key", body: hostileBody("", func(m map[string]any) { delete(m, "idempotency_key") }), hdr: map[string]string{"Idempotency-Key": strings.Repeat("h", 4096)}, reason: payment.ReasonInvalidKey},
		{name: "header and body disagree", body: hostileBody("h-body", nil), hdr: map[string]string{"Idempotency-Key": "h-header"}, reason: payment.ReasonKeyMismatch},
		{name: "subject and body merchant disagree", merchant: "m_other", body: hostileBody("h-merch", nil), reason: payment.ReasonMerchantMismatch},
		{name: "unknown currency", body: hostileBody("h-cur", func(m map[string]any) { m["currency"] = "xts1" }), reason: payment.ReasonInvalidCurrency},
		{name: "upper-case currency", body: hostileBody("h-cur2", func(m map[string]any) { m["currency"] = "USD" }), reason: payment.ReasonInvalidCurrency},
		{name: "too many metadata entries", body: hostileBody("h-many", func(m map[string]any) { m["metadata"] = manyMeta }), reason: payment.ReasonInvalidMetadata},
		{name: "metadata key too long", body: hostileBody("h-longk", func(m map[string]any) {
			m["metadata"] = map[string]string{strings.Repeat("k", payment.MaxMetadataKeyLen+1): "v"}
		}), reason: payment.ReasonInvalidMetadata},
		{name: "metadata value too long", body: hostileBody("h-longv", func(m map[string]any) {
			m["metadata"] = map[string]string{"k": strings.Repeat("v", payment.MaxMetadataValueLen+1)}
		}), reason: payment.ReasonInvalidMetadata},
		{name: "byte-order mark", body: "\ufeff" + hostileBody("h-bom", nil), reason: payment.ReasonMalformedJSON},
		{name: "trailing second object", body: hostileBody("h-trail", nil) + `{"amount":999}`, reason: payment.ReasonMalformedJSON},
		{name: "empty body", body: "", reason: payment.ReasonMalformedJSON},
	}
}

// TestHostileInput publishes every kind of hostile message, several times
// each, interleaved with 500 good commands on a real NATS server, Postgres
// and the simulator. Each hostile message becomes exactly one dead letter
// with its specific reason and is never claimed; every good command is
// charged once; the worker never panics (a panic would end the test
// binary) and never logs an unbounded line.
func TestHostileInput(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var logs testenv.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e.startWorkerLogged("hostile", logger)

	const good, copies = 500, 3
	cases := hostileCases()
	start := time.Now()
	n := 0
	for i := range good {
		e.publish("m_g", body("m_g", fmt.Sprintf("good-%d", i), int64(100+i)), "", nil)
		if i%5 == 0 && n < len(cases)*copies {
			c := cases[n%len(cases)]
			h := map[string]string{"X-Case": c.name}
			for k, v := range c.hdr {
				h[k] = v
			}
			e.publish(cmp.Or(c.merchant, "m_h"), []byte(c.body), fmt.Sprintf("hostile-%d", n), h)
			n++
		}
	}
	for ; n < len(cases)*copies; n++ {
		c := cases[n%len(cases)]
		h := map[string]string{"X-Case": c.name}
		for k, v := range c.hdr {
			h[k] = v
		}
		e.publish(cmp.Or(c.merchant, "m_h"), []byte(c.body), fmt.Sprintf("hostile-%d", n), h)
	}

	e.eventually("good commands completed", func() bool {
		return e.count(`SELECT count(*) FROM idempotency_keys WHERE merchant_id = 'm_g' AND status = 'completed'`) == good
	})
	t.Logf("%d good commands completed among %d hostile ones in %v", good, n, time.Since(start).Round(time.Millisecond))
	e.eventually("dead letters filed", func() bool { return len(e.deadLetters()) == len(cases)*copies })
	e.quiescent()

	byCase := map[string][]string{}
	for _, m := range e.deadLetters() {
		p, err := stream.ParseDeadLetter(m.Header)
		if err != nil {
			t.Errorf("unparseable dead letter: %v", err)
			continue
		}
		if len(p.Error) > 1024 || strings.ContainsAny(p.Error, "\r\n") {
			t.Errorf("%s: Dlq-Error is %d bytes", m.Header.Get("X-Case"), len(p.Error))
		}
		byCase[m.Header.Get("X-Case")] = append(byCase[m.Header.Get("X-Case")], p.Reason)
	}
	for _, c := range cases {
		got := byCase[c.name]
		if len(got) != copies {
			t.Errorf("%s: %d dead letters, want %d", c.name, len(got), copies)
		}
		for _, r := range got {
			if r != string(c.reason) {
				t.Errorf("%s: reason %s, want %s", c.name, r, c.reason)
			}
		}
	}
	if rows := e.count(`SELECT count(*) FROM idempotency_keys WHERE merchant_id <> 'm_g'`); rows != 0 {
		t.Errorf("%d hostile messages were claimed", rows)
	}
	if charged := len(e.sim.ChargesByKey()); charged != good {
		t.Errorf("%d keys charged, want %d", charged, good)
	}
	for k, c := range e.sim.ChargesByKey() {
		if c != 1 {
			t.Errorf("%s charged %d times", k, c)
		}
	}
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if len(sc.Bytes()) > 4096 {
			t.Errorf("a %d-byte log line: hostile input inflates the logs: %.300s", len(sc.Bytes()), sc.Bytes())
		}
		if strings.Contains(sc.Text(), `"level":"ERROR"`) {
			t.Errorf("error logged for hostile input: %.300s", sc.Text())
		}
	}
}
