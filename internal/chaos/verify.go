package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/paydedup/paydedup/internal/ledgercheck"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// Row is an idempotency_keys row joined with its payments ledger row.
type Row struct {
	Status        string // pending, completed, failed
	Amount        int64
	PaymentStatus string // succeeded, declined, or "" without a ledger row
	ChargeID      string
}

// DeadLetter is one dead letter as the harness reads it back.
type DeadLetter struct {
	Seq     uint64
	Reason  string
	ChaosID string // X-Chaos-Id of the original message
	Key     string // merchant:key when known
}

// Charge is one succeeded charge in the provider's ledger.
type Charge struct {
	Key    string // merchant:key
	Amount int64
}

// Evidence is everything the run left behind.
type Evidence struct {
	Rows         map[string]Row // by merchant:key
	DeadLetters  []DeadLetter
	Charges      []Charge
	ChargesByKey map[string]int
	Replayed     int // max_deliveries dead letters replayed (and deleted)
}

// Verdict is the judgement of a run.
type Verdict struct {
	Double       []string // keys charged more than once
	Lost         []string // payments (or bad messages) with no legitimate end
	Stuck        []string // keys still pending
	Inconsistent []string // anything else that must not happen, with why

	DeadLetters   int
	Malformed     int
	KeyReused     int
	MaxDeliveries int
	Other         int
}

// OK reports whether the run kept every guarantee.
func (v Verdict) OK() bool {
	return len(v.Double) == 0 && len(v.Lost) == 0 && len(v.Stuck) == 0 && len(v.Inconsistent) == 0
}

// Verify judges a run: no key charged twice, every valid payment completed
// exactly as published (charged once, or declined and never charged), every
// bad message dead-lettered with a bad-input reason and never claimed,
// every key reuse dead-lettered key_reused, nothing pending.
func Verify(w Workload, ev Evidence) Verdict {
	var v Verdict
	bad := func(format string, args ...any) {
		v.Inconsistent = append(v.Inconsistent, fmt.Sprintf(format, args...))
	}

	v.Double = ledgercheck.DoubleCharged(ev.ChargesByKey)
	for key, r := range ev.Rows {
		if r.Status == "pending" {
			v.Stuck = append(v.Stuck, key)
		}
	}

	dlByChaos := map[string][]DeadLetter{}
	for _, d := range ev.DeadLetters {
		dlByChaos[d.ChaosID] = append(dlByChaos[d.ChaosID], d)
		switch {
		case payment.IsInputReason(d.Reason):
			v.Malformed++
		case d.Reason == stream.ReasonKeyReused:
			v.KeyReused++
		case d.Reason == stream.ReasonMaxDeliveries:
			v.MaxDeliveries++
		default:
			v.Other++
			bad("dead letter %d (%s) has reason %s", d.Seq, d.ChaosID, d.Reason)
		}
	}
	v.MaxDeliveries += ev.Replayed
	v.DeadLetters = len(ev.DeadLetters) + ev.Replayed

	chargedAmount := map[string]int64{}
	for _, c := range ev.Charges {
		chargedAmount[c.Key] = c.Amount
	}
	known := map[string]bool{}
	for _, p := range w.Payments {
		key := p.RowKey()
		known[key] = true
		r, ok := ev.Rows[key]
		if !ok || r.Status != "completed" {
			status := "no row"
			if ok {
				status = r.Status
			}
			v.Lost = append(v.Lost, fmt.Sprintf("%s %s (%s; dead letters: %s)", p.ID, key, status, reasons(dlByChaos[p.ID])))
			continue
		}
		reused := 0
		for _, d := range dlByChaos[p.ID] {
			switch d.Reason {
			case stream.ReasonKeyReused:
				reused++
			case stream.ReasonMaxDeliveries:
				// Filed, then replayed or still there: the row is completed,
				// so the copy that ran out of deliveries was a duplicate.
			default:
				bad("%s %s completed but also dead-lettered %s", p.ID, key, d.Reason)
			}
		}
		want := []int64{p.Amount}
		if p.ReusedAmount != 0 {
			want = append(want, p.ReusedAmount)
			if reused == 0 {
				bad("%s %s: the key reused with another payload was not dead-lettered key_reused", p.ID, key)
			}
		} else if reused > 0 {
			bad("%s %s: dead-lettered key_reused although its key was never reused", p.ID, key)
		}
		if !slices.Contains(want, r.Amount) {
			bad("%s %s completed with amount %d, published %v", p.ID, key, r.Amount, want)
		}
		n := ev.ChargesByKey[key]
		switch {
		case p.Declines:
			if r.PaymentStatus != "declined" || n != 0 {
				bad("%s %s should be declined: ledger %q, %d provider charges", p.ID, key, r.PaymentStatus, n)
			}
		case r.PaymentStatus != "succeeded" || r.ChargeID == "":
			bad("%s %s completed without a succeeded ledger row (%q)", p.ID, key, r.PaymentStatus)
		case n == 0:
			bad("%s %s recorded as charged, but the provider has no charge", p.ID, key)
		case chargedAmount[key] != r.Amount:
			bad("%s %s charged %d at the provider, recorded %d", p.ID, key, chargedAmount[key], r.Amount)
		}
	}
	for _, m := range w.Malformed {
		ds := dlByChaos[m.ID]
		ok := false
		for _, d := range ds {
			ok = ok || payment.IsInputReason(d.Reason)
		}
		if !ok {
			v.Lost = append(v.Lost, fmt.Sprintf("%s (%s; dead letters: %s)", m.ID, m.Kind, reasons(ds)))
		}
	}
	for key, r := range ev.Rows {
		if !known[key] {
			bad("row %s (%s) belongs to no valid payment: a bad message was claimed", key, r.Status)
		}
	}
	for key := range ev.ChargesByKey {
		if !known[key] {
			bad("provider charge under %s, which is no valid payment", key)
		}
	}
	for _, s := range [][]string{v.Double, v.Lost, v.Stuck, v.Inconsistent} {
		slices.Sort(s)
	}
	return v
}

func reasons(ds []DeadLetter) string {
	if len(ds) == 0 {
		return "none"
	}
	rs := make([]string, len(ds))
	for i, d := range ds {
		rs[i] = d.Reason
	}
	return strings.Join(rs, ",")
}
