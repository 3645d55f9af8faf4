package workload

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
)

// Header names the harness sets besides the contract's.
const (
	HeaderID    = "X-Chaos-Id"
	HeaderKey   = "Idempotency-Key"
	HeaderMsgID = "Nats-Msg-Id"
)

// Payment is one valid, unique payment of the workload: it must end
// completed exactly once (charged, or declined for a declining card).
type Payment struct {
	ID         string // X-Chaos-Id of its publishes: p-<index>
	Merchant   string
	Key        string
	Amount     int64
	Currency   string
	Method     string
	Declines   bool
	HeaderOnly bool // the key travels only in the Idempotency-Key header
	// ReusedAmount is set when the workload also publishes the same key
	// with another amount (a client bug): exactly one of the two payloads
	// may complete, the other must be dead-lettered key_reused.
	ReusedAmount int64
}

// RowKey names the idempotency row of a payment.
func (p Payment) RowKey() string { return p.Merchant + ":" + p.Key }

// Malformed is one bad message: it must be dead-lettered with a bad-input
// reason and never claimed.
type Malformed struct {
	ID   string // X-Chaos-Id: bad-<index>
	Kind string // what is wrong with it, for the report
}

// Publish is one message the harness publishes.
type Publish struct {
	Subject string
	Header  map[string]string
	Body    []byte
}

// Mix is what one run publishes and what it expects.
type Mix struct {
	Payments  []Payment
	Malformed []Malformed
	Publishes []Publish
	// Duplicates counts the extra publishes of a payment (same key and
	// payload): some share the Nats-Msg-Id (the stream's duplicate window
	// drops them), the rest reach the workers (Postgres suppresses them).
	Duplicates int
	// Reuses counts the publishes that reuse a key with another payload.
	Reuses int
}

// MixConfig shapes a workload; rates are fractions of Payments.
type MixConfig struct {
	Payments      int
	Seed          uint64
	Run           string // makes keys unique to this run
	Subject       string // payments.requests
	DuplicateRate float64
	MalformedRate float64
	ReuseRate     float64
	DeclineRate   float64
	HeaderOnly    float64
}

var currencies = []string{"usd", "eur", "gbp", "jpy", "chf"}

// Wire is the wire form of a payment command, as a client sends it: unlike
// payment.Command, the idempotency key may be left out of the body (it
// then travels in the Idempotency-Key header only).
type Wire struct {
	MerchantID     string            `json:"merchant_id"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	Amount         int64             `json:"amount"`
	Currency       string            `json:"currency"`
	PaymentMethod  string            `json:"payment_method"`
	Description    string            `json:"description,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
}

// reordered encodes the same command with its fields in another order and
// other white space: a retrying client need not re-encode byte for byte.
func reordered(c Wire) []byte {
	var b strings.Builder
	b.WriteString("{\n  \"metadata\": ")
	meta, _ := json.Marshal(c.Metadata)
	b.Write(meta)
	fmt.Fprintf(&b, ",\n  \"payment_method\": %q, \"currency\": %q, \"amount\": %d", c.PaymentMethod, c.Currency, c.Amount)
	if c.IdempotencyKey != "" {
		fmt.Fprintf(&b, ", \"idempotency_key\": %q", c.IdempotencyKey)
	}
	fmt.Fprintf(&b, ", \"merchant_id\": %q", c.MerchantID)
	if c.Description != "" {
		fmt.Fprintf(&b, ", \"description\": %q", c.Description)
	}
	b.WriteString("\n}")
	return []byte(b.String())
}

// malformedKinds are the bad messages the workload sends, in turn: each
// builds a body (and may change the headers or subject) from a unique key.
var malformedKinds = []struct {
	name  string
	build func(key string, h map[string]string) (merchant string, body []byte)
}{
	{"truncated JSON", func(key string, _ map[string]string) (string, []byte) {
		return "m_bad", []byte(`{"merchant_id":"m_bad","idempotency_key":"` + key + `","amount":`)
	}},
	{"unknown field", func(key string, _ map[string]string) (string, []byte) {
		return "m_bad", []byte(`{"merchant_id":"m_bad","idempotency_key":"` + key + `","amount":100,"currency":"usd","payment_method":"pm_card_visa","coupon":"FREE"}`)
	}},
	{"zero amount", func(key string, _ map[string]string) (string, []byte) {
		return "m_bad", []byte(`{"merchant_id":"m_bad","idempotency_key":"` + key + `","amount":0,"currency":"usd","payment_method":"pm_card_visa"}`)
	}},
	{"unknown currency", func(key string, _ map[string]string) (string, []byte) {
		return "m_bad", []byte(`{"merchant_id":"m_bad","idempotency_key":"` + key + `","amount":100,"currency":"xxq","payment_method":"pm_card_visa"}`)
	}},
	{"header/body key mismatch", func(key string, h map[string]string) (string, []byte) {
		h[HeaderKey] = key + "-other"
		return "m_bad", []byte(`{"merchant_id":"m_bad","idempotency_key":"` + key + `","amount":100,"currency":"usd","payment_method":"pm_card_visa"}`)
	}},
	{"duplicate field", func(key string, _ map[string]string) (string, []byte) {
		return "m_bad", []byte(`{"merchant_id":"m_bad","idempotency_key":"` + key + `","amount":1,"amount":100000,"currency":"usd","payment_method":"pm_card_visa"}`)
	}},
	{"invalid UTF-8", func(key string, _ map[string]string) (string, []byte) {
		return "m_bad", []byte(`{"merchant_id":"m_bad","idempotency_key":"` + key + "\",\"amount\":100,\"currency\":\"usd\",\"payment_method\":\"pm_\xff\"}")
	}},
	{"subject merchant mismatch", func(key string, _ map[string]string) (string, []byte) {
		return "m_other", []byte(`{"merchant_id":"m_bad","idempotency_key":"` + key + `","amount":100,"currency":"usd","payment_method":"pm_card_visa"}`)
	}},
	{"missing key", func(_ string, h map[string]string) (string, []byte) {
		delete(h, HeaderKey)
		return "m_bad", []byte(`{"merchant_id":"m_bad","amount":100,"currency":"usd","payment_method":"pm_card_visa"}`)
	}},
	{"amount over limit", func(key string, _ map[string]string) (string, []byte) {
		return "m_bad", []byte(`{"merchant_id":"m_bad","idempotency_key":"` + key + `","amount":100000000000,"currency":"usd","payment_method":"pm_card_visa"}`)
	}},
}

