package payment

import (
	"bufio"
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/internal/redact"
)

// FuzzDecodeMatchesReference holds Decode to referenceDecode, the
// implementation it replaced: for every body and envelope both accept the
// same command, or both reject it with the same reason, field and message
// (see checkMatchesReference).
//
// Seeds: testdata/fuzz/FuzzDecodeMatchesReference, FuzzDecode's corpus and
// seeds, and the edge cases below.
func FuzzDecodeMatchesReference(f *testing.F) {
	const ok = `"merchant_id":"m","idempotency_key":"k","amount":1,"currency":"usd","payment_method":"pm"`
	for _, body := range []string{
		// FuzzDecode's seeds.
		`{"merchant_id":"m_123","idempotency_key":"550e8400-e29b-41d4-a716-446655440000","amount":1999,"currency":"usd","payment_method":"pm_card_visa","description":"order 42","metadata":{"order_id":"42"}}`,
		`{"merchant_id":"m","amount":1,"currency":"usd","payment_method":"pm"}`,
		`{"merchant_id":"m","idempotency_key":"k","amount":1e2,"currency":"usd","payment_method":"pm"}`,
		`{"merchant_id":"m","idempotency_key":"k","amount":1,"amount":2}`,
		`{"metadata":{"a":{"b":[1]}}}`,
		`{"merchant_id":"m","idempotency_key":"k\u0000","amount":1,"currency":"usd","payment_method":"pm"}`,
		`{"amount":123456789012345678901234567890}`,
		"\xff\xfe",
		`[[[[[[[[[[]]]]]]]]]]`,
		`{"merchant_id":"m","idempotency_key":"k","amount":1,"AMOUNT":99999,"currency":"usd","payment_method":"pm"}`,
		`{"merchant_id":"m","idempotency_\u212aey":"k","amount":1,"currency":"usd","payment_method":"pm"}`,
		`{"merchant_id":"m","idempotency_key":"k","amount":1,"currency":"usd","payment_method":"pm","description":"\u00e9\ud83d\ude00","metadata":{"\u00e9":"\u2028"}}`,

		// Keys: escaped duplicates, escapes that spell a field, surrogates.
		`{` + ok + `,"\u0061mount":2}`,
		`{"\u006derchant_id":"m","idempotency_key":"k","amount":1,"currency":"usd","payment_method":"pm"}`,
		`{` + ok + `,"metadata":{"a":"1","\u0061":"2"}}`,
		`{` + ok + `,"metadata":{"\ud800":"1","\udc00":"2"}}`,
		`{` + ok + `,"metadata":{"\ud83d\ude00":"1","😀":"2"}}`,
		`{` + ok + `,"metadata":{"\ud83d\ude00":"\ud83d","x\/y":"\"q\"\\\b\f\n\r\t"}}`,
		`{` + ok + `,"metadata":{"k":"v\u0000"}}`,
		`{` + ok + `,"metadata":{"k":"\u00"}}`,
		`{` + ok + `,"metadata":{"k":"\x"}}`,
		`{"amount":1,"amo\u0075nt":2}`,
		`{"Amount":1}`,

		// Nesting at and beyond the limit, in objects and arrays.
		`{` + ok + `,"metadata":{"a":{"b":"c"}}}`,
		`{` + ok + `,"metadata":{"a":{"b":{"c":"d"}}}}`,
		`{` + ok + `,"metadata":{"a":[[1]]}}`,
		`{` + ok + `,"metadata":{"a":{"b":1,"b":2}}}`,
		`{` + ok + `,"metadata":[{"a":1,"a":2}]}`,
		`[{"a":1,"a":2}]`,
		`[[{"a":1}]]`,
		`[[[1]]]`,
		`[[[[1]]]]`,
		`[{"a":{"b":1,"b":1}}]`,

		// Trailing data, white space, a byte order mark.
		`{` + ok + `}{}`,
		`{` + ok + `} `,
		"{" + ok + "}\n\t\r ",
		` {` + ok + `}`,
		`{` + ok + `}x`,
		`{` + ok + `}{"x":1}`,
		`{` + ok + `}{"amount"`,
		`{` + ok + `}"abc`,
		`{` + ok + `}1.`,
		`{` + ok + `}12`,
		`{"amount":"x"}{"amount":1}`,
		`{"amount":"x"}[`,
		"\ufeff{" + ok + "}",
		"{" + ok + "}\ufeff",
		`{` + ok + `,`,
		`{` + ok,
		`{"amount":`,
		`{"amount"`,
		`{"amo`,

		// Numbers.
		`{"merchant_id":"m","idempotency_key":"k","amount":-0,"currency":"usd","payment_method":"pm"}`,
		`{"merchant_id":"m","idempotency_key":"k","amount":1.0,"currency":"usd","payment_method":"pm"}`,
		`{"merchant_id":"m","idempotency_key":"k","amount":1E2,"currency":"usd","payment_method":"pm"}`,
		`{"merchant_id":"m","idempotency_key":"k","amount":9223372036854775807,"currency":"usd","payment_method":"pm"}`,
		`{"merchant_id":"m","idempotency_key":"k","amount":-9223372036854775809,"currency":"usd","payment_method":"pm"}`,
		`{"merchant_id":"m","idempotency_key":"k","amount":01,"currency":"usd","payment_method":"pm"}`,
		`{"merchant_id":"m","idempotency_key":"k","amount":-,"currency":"usd","payment_method":"pm"}`,
		`{"merchant_id":"m","idempotency_key":"k","amount":1e,"currency":"usd","payment_method":"pm"}`,
		`{"merchant_id":"m","idempotency_key":"k","amount":1.e5,"currency":"usd","payment_method":"pm"}`,
		`{"merchant_id":"m","idempotency_key":"k","amount":+1,"currency":"usd","payment_method":"pm"}`,
		`01`, `1 2`, `-0.5e-7`, `1-2`,

		// Top-level values that are not objects, and the empty object.
		``, ` `, `{}`, `[]`, `[1,2]`, `"s"`, `1`, `true`, `false`, `null`, `null null`, `nul`, `truefalse`, `{}}`, `]`,

		// null for fields, wrong types.
		`{"merchant_id":"m","idempotency_key":"k","amount":null,"currency":"usd","payment_method":"pm"}`,
		`{` + ok + `,"metadata":null}`,
		`{` + ok + `,"metadata":{}}`,
		`{` + ok + `,"metadata":{"a":null}}`,
		`{` + ok + `,"description":null}`,
		`{"merchant_id":null,"idempotency_key":"k","amount":1,"currency":"usd","payment_method":"pm"}`,
		`{"merchant_id":{"x":[1]},"idempotency_key":"k","amount":1,"currency":"usd","payment_method":"pm"}`,
		`{"metadata":{"a":1},"amount":"x"}`,
		`{"amount":"x","metadata":{"a":1}}`,
		`{"amount":true}`, `{"amount":[]}`, `{"amount":{}}`,
		`{"metadata":"x"}`, `{"metadata":[]}`, `{"metadata":true}`, `{"metadata":1}`,
		`{"currency":1}`, `{"payment_method":false}`, `{"description":[]}`, `{"idempotency_key":{}}`,

		// Syntax errors in every position.
		`{"amount" 1}`, `{"amount":1 "currency":2}`, `{,}`, `[,]`, `[1,]`, `{"amount":1,}`, `[1}`, `{"a":1]`,
		`{"amount":1}}`, `{1:1}`, `{"amount"::1}`, `{"currency":"us` + "\x01" + `d"}`, `{"currency":'usd'}`,
	} {
		f.Add([]byte(body), "", false, "")
	}
	f.Add([]byte(`{"merchant_id":"m_123","idempotency_key":"550e8400-e29b-41d4-a716-446655440000","amount":1999,"currency":"usd","payment_method":"pm_card_visa"}`), "550e8400-e29b-41d4-a716-446655440000", true, "")
	f.Add([]byte(`{"merchant_id":"m","amount":1,"currency":"usd","payment_method":"pm"}`), "hdr", true, "m")
	f.Add([]byte("{\"merchant_id\":\"m\",\"idempotency_key\":\"k\\u0000\",\"amount\":1,\"currency\":\"usd\",\"payment_method\":\"pm\"}"), "k\x00", true, "m")
	f.Add([]byte(`{`+ok+`}`), "k", true, "m")
	f.Add([]byte(`{`+ok+`}`), "other", true, "m")
	f.Add([]byte(`{`+ok+`}`), "", true, "n")
	f.Add([]byte(`null`), "k", true, "")
	f.Add([]byte(`{"merchant_id":"`+strings.Repeat("m", 65)+`","idempotency_key":"k","amount":1,"currency":"usd","payment_method":"pm"}`), "", false, "")
	f.Add([]byte(`{`+strings.Repeat(`"metadata":{},`, 3)+ok+`}`), "", false, "")
	var many strings.Builder
	for i := range 40 {
		many.WriteString(`,"k` + strconv.Itoa(i) + `":"v"`)
	}
	f.Add([]byte(`{`+ok+`,"metadata":{"a":"v"`+many.String()+`,"k39":"w"}}`), "", false, "")
	f.Add([]byte(`{`+ok+`,"metadata":{"a":"v"`+many.String()+`,"k3\u0039":"w"}}`), "", false, "")
	f.Add([]byte(strings.Repeat("[", 100)+strings.Repeat("]", 100)), "", false, "")
	for _, seed := range readCorpus(f, filepath.Join("testdata", "fuzz", "FuzzDecode")) {
		f.Add(seed.body, seed.headerKey, seed.headerSet, seed.subject)
	}
	f.Fuzz(func(t *testing.T, body []byte, headerKey string, headerSet bool, subject string) {
		env := Envelope{SubjectMerchant: subject, HeaderKey: headerKey, HeaderKeySet: headerSet}
		checkMatchesReference(t, body, env)
	})
}

