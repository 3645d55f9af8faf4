package workload

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/paydedup/paydedup/stream"
)

// Kind is what a planned message is, in a phased workload.
type Kind int

// The kinds of planned message.
const (
	KindOriginal  Kind = iota // a payment's first publish
	KindSameID                // a quick double publish: same Nats-Msg-Id, dropped by the window
	KindNoID                  // a retry through a path that sets no Nats-Msg-Id
	KindNewID                 // a retry with a new Nats-Msg-Id (another SDK attempt)
	KindLate                  // a late retry, after the payment completed
	KindReuse                 // the same key with another amount
	KindMalformed             // a bad message, dead-lettered
)

// Planned is one message of a phased workload.
type Planned struct {
	Kind Kind
	I    int // payment index, or malformed variant
}

// phasedMerchants are the merchants of a phased workload's payments.
var phasedMerchants = []string{"m_acme", "m_globex", "m_initech", "m_umbrella"}

// PhasedConfig shapes a phased workload, the demo's.
type PhasedConfig struct {
	Payments   int     // distinct valid payments
	Duplicates float64 // duplicate messages per payment, as a fraction
	Declines   float64 // fraction of payments with a card that is declined
	Prefix     string  // of every key: <Prefix>-000042, <Prefix>-bad-3
}

// Phased is a workload published in two phases: the first with originals,
// early duplicates and malformed messages interleaved, the second (late
// duplicates and key reuses) for payments once they completed.
type Phased struct {
	Payments    []Command // the valid payments, by index
	Early, Late []Planned
	prefix      string
}

// PlanPhased makes the payments and the two publishing phases, all drawn
// from rng.
func PlanPhased(rng *rand.Rand, cfg PhasedConfig) Phased {
	n := cfg.Payments
	ph := Phased{Payments: make([]Command, n), prefix: cfg.Prefix}
	var early, late []Planned
	declined := map[int]bool{}
	for _, i := range rng.Perm(n)[:int(math.Round(cfg.Declines*float64(n)))] {
		declined[i] = true
	}
	for i := range n {
		ph.Payments[i] = NewCommand(rng, fmt.Sprintf("%s-%06d", cfg.Prefix, i), phasedMerchants[rng.IntN(len(phasedMerchants))], declined[i])
	}
	dups := int(math.Round(cfg.Duplicates * float64(n)))
	after := make(map[int][]Planned, dups)
	for j, i := range rng.Perm(n)[:min(dups, n)] {
		var k Kind
		switch f := float64(j) / float64(max(dups, 1)); {
		case f < 0.15:
			k = KindSameID
		case f < 0.50:
			k = KindNoID
		case f < 0.70:
			k = KindNewID
		default:
			k = KindLate
		}
		if k == KindLate {
			late = append(late, Planned{Kind: k, I: i})
			continue
		}
		at := min(i+1+rng.IntN(64), n-1)
		after[at] = append(after[at], Planned{Kind: k, I: i})
	}
	for j := n; j < dups; j++ { // more duplicates than payments: extra late ones
		late = append(late, Planned{Kind: KindLate, I: rng.IntN(n)})
	}
	bad := max(1, n/300)
	badAt := map[int]int{}
	for range bad {
		badAt[rng.IntN(n)]++
	}
	v := 0
	for i := range n {
		early = append(early, Planned{Kind: KindOriginal, I: i})
		early = append(early, after[i]...)
		for range badAt[i] {
			early = append(early, Planned{Kind: KindMalformed, I: v})
			v++
		}
	}
	for _, i := range rng.Perm(n)[:min(n, max(1, n/300))] {
		late = append(late, Planned{Kind: KindReuse, I: i})
	}
	rng.Shuffle(len(late), func(a, b int) { late[a], late[b] = late[b], late[a] })
	ph.Early, ph.Late = early, late
	return ph
}

// Message builds the NATS message of one planned message, on cfg's
// subjects.
func (ph Phased) Message(cfg stream.Config, m Planned) *nats.Msg {
	if m.Kind == KindMalformed {
		return ph.malformed(cfg, m.I)
	}
	p := ph.Payments[m.I]
	msg := stream.CommandMsg(cfg, p.Cmd.MerchantID, p.Cmd.IdempotencyKey, p.Body)
	id := stream.MsgID(p.Cmd.MerchantID, p.Cmd.IdempotencyKey)
	switch m.Kind {
	case KindNoID:
		msg.Header.Del(nats.MsgIdHdr)
	case KindNewID:
		msg.Header.Set(nats.MsgIdHdr, id+":retry")
	case KindLate:
		msg.Header.Set(nats.MsgIdHdr, id+":late")
	case KindReuse:
		c := p.Cmd
		c.Amount++
		msg.Data, _ = json.Marshal(c)
		msg.Header.Set(nats.MsgIdHdr, id+":reuse")
	}
	return msg
}

// malformed builds the v-th malformed message: each is dead-lettered.
func (ph Phased) malformed(cfg stream.Config, v int) *nats.Msg {
	merchant := phasedMerchants[v%len(phasedMerchants)]
	key := fmt.Sprintf("%s-bad-%d", ph.prefix, v)
	valid := fmt.Sprintf(`{"merchant_id":%q,"idempotency_key":%q,"amount":1500,"currency":"usd","payment_method":"pm_card_visa"}`, merchant, key)
	bodies := []string{
		`{"merchant_id":"` + merchant + `","idempotency_key":`, // truncated JSON
		strings.Replace(valid, `"idempotency_key":"`+key+`",`, "", 1),
		strings.Replace(valid, `"amount":1500`, `"amount":-5`, 1),
		strings.Replace(valid, `"usd"`, `"USD"`, 1),
		strings.Replace(valid, `"amount"`, `"coupon":"FREE","amount"`, 1),
		strings.Replace(valid, `"merchant_id":"`+merchant+`"`, `"merchant_id":"m_other"`, 1), // subject says otherwise
	}
	m := nats.NewMsg(cfg.SubjectPrefix + "." + merchant)
	m.Data = []byte(bodies[v%len(bodies)])
	m.Header.Set(nats.MsgIdHdr, key)
	return m
}
