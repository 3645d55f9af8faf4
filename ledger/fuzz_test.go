package ledger_test

import (
	"bytes"
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

// commandFrom carves a command out of s: fields separated by NUL, in the
// order merchant, key, currency, method, description, then metadata
// key/value pairs. Two inputs that hold the same bytes split differently
// are the classic attack on a naive concatenating fingerprint.
func commandFrom(s string, amount int64) *payment.Command {
	f := strings.Split(s, "\x00")
	at := func(i int) string {
		if i < len(f) {
			return f[i]
		}
		return ""
	}
	c := &payment.Command{MerchantID: at(0), IdempotencyKey: at(1), Amount: amount, Currency: at(2),
		PaymentMethod: at(3), Description: at(4)}
	for i := 5; i+1 < len(f); i += 2 {
		if c.Metadata == nil {
			c.Metadata = map[string]string{}
		}
		c.Metadata[f[i]] = f[i+1]
	}
	return c
}

func sameCommand(a, b *payment.Command) bool {
	return a.MerchantID == b.MerchantID && a.IdempotencyKey == b.IdempotencyKey && a.Amount == b.Amount &&
		a.Currency == b.Currency && a.PaymentMethod == b.PaymentMethod && a.Description == b.Description &&
		maps.Equal(a.Metadata, b.Metadata) // nil and empty metadata are the same request
}

// FuzzFingerprint checks that the fingerprint is exactly "the same request":
// two commands have the same canonical bytes, and so the same fingerprint,
// if and only if every field is equal (metadata as a set of pairs).
func FuzzFingerprint(f *testing.F) {
	f.Add("m\x00k\x00usd\x00pm\x00d", "m\x00k\x00usd\x00pm\x00d", int64(100), int64(100))
	f.Add("m\x00k\x00usd\x00pm\x00d", "m\x00k\x00usd\x00pm\x00d", int64(100), int64(101))
	f.Add("ab\x00c\x00usd\x00pm", "a\x00bc\x00usd\x00pm", int64(1), int64(1))
	f.Add("m\x00k\x00usd\x00pm\x00\x00a\x00b", "m\x00k\x00usd\x00pm\x00\x00a\x00b\x00c", int64(1), int64(1))
	f.Add("m\x00k\x00usd\x00pm\x00\x00a\x00b\x00c\x00d", "m\x00k\x00usd\x00pm\x00\x00c\x00d\x00a\x00b", int64(1), int64(1))
	f.Add("m\x00k\x00usd\x00pm\x00\x00a\x00\x00", "m\x00k\x00usd\x00pm\x00\x00", int64(1), int64(1))
	f.Add("m\x00k", "m\x00k", int64(-1), int64(1<<63-1))
	f.Fuzz(func(t *testing.T, a, b string, amountA, amountB int64) {
		ca, cb := commandFrom(a, amountA), commandFrom(b, amountB)
		same := sameCommand(ca, cb)
		if eq := bytes.Equal(ca.AppendCanonical(nil), cb.AppendCanonical(nil)); eq != same {
			t.Fatalf("canonical bytes equal=%v but commands equal=%v:\n%+v\n%+v", eq, same, ca, cb)
		}
		if eq := bytes.Equal(ledger.Fingerprint(ca), ledger.Fingerprint(cb)); eq != same {
			t.Fatalf("fingerprints equal=%v but commands equal=%v:\n%+v\n%+v", eq, same, ca, cb)
		}
		// The provider key depends on the key's identity only, and never
		// equals our key.
		if pk := ledger.ProviderKey(ca.MerchantID, ca.IdempotencyKey); pk == ca.IdempotencyKey || len(pk) != 68 {
			t.Fatalf("provider key %q for key %q", pk, ca.IdempotencyKey)
		}
		if (ca.MerchantID == cb.MerchantID && ca.IdempotencyKey == cb.IdempotencyKey) !=
			(ledger.ProviderKey(ca.MerchantID, ca.IdempotencyKey) == ledger.ProviderKey(cb.MerchantID, cb.IdempotencyKey)) {
			t.Fatalf("provider keys collide or differ wrongly for (%q,%q) and (%q,%q)",
				ca.MerchantID, ca.IdempotencyKey, cb.MerchantID, cb.IdempotencyKey)
		}
	})
}

// FuzzFingerprintReencode checks, on valid commands, that the fingerprint
// of a decoded command survives any re-encoding the publisher might do:
// another field order, indentation, escaped characters.
func FuzzFingerprintReencode(f *testing.F) {
	f.Add("m_1", "k-1", int64(1999), "usd", "pm_card_visa", "order 42", "order_id", "42")
	f.Add("M-x", "key with spaces", int64(1), "eur", "pm", "é ü 😀", "a", "<&>")
	f.Add("m", "k\"\\/", int64(99_999_999), "jpy", "pm", "", "", "")
	f.Fuzz(func(t *testing.T, merchant, key string, amount int64, currency, method, desc, mk, mv string) {
		c := &payment.Command{MerchantID: merchant, IdempotencyKey: key, Amount: amount, Currency: currency,
			PaymentMethod: method, Description: desc}
		if mk != "" {
			c.Metadata = map[string]string{mk: mv}
		}
		for _, s := range []string{merchant, key, currency, method, desc, mk, mv} {
			if !utf8.ValidString(s) {
				return // a body with invalid UTF-8 never decodes
			}
		}
		if c.Validate(payment.Limits{}) != nil {
			return
		}
		want := ledger.Fingerprint(c)
		compact, _ := json.Marshal(c)
		indented, _ := json.MarshalIndent(c, "", "\t")
		// Reversed field order, every string escaped as \uXXXX.
		var rev bytes.Buffer
		rev.WriteString("{")
		if len(c.Metadata) > 0 {
			rev.WriteString(`"metadata":{` + escapeAll(mk) + `:` + escapeAll(mv) + `},`)
		}
		if desc != "" {
			rev.WriteString(`"description":` + escapeAll(desc) + `,`)
		}
		rev.WriteString(`"payment_method":` + escapeAll(method) + `,"currency":` + escapeAll(currency) + `,`)
		rev.WriteString(`"amount":` + strings.TrimSpace(string(must1(json.Marshal(amount)))) + `,`)
		rev.WriteString(`"idempotency_key":` + escapeAll(key) + `,"merchant_id":` + escapeAll(merchant) + `}`)
		for _, body := range [][]byte{compact, indented, rev.Bytes()} {
			got, err := payment.Decode(body, payment.Envelope{SubjectMerchant: merchant}, payment.Limits{MaxBodyBytes: 1 << 20})
			if err != nil {
				t.Fatalf("valid command re-encoded as %s rejected: %v", body, err)
			}
			if !bytes.Equal(ledger.Fingerprint(got), want) {
				t.Fatalf("fingerprint changed for encoding %s", body)
			}
		}
	})
}

// escapeAll writes s as a JSON string with every rune escaped.
func escapeAll(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		if r > 0xffff {
			r1, r2 := surrogates(r)
			b.WriteString(hex4(r1) + hex4(r2))
			continue
		}
		b.WriteString(hex4(r))
	}
	b.WriteByte('"')
	return b.String()
}

func surrogates(r rune) (rune, rune) {
	r -= 0x10000
	return 0xd800 + (r>>10)&0x3ff, 0xdc00 + r&0x3ff
}

func hex4(r rune) string {
	const digits = "0123456789abcdef"
	return `\u` + string([]byte{digits[r>>12&0xf], digits[r>>8&0xf], digits[r>>4&0xf], digits[r&0xf]})
}

func must1[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