// checkMatchesReference fails t unless Decode and referenceDecode give the
// same command, or errors with the same reason, field and message. The one
// exception is which bad metadata entry an invalid_metadata message names:
// Validate ranges over the map, so that is random in either.
func checkMatchesReference(t *testing.T, body []byte, env Envelope) {
	t.Helper()
	want, wantErr := referenceDecode(body, env, Limits{})
	got, gotErr := Decode(body, env, Limits{})
	var cardVE *ValidationError
	if errors.As(gotErr, &cardVE) && cardVE.Reason == ReasonCardData {
		// The card-data door stands in front of the decoding the reference
		// holds: it must have seen card data where the door looks.
		partial, _ := decode(body, env, Limits{}) // the command, valid or not, when the body decodes
		seen := env.HeaderKeySet && redact.ContainsPAN(env.HeaderKey) || redact.ContainsPAN(env.SubjectMerchant) ||
			wantErr != nil && bodyStringsHoldPAN(body) || partial != nil && partial.cardData() != nil
		if !seen {
			t.Fatalf("Decode(%q, %+v) = %v, but nothing there looks like a card number; reference: %+v, %v", body, env, gotErr, want, wantErr)
		}
		return
	}
	if wantErr == nil && want.cardData() != nil {
		t.Fatalf("Decode(%q, %+v) = %+v, %v: the card-data door let a card number in", body, env, got, gotErr)
	}
	if (wantErr == nil) != (gotErr == nil) {
		t.Fatalf("Decode(%q, %+v) = %+v, %v; reference: %+v, %v", body, env, got, gotErr, want, wantErr)
	}
	if wantErr != nil {
		var wantVE, gotVE *ValidationError
		if !errors.As(wantErr, &wantVE) || !errors.As(gotErr, &gotVE) {
			t.Fatalf("Decode(%q, %+v): error %v, reference %v: not both *ValidationError", body, env, gotErr, wantErr)
		}
		if gotVE.Reason != wantVE.Reason || gotVE.Field != wantVE.Field ||
			gotVE.Msg != wantVE.Msg && gotVE.Reason != ReasonInvalidMetadata {
			t.Fatalf("Decode(%q, %+v):\n got error %#v\nreference %#v", body, env, *gotVE, *wantVE)
		}
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Decode(%q, %+v):\n got %#v\nreference %#v", body, env, got, want)
	}
}

