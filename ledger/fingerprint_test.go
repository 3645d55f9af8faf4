package ledger_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

const baseJSON = `{"merchant_id":"m_1","idempotency_key":"k-1","amount":1999,"currency":"usd",` +
	`"payment_method":"pm_card_visa","description":"order 42","metadata":{"a":"1","b":"2"}}`

func fingerprintOf(t *testing.T, body string) []byte {
	t.Helper()
	c, err := payment.Decode([]byte(body), payment.Envelope{}, payment.Limits{})
	if err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	return ledger.Fingerprint(c)
}

func TestFingerprintIgnoresEncoding(t *testing.T) {
	t.Parallel()
	want := fingerprintOf(t, baseJSON)
	if len(want) != 32 {
		t.Fatalf("fingerprint is %d bytes, want 32", len(want))
	}
	same := map[string]string{
		"field order": `{"metadata":{"b":"2","a":"1"},"currency":"usd","amount":1999,"idempotency_key":"k-1",` +
			`"merchant_id":"m_1","description":"order 42","payment_method":"pm_card_visa"}`,
		"whitespace": "{\n  \"merchant_id\" : \"m_1\",\t\"idempotency_key\":\"k-1\", \"amount\": 1999,\n" +
			"\"currency\":\"usd\",\"payment_method\":\"pm_card_visa\",\"description\":\"order 42\",\n\"metadata\":{ \"a\":\"1\" , \"b\":\"2\" }}\n",
		"escaped characters": `{"merchant_id":"m_1","idempotency_key":"k-1","amount":1999,"currency":"usd",` +
			`"payment_method":"pm_card_visa","description":"order \u0034\u0032","metadata":{"a":"1","b":"2"}}`,
	}
	for name, body := range same {
		if got := fingerprintOf(t, body); !bytes.Equal(got, want) {
			t.Errorf("%s changed the fingerprint", name)
		}
	}
}

func TestFingerprintChangesWithAnyValue(t *testing.T) {
	t.Parallel()
	base := fingerprintOf(t, baseJSON)
	changes := map[string][2]string{
		"merchant":        {`"merchant_id":"m_1"`, `"merchant_id":"m_2"`},
		"key":             {`"idempotency_key":"k-1"`, `"idempotency_key":"k-2"`},
		"amount":          {`"amount":1999`, `"amount":1998`},
		"currency":        {`"currency":"usd"`, `"currency":"eur"`},
		"payment method":  {`"pm_card_visa"`, `"pm_card_mastercard"`},
		"description":     {`"order 42"`, `"order 43"`},
		"metadata value":  {`"b":"2"`, `"b":"3"`},
		"metadata key":    {`"b":"2"`, `"c":"2"`},
		"metadata extra":  {`"b":"2"`, `"b":"2","c":""`},
		"metadata moved":  {`"a":"1","b":"2"`, `"a":"1b","":"2"`},
		"no metadata":     {`,"metadata":{"a":"1","b":"2"}`, ``},
		"key/value shift": {`"a":"1","b":"2"`, `"a":"","1b":"2"`},
	}
	seen := map[string]string{string(base): "base"}
	for name, ch := range changes {
		body := strings.Replace(baseJSON, ch[0], ch[1], 1)
		if body == baseJSON {
			t.Fatalf("%s: replacement did not apply", name)
		}
		c, err := payment.Decode([]byte(body), payment.Envelope{}, payment.Limits{})
		if err != nil {
			// Some changes are invalid commands (an empty metadata key); the
			// canonical encoding must still tell them apart.
			c = mustLoose(t, body)
		}
		got := string(ledger.Fingerprint(c))
		if prev, dup := seen[got]; dup {
			t.Errorf("%s has the same fingerprint as %s", name, prev)
		}
		seen[got] = name
	}
}

func TestProviderKey(t *testing.T) {
	t.Parallel()
	a := ledger.ProviderKey("m_1", "k")
	if a != ledger.ProviderKey("m_1", "k") {
		t.Fatal("provider key is not deterministic")
	}
	if a == "k" || a == ledger.ProviderKey("m_2", "k") || a == ledger.ProviderKey("m_1", "k2") {
		t.Fatal("provider key is not specific to (merchant, key)")
	}
	// The separator keeps ("m_1", "2k") and ("m_12", "k") apart.
	if ledger.ProviderKey("m_1", "2k") == ledger.ProviderKey("m_12", "k") {
		t.Fatal("provider key is ambiguous across the merchant/key boundary")
	}
	if len(a) > 255 || !strings.HasPrefix(a, "pdk_") {
		t.Fatalf("provider key %q is not a valid provider key", a)
	}
}

