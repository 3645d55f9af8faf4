package workload

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
)

func testWorkload(n int) Mix {
	return Generate(MixConfig{Payments: n, Seed: 42, Run: "t", Subject: "payments.requests",
		DuplicateRate: 0.3, MalformedRate: 0.02, ReuseRate: 0.01, DeclineRate: 0.05, HeaderOnly: 0.1})
}

// decode reads a publish as the worker does.
func decode(p Publish) (*payment.Command, error) {
	env := payment.Envelope{SubjectMerchant: strings.TrimPrefix(p.Subject, "payments.requests.")}
	if k, ok := p.Header[HeaderKey]; ok {
		env.HeaderKey, env.HeaderKeySet = k, true
	}
	return payment.Decode(p.Body, env, payment.Limits{})
}

func TestGenerate(t *testing.T) {
	t.Parallel()
	w := testWorkload(5000)
	if len(w.Payments) != 5000 {
		t.Fatalf("%d payments", len(w.Payments))
	}
	near := func(what string, got int, want float64) {
		if float64(got) < want*0.8 || float64(got) > want*1.2 {
			t.Errorf("%s: %d, want about %.0f", what, got, want)
		}
	}
	declines, headerOnly := 0, 0
	keys := map[string]bool{}
	for _, p := range w.Payments {
		if keys[p.RowKey()] {
			t.Fatalf("key %s twice", p.RowKey())
		}
		keys[p.RowKey()] = true
		if p.Declines {
			declines++
		}
		if p.HeaderOnly {
			headerOnly++
		}
	}
	near("duplicates", w.Duplicates, 1500)
	near("malformed", len(w.Malformed), 100)
	near("reuses", w.Reuses, 50)
	near("declines", declines, 250)
	near("header-only keys", headerOnly, 500)
	if want := len(w.Payments) + w.Duplicates + w.Reuses + len(w.Malformed); len(w.Publishes) != want {
		t.Fatalf("%d publishes, want %d", len(w.Publishes), want)
	}

	// Every publish is what the harness expects of it: a payment's copies
	// decode to the same fingerprint (or another one for a reuse), bad
	// messages are rejected with a bad-input reason.
	byID := map[string]Payment{}
	for _, p := range w.Payments {
		byID[p.ID] = p
	}
	seen := map[string]bool{}
	for _, pub := range w.Publishes {
		id := pub.Header[HeaderID]
		if pub.Header[HeaderMsgID] == "" || id == "" {
			t.Fatalf("publish without Nats-Msg-Id or X-Chaos-Id: %v", pub.Header)
		}
		c, err := decode(pub)
		if strings.HasPrefix(id, "bad-") {
			var ve *payment.ValidationError
			if !errors.As(err, &ve) || !payment.IsInputReason(string(ve.Reason)) {
				t.Errorf("%s (%s): decoded, want a bad-input rejection (%v)", id, pub.Body, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		p := byID[id]
		if c.MerchantID != p.Merchant || c.IdempotencyKey != p.Key {
			t.Fatalf("%s decodes as %s:%s", id, c.MerchantID, c.IdempotencyKey)
		}
		orig := &payment.Command{MerchantID: p.Merchant, IdempotencyKey: p.Key, Amount: p.Amount, Currency: p.Currency,
			PaymentMethod: p.Method, Description: "chaos " + p.ID, Metadata: map[string]string{"order_id": p.ID}}
		same := bytes.Equal(ledger.Fingerprint(c), ledger.Fingerprint(orig))
		if reuse := strings.HasSuffix(pub.Header[HeaderMsgID], ":reuse"); same == reuse {
			t.Fatalf("%s (%s): same fingerprint %v for a reuse=%v publish", id, pub.Header[HeaderMsgID], same, reuse)
		}
		if !seen[id] && pub.Header[HeaderMsgID] != p.Merchant+":"+p.Key {
			t.Fatalf("%s: a copy was published before the original", id)
		}
		seen[id] = true
	}
}

func TestVerify(t *testing.T) {
	t.Parallel()
	w := testWorkload(400)
	good := func() Evidence {
		ev := Evidence{Rows: map[string]Row{}, ChargesByKey: map[string]int{}}
		for _, p := range w.Payments {
			r := Row{Status: "completed", Amount: p.Amount, PaymentStatus: "succeeded", ChargeID: "pi_" + p.ID}
			if p.Declines {
				r.PaymentStatus, r.ChargeID = "declined", ""
			} else {
				ev.ChargesByKey[p.RowKey()] = 1
				ev.Charges = append(ev.Charges, Charge{Key: p.RowKey(), Amount: p.Amount})
			}
			ev.Rows[p.RowKey()] = r
			if p.ReusedAmount != 0 {
				ev.DeadLetters = append(ev.DeadLetters, DeadLetter{Reason: "key_reused", ChaosID: p.ID})
			}
		}
		for _, m := range w.Malformed {
			ev.DeadLetters = append(ev.DeadLetters, DeadLetter{Reason: "malformed_json", ChaosID: m.ID})
		}
		return ev
	}
	if v := Verify(w, good()); !v.OK() {
		t.Fatalf("a clean run judged bad: %+v", v)
	}
	var charged, declined, reused Payment
	for _, p := range w.Payments {
		switch {
		case p.Declines:
			declined = p
		case p.ReusedAmount != 0:
			reused = p
		default:
			charged = p
		}
	}
	if declined.ID == "" || reused.ID == "" {
		t.Fatal("the workload has no decline or no reuse")
	}
	cases := []struct {
		name   string
		mutate func(*Evidence)
		check  func(Verdict) bool
	}{
		{"double charge", func(ev *Evidence) { ev.ChargesByKey[charged.RowKey()] = 2 }, func(v Verdict) bool { return len(v.Double) == 1 }},
		{"no row", func(ev *Evidence) { delete(ev.Rows, charged.RowKey()) }, func(v Verdict) bool { return len(v.Lost) == 1 }},
		{"failed row, dead-lettered max_deliveries", func(ev *Evidence) {
			r := ev.Rows[charged.RowKey()]
			r.Status = "failed"
			ev.Rows[charged.RowKey()] = r
			ev.DeadLetters = append(ev.DeadLetters, DeadLetter{Reason: "max_deliveries", ChaosID: charged.ID})
		}, func(v Verdict) bool { return len(v.Lost) == 1 }},
		{"pending row", func(ev *Evidence) {
			r := ev.Rows[charged.RowKey()]
			r.Status = "pending"
			ev.Rows[charged.RowKey()] = r
		}, func(v Verdict) bool { return len(v.Stuck) == 1 && len(v.Lost) == 1 }},
		{"malformed not dead-lettered", func(ev *Evidence) {
			ev.DeadLetters = ev.DeadLetters[:len(ev.DeadLetters)-1]
		}, func(v Verdict) bool { return len(v.Lost) == 1 }},
		{"decline charged", func(ev *Evidence) { ev.ChargesByKey[declined.RowKey()] = 1 }, func(v Verdict) bool { return len(v.Inconsistent) > 0 }},
		{"charge not recorded at the provider", func(ev *Evidence) { delete(ev.ChargesByKey, charged.RowKey()) }, func(v Verdict) bool { return len(v.Inconsistent) == 1 }},
		{"wrong amount", func(ev *Evidence) {
			r := ev.Rows[charged.RowKey()]
			r.Amount++
			ev.Rows[charged.RowKey()] = r
		}, func(v Verdict) bool { return len(v.Inconsistent) > 0 }},
		{"reuse not dead-lettered", func(ev *Evidence) {
			for i, d := range ev.DeadLetters {
				if d.ChaosID == reused.ID {
					ev.DeadLetters = append(ev.DeadLetters[:i], ev.DeadLetters[i+1:]...)
					break
				}
			}
		}, func(v Verdict) bool { return len(v.Inconsistent) == 1 }},
		{"bad message claimed", func(ev *Evidence) { ev.Rows["m_bad:bad-t-0"] = Row{Status: "completed"} }, func(v Verdict) bool { return len(v.Inconsistent) == 1 }},
		{"unknown dead-letter reason", func(ev *Evidence) {
			ev.DeadLetters = append(ev.DeadLetters, DeadLetter{Reason: "ledger_conflict", ChaosID: charged.ID})
		}, func(v Verdict) bool { return len(v.Inconsistent) >= 1 && v.Other == 1 }},
	}
	for _, c := range cases {
		ev := good()
		c.mutate(&ev)
		if v := Verify(w, ev); v.OK() || !c.check(v) {
			t.Errorf("%s: verdict %+v", c.name, v)
		}
	}
}