// Key is payment i's idempotency key in run: the run, the index after a
// letter, a random hex tail. The letter keeps the run's digits and the
// index's from joining into one card-number-shaped stretch of digits,
// which the door would refuse (redact.PANs): no group-aligned stretch of
// digits reaches 13, whatever run is.
func Key(run string, i int, random uint32) string {
	return fmt.Sprintf("%s-p%06d-%08x", run, i, random)
}

// Generate builds a workload: every payment published once in order, its
// duplicates, key reuses and the malformed messages inserted a little later
// at random, so that they interleave with other traffic.
func Generate(cfg MixConfig) Mix {
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5eed))
	var w Mix
	type late struct {
		at int
		p  Publish
	}
	var extra []late
	later := func(i int, p Publish) { extra = append(extra, late{at: i + 1 + rng.IntN(200), p: p}) }
	for i := range cfg.Payments {
		p := Payment{
			ID:       fmt.Sprintf("p-%d", i),
			Merchant: fmt.Sprintf("m_%d", i%7),
			Key:      Key(cfg.Run, i, rng.Uint32()),
			Amount:   100 + rng.Int64N(99_900),
			Currency: currencies[rng.IntN(len(currencies))],
			Method:   "pm_card_visa",
		}
		if rng.Float64() < cfg.DeclineRate {
			p.Method, p.Declines = "pm_card_chargeDeclined", true
		}
		p.HeaderOnly = rng.Float64() < cfg.HeaderOnly
		c := Wire{MerchantID: p.Merchant, IdempotencyKey: p.Key, Amount: p.Amount, Currency: p.Currency,
			PaymentMethod: p.Method, Description: "chaos " + p.ID, Metadata: map[string]string{"order_id": p.ID}}
		if p.HeaderOnly {
			c.IdempotencyKey = ""
		}
		body, _ := json.Marshal(c)
		msgID := p.Merchant + ":" + p.Key
		hdr := func(id string) map[string]string {
			return map[string]string{HeaderID: p.ID, HeaderKey: p.Key, HeaderMsgID: id}
		}
		subject := cfg.Subject + "." + p.Merchant
		w.Publishes = append(w.Publishes, Publish{Subject: subject, Header: hdr(msgID), Body: body})
		if rng.Float64() < cfg.DuplicateRate {
			w.Duplicates++
			if rng.IntN(3) == 0 {
				// A quick retry with the same Nats-Msg-Id: the stream drops it.
				later(i, Publish{Subject: subject, Header: hdr(msgID), Body: body})
			} else {
				// A retry that escaped the duplicate window (another id),
				// encoded differently: Postgres must suppress it.
				later(i, Publish{Subject: subject, Header: hdr(fmt.Sprintf("%s:retry-%d", msgID, i)), Body: reordered(c)})
			}
		}
		if rng.Float64() < cfg.ReuseRate {
			w.Reuses++
			p.ReusedAmount = p.Amount + 1 + rng.Int64N(1000)
			c2 := c
			c2.Amount = p.ReusedAmount
			b2, _ := json.Marshal(c2)
			later(i, Publish{Subject: subject, Header: hdr(msgID + ":reuse"), Body: b2})
		}
		w.Payments = append(w.Payments, p)
		if rng.Float64() < cfg.MalformedRate {
			j := len(w.Malformed)
			kind := malformedKinds[j%len(malformedKinds)]
			m := Malformed{ID: fmt.Sprintf("bad-%d", j), Kind: kind.name}
			key := fmt.Sprintf("bad-%s-%d", cfg.Run, j)
			h := map[string]string{HeaderID: m.ID, HeaderKey: key, HeaderMsgID: "bad:" + key}
			merchant, b := kind.build(key, h)
			w.Malformed = append(w.Malformed, m)
			later(i, Publish{Subject: cfg.Subject + "." + merchant, Header: h, Body: b})
		}
	}
	// Merge the late publishes in by position (stable: ties keep order).
	out := make([]Publish, 0, len(w.Publishes)+len(extra))
	byAt := map[int][]Publish{}
	for _, e := range extra {
		byAt[min(e.at, cfg.Payments)] = append(byAt[min(e.at, cfg.Payments)], e.p)
	}
	for i, p := range w.Publishes {
		out = append(out, byAt[i]...)
		out = append(out, p)
	}
	out = append(out, byAt[cfg.Payments]...)
	w.Publishes = out
	return w
}