// TestProviderKeyIsStable: the provider key of a key claimed before is
// stored with its row and was sent to the provider; a build that derived
// another would call the provider under a new key for a redelivery of an
// old claim's message and charge it again. So the derivation never changes:
// it is the original one, SHA-256 of a fixed prefix, the merchant id, a zero
// byte and the key, hex, after "pdk_", for every length of key (past the
// stack buffer too).
func TestProviderKeyIsStable(t *testing.T) {
	t.Parallel()
	reference := func(m, k string) string {
		h := sha256.New()
		h.Write([]byte("paydedup/provider-key/v1\x00"))
		h.Write([]byte(m))
		h.Write([]byte{0})
		h.Write([]byte(k))
		return "pdk_" + hex.EncodeToString(h.Sum(nil))
	}
	// The key main has always derived for ("m_1", "k").
	if got, want := ledger.ProviderKey("m_1", "k"), "pdk_12a235d458c84fb69d2a3113673c71433177dcda0cf3f622a9c30be95c37508f"; got != want {
		t.Fatalf("ProviderKey(m_1, k) = %q, want %q", got, want)
	}
	for _, c := range [][2]string{{"m_1", "k"}, {"", ""}, {"m_1", "550e8400-e29b-41d4-a716-446655440000"},
		{strings.Repeat("m", 64), strings.Repeat("~", 255)}, {"m", strings.Repeat("k", 2000)}} {
		if got, want := ledger.ProviderKey(c[0], c[1]), reference(c[0], c[1]); got != want {
			t.Errorf("ProviderKey(%q, %q) = %q, want %q", c[0], c[1], got, want)
		}
	}
}

// TestFingerprintIsStable: a key's fingerprint is stored with its row (and
// with its gateway intake); a build that computed another for the same
// command would take a redelivery or a retry of a payment claimed before
// it for another payment (a mismatch, 422, the claim never resumed by its
// own message). So the encoding never changes: SHA-256 of
// "paydedup.command.v1", then each of merchant id, key, currency, payment
// method and description as a big-endian uint32 length and the bytes (the
// amount as a big-endian uint64 after the key), then the metadata's count
// and its pairs in key order, each string length-prefixed, for every size
// of command (past any buffer kept on the stack too).
func TestFingerprintIsStable(t *testing.T) {
	t.Parallel()
	reference := func(c *payment.Command) []byte {
		h := sha256.New()
		h.Write([]byte("paydedup.command.v1"))
		put := func(s string) {
			h.Write(binary.BigEndian.AppendUint32(nil, uint32(len(s))))
			h.Write([]byte(s))
		}
		put(c.MerchantID)
		put(c.IdempotencyKey)
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(c.Amount)))
		put(c.Currency)
		put(c.PaymentMethod)
		put(c.Description)
		keys := slices.Sorted(maps.Keys(c.Metadata))
		h.Write(binary.BigEndian.AppendUint32(nil, uint32(len(keys))))
		for _, k := range keys {
			put(k)
			put(c.Metadata[k])
		}
		return h.Sum(nil)
	}
	// The fingerprint main has always computed for baseJSON's command.
	if got, want := hex.EncodeToString(fingerprintOf(t, baseJSON)), "d3616f185a8babad41bace1ef7f62ef549e7805d52a03f0dc5ffb3e89dfa0229"; got != want {
		t.Fatalf("Fingerprint(baseJSON) = %s, want %s", got, want)
	}
	big := map[string]string{}
	for i := range 50 {
		big[strings.Repeat(string(rune('a'+i%26)), i+1)] = strings.Repeat("é", 100)
	}
	cmds := []*payment.Command{
		{},
		{MerchantID: "m_1", IdempotencyKey: "k", Amount: 1, Currency: "usd"},
		{MerchantID: "m_1", IdempotencyKey: "k", Amount: -1, Currency: "usd", PaymentMethod: "pm_card_visa",
			Description: "naïve ☃", Metadata: map[string]string{"b": "2", "a": "1", "": ""}},
		{MerchantID: strings.Repeat("m", 64), IdempotencyKey: strings.Repeat("~", 255), Amount: 1 << 62,
			Currency: "eur", Description: strings.Repeat("d", 5000), Metadata: big},
	}
	for i, c := range cmds {
		if got, want := ledger.Fingerprint(c), reference(c); !bytes.Equal(got, want) {
			t.Errorf("command %d: Fingerprint = %x, want %x", i, got, want)
		}
	}
}

// mustLoose decodes without validation, for commands the canonical encoding
// must still distinguish.
func mustLoose(t *testing.T, body string) *payment.Command {
	t.Helper()
	var c payment.Command
	if err := jsonUnmarshal([]byte(body), &c); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	return &c
}

var jsonUnmarshal = json.Unmarshal

// BenchmarkFingerprint is the fingerprint of a typical command (two
// metadata pairs), computed once per claim by the worker and per POST by
// the gateway: ns and allocations per command (-benchmem).
func BenchmarkFingerprint(b *testing.B) {
	c, err := payment.Decode([]byte(baseJSON), payment.Envelope{}, payment.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if len(ledger.Fingerprint(c)) != sha256.Size {
			b.Fatal("short fingerprint")
		}
	}
}