// corpusEntry is one FuzzDecode corpus file.
type corpusEntry struct {
	body      []byte
	headerKey string
	headerSet bool
	subject   string
}

// readCorpus reads the corpus files in dir written by go test for a target
// with FuzzDecode's arguments, so that other targets can start from them.
func readCorpus(tb testing.TB, dir string) []corpusEntry {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		tb.Fatal(err)
	}
	var entries []corpusEntry
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			tb.Fatal(err)
		}
		var values []string
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(nil, len(data)+1)
		for sc.Scan() {
			line := sc.Text()
			if line == "go test fuzz v1" || line == "" {
				continue
			}
			typ, arg, found := strings.Cut(line, "(")
			if !found || !strings.HasSuffix(arg, ")") {
				tb.Fatalf("%s: cannot read %.40q", file, line)
			}
			arg = strings.TrimSuffix(arg, ")")
			if typ == "bool" {
				values = append(values, arg)
				continue
			}
			v, err := strconv.Unquote(arg)
			if err != nil {
				tb.Fatalf("%s: %v in %.40q", file, err, line)
			}
			values = append(values, v)
		}
		if err := sc.Err(); err != nil || len(values) != 4 {
			tb.Fatalf("%s: %d values, %v", file, len(values), err)
		}
		entries = append(entries, corpusEntry{
			body: []byte(values[0]), headerKey: values[1], headerSet: values[2] == "true", subject: values[3],
		})
	}
	return entries
}

