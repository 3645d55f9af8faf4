package stripesim

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestSimRecordKeepsWhatWasSent stores intents past the string table's
// limits (more distinct short strings than it holds, strings too long for
// it, lengths of several uvarint bytes, bytes a uvarint tag could be
// mistaken for) and reads each back: the intent unpacked from its record is
// the one process was given, whether its strings were interned or not.
func TestSimRecordKeepsWhatWasSent(t *testing.T) {
	t.Parallel()
	sim := New(Config{Seed: 3})
	r := rand.New(rand.NewPCG(1, 2))
	type sent struct {
		ord int32
		p   createParams
		key string
	}
	var all []sent
	for i := range maxTable + 500 {
		p := createParams{
			amount: int64(i + 1), currency: "usd", paymentMethod: "pm_card_visa", confirm: true,
			metadata:    []simMeta{{"a", fmt.Sprintf("v-%d", i)}, {"b\x80\x01", strings.Repeat("é", i%50)}},
			methodTypes: simCardOnly,
		}
		switch i % 5 {
		case 1:
			p.description, p.hasDescription = strings.Repeat("d", 200+r.IntN(20000)), true
		case 2:
			p.methodTypes = []string{"card", fmt.Sprintf("t%d", i)}
			p.paymentMethod = "pm_card_chargeDeclined"
		case 3:
			p.methodTypes, p.paymentMethod = simBankOnly, pmBankAccountClosed
		case 4:
			p.confirm, p.paymentMethod, p.metadata = false, "", nil
		}
		key := fmt.Sprintf("key-%d-%s", i, strings.Repeat("k", i%300))
		want := p
		want.metadata = append([]simMeta(nil), p.metadata...)
		in, ord := sim.process("acct", key, [32]byte{byte(i)}, time.Unix(int64(i), 0), &p)
		all = append(all, sent{ord, want, key})
		if in.amount != want.amount || in.providerKey != key {
			t.Fatalf("intent %d answered %+v", i, in)
		}
	}
	if len(sim.strTable) != maxTable {
		t.Fatalf("string table has %d strings, want it full (%d)", len(sim.strTable), maxTable)
	}
	for _, s := range all {
		rec := sim.recs.at(s.ord)
		in := rec.view(sim.strTable)
		p := s.p
		wantPM := p.paymentMethod
		if in.decline != nil {
			wantPM = ""
		}
		got := createParams{amount: in.amount, currency: in.currency, paymentMethod: in.paymentMethod,
			description: in.description, hasDescription: in.hasDescription, metadata: in.metadata, methodTypes: in.methodTypes}
		want := createParams{amount: p.amount, currency: p.currency, paymentMethod: wantPM,
			description: p.description, hasDescription: p.hasDescription, metadata: p.metadata, methodTypes: p.methodTypes}
		if len(want.metadata) == 0 {
			want.metadata = []simMeta{}
		}
		if !reflect.DeepEqual(got, want) || in.providerKey != s.key || in.created != time.Unix(int64(s.ord), 0) ||
			rec.params != [32]byte{byte(s.ord)} || len(in.id) != intentIDLen || rec.id() != in.id {
			t.Fatalf("intent %d reads back as %+v, want %+v (key %q)", s.ord, got, want, s.key)
		}
		if v, ok := rec.meta(sim.strTable, "a"); len(p.metadata) > 0 && (!ok || v != p.metadata[0].value) {
			t.Fatalf("intent %d: metadata a is %q, %v", s.ord, v, ok)
		}
	}
}