// TestDecodeMatchesReferenceOnGeneratedBodies complements the fuzz target,
// whose byte mutations seldom build new JSON structure: it generates
// commands from JSON's grammar (fields, escaped and folded names, nesting on
// both sides of the limit, every value type), breaks some of them (cut
// short, trailing data, a stray byte), and compares Decode with the
// reference on each.
func TestDecodeMatchesReferenceOnGeneratedBodies(t *testing.T) {
	t.Parallel()
	n := 20000
	if testing.Short() {
		n = 2000
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range n {
		body := []byte(generateBody(r))
		env := Envelope{}
		switch r.IntN(4) {
		case 0:
			env = Envelope{SubjectMerchant: "m", HeaderKey: "k", HeaderKeySet: true}
		case 1:
			env = Envelope{HeaderKey: "", HeaderKeySet: true}
		}
		checkMatchesReference(t, body, env)
	}
}

// generateBody writes a command-like body, sometimes broken.
func generateBody(r *rand.Rand) string {
	var b strings.Builder
	if r.IntN(50) == 0 {
		b.WriteString("\ufeff")
	}
	if r.IntN(10) == 0 {
		generateValue(r, &b, 0)
	} else {
		generateCommand(r, &b)
	}
	s := b.String()
	switch r.IntN(16) {
	case 0:
		s = s[:r.IntN(len(s)+1)]
	case 1:
		s += pick(r, " ", "\n\t", "{}", "[]", "x", "1", "1.", `"`, `{"amount":1}`, `{"x":1}`, `{"amount"`, "null", " {")
	case 2:
		i := r.IntN(len(s) + 1)
		s = s[:i] + pick(r, ",", ":", "{", "}", "[", "]", `"`, `\`, " ", "\x01", "0", "-", "n") + s[i:]
	case 3:
		if len(s) > 0 {
			i := r.IntN(len(s))
			s = s[:i] + s[i+1:]
		}
	}
	return s
}

// generateCommand writes an object whose members are mostly the command's
// fields with plausible values, in any order, sometimes repeated.
func generateCommand(r *rand.Rand, b *strings.Builder) {
	members := []string{
		`"merchant_id":` + mostly(r, `"m"`, `"m_1"`, `"m.1"`, `""`, `null`, `1`, `{"x":1}`),
		`"idempotency_key":` + mostly(r, `"k"`, `"k-1"`, `"k\u0000"`, `""`, `null`, `12`, `["k"]`),
		`"amount":` + mostly(r, `1999`, `1`, `-0`, `0`, `-5`, `1.0`, `1e2`, `99999999`, `100000000`,
			`9223372036854775807`, `9223372036854775808`, `"1"`, `null`, `true`, `[]`, `{}`),
		`"currency":` + mostly(r, `"usd"`, `"USD"`, `"xts"`, `null`, `1`),
		`"payment_method":` + mostly(r, `"pm_card_visa"`, `"pm"`, `""`, `"p\u00e9"`, `null`, `false`),
		`"description":` + mostly(r, `"d"`, `"caf\u00e9 \ud83d\ude00"`, `"\u0007"`, `"\ud800"`, `null`, `[]`),
	}
	if r.IntN(2) == 0 {
		var m strings.Builder
		generateObject(r, &m, 1)
		members = append(members, `"metadata":`+m.String())
	}
	for range r.IntN(3) * r.IntN(2) {
		members = append(members, pick(r,
			`"amount":2`, `"\u0061mount":3`, `"AMOUNT":4`, `"idempotency_\u212aey":"k2"`, `"x":1`, `"":1`,
			`"metadata":{}`, `"metadata":null`, `"metadata":{"a":"1"}`, `"amo\u0075nt":5`))
	}
	r.Shuffle(len(members), func(i, j int) { members[i], members[j] = members[j], members[i] })
	members = members[:len(members)-r.IntN(3)*r.IntN(2)]
	b.WriteString("{" + strings.Join(members, pick(r, ",", ", ", ",\n")) + "}")
}

// generateObject writes an object at depth, its keys often alike.
func generateObject(r *rand.Rand, b *strings.Builder, depth int) {
	b.WriteByte('{')
	for i := range r.IntN(6) {
		if i > 0 {
			b.WriteByte(',')
		}
		if r.IntN(2) == 0 {
			b.WriteString(`"k` + strconv.Itoa(i) + `":`)
		} else {
			b.WriteString(pick(r, `"a"`, `"\u0061"`, `"b"`, `"order_id"`, `"\ud800"`, `"\udc00"`, `"\ufffd"`,
				`"a[b]"`, `"merchant_id"`, `""`, `"k\u0000"`, `"\ud83d\ude00"`, `"😀"`) + ":")
		}
		if r.IntN(8) == 0 {
			generateValue(r, b, depth+1)
		} else {
			b.WriteString(pick(r, `"v"`, `"1"`, `null`, `"\u2028"`, `"\u0085"`, `""`))
		}
	}
	b.WriteByte('}')
}

// generateArray writes an array at depth.
func generateArray(r *rand.Rand, b *strings.Builder, depth int) {
	b.WriteByte('[')
	for i := range r.IntN(4) {
		if i > 0 {
			b.WriteByte(',')
		}
		generateValue(r, b, depth+1)
	}
	b.WriteByte(']')
}

// generateValue writes any value at depth, containers up to a little past
// the nesting limit.
func generateValue(r *rand.Rand, b *strings.Builder, depth int) {
	switch k := r.IntN(8); {
	case k == 0 && depth < maxJSONNestingAllowed+2:
		generateObject(r, b, depth)
	case k == 1 && depth < maxJSONNestingAllowed+2:
		generateArray(r, b, depth)
	default:
		b.WriteString(pick(r, `"s"`, `"\n"`, `1`, `-0`, `1.5e3`, `true`, `false`, `null`, `0`, `"\ud800"`))
	}
}

func pick(r *rand.Rand, options ...string) string { return options[r.IntN(len(options))] }

// mostly picks the first option, a valid value, most of the time.
func mostly(r *rand.Rand, options ...string) string {
	if r.IntN(8) != 0 {
		return options[0]
	}
	return pick(r, options...)
}
