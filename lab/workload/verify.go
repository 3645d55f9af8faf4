package workload

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/payment"
	"github.com/paydedup/paydedup/stream"
)

// Row is an idempotency_keys row, joined with its payments ledger row
// where the reader has it.
type Row struct {
	Status         string // pending, completed, failed
	Amount         int64
	PaymentStatus  string // succeeded, declined, or "" without a ledger row
	ChargeID       string
	ResponseStatus int // the stored HTTP status, 0 where the reader has none
}

// declined reports whether the row completed with a definitive decline:
// its ledger row says so, or it stored the decline's error response.
func (r Row) declined() bool { return r.PaymentStatus == "declined" || r.ResponseStatus >= 400 }

// RowOf is the store's record as the verifier reads it.
func RowOf(rec ledger.Record) Row {
	return Row{Status: string(rec.Status), ChargeID: rec.ChargeID, ResponseStatus: rec.ResponseStatus}
}

// RowKey names the row of ref: "merchant_id:idempotency_key", the key of
// the provider's charges.
func RowKey(ref ledger.KeyRef) string { return ref.MerchantID + ":" + ref.IdempotencyKey }

// Getter is the part of the store the verifier reads.
type Getter interface {
	GetMany(ctx context.Context, refs []ledger.KeyRef) ([]ledger.Record, error)
}

// StoreRows reads the rows of refs from the store, by RowKey; a ref with no
// row is missing from the map.
func StoreRows(ctx context.Context, store Getter, refs []ledger.KeyRef) (map[string]Row, error) {
	recs, err := store.GetMany(ctx, refs)
	if err != nil {
		return nil, err
	}
	rows := make(map[string]Row, len(recs))
	for _, rec := range recs {
		rows[RowKey(ledger.KeyRef{MerchantID: rec.MerchantID, IdempotencyKey: rec.IdempotencyKey})] = RowOf(rec)
	}
	return rows, nil
}

// Outcome is how one valid payment ended, judged against the provider's
// ledger.
type Outcome int

// The outcomes of Settle.
const (
	Charged   Outcome = iota // completed as charged, and the provider charged it
	Declined                 // completed as declined, and the provider never charged it
	Unsettled                // not completed: lost, unless a dead letter accounts for it
	Disagrees                // completed, but not as the provider's ledger says
)

// Settle judges one valid payment: the row of its key (ok false: none) and
// the provider's charges under it; declines says whether its card is one
// the provider declines. Every lab verifier judges a payment here.
func Settle(declines bool, r Row, ok bool, charges int) Outcome {
	switch {
	case !ok || r.Status != "completed":
		return Unsettled
	case r.declined() && declines && charges == 0:
		return Declined
	case !r.declined() && !declines && charges >= 1:
		return Charged
	}
	return Disagrees
}

// Expected is one valid payment a run must settle exactly once.
type Expected struct {
	Key      string // "merchant_id:idempotency_key"
	Declines bool   // its card is one the provider declines
}

// Tally is the judgement of expected payments against the provider's
// ledger and the store's rows.
type Tally struct {
	KeysCharged int      // keys the provider charged at all
	Double      []string // keys charged more than once (DoubleCharged)
	ChargedOnce int      // charged, exactly once
	Declined    int      // declined and never charged
	Unsettled   []string // payments not completed: key, status and charges
	Disagree    []string // payments completed otherwise than the ledger says, with why
}

// Check judges each expected payment (Settle) against its row (by
// "merchant_id:idempotency_key") and the provider's charges per key.
func Check(expected []Expected, rows map[string]Row, charges map[string]int) Tally {
	t := Tally{KeysCharged: len(charges), Double: DoubleCharged(charges)}
	for _, e := range expected {
		r, ok := rows[e.Key]
		n := charges[e.Key]
		switch Settle(e.Declines, r, ok, n) {
		case Charged:
			if n == 1 {
				t.ChargedOnce++
			}
		case Declined:
			t.Declined++
		case Unsettled:
			status := "no row"
			if ok {
				status = r.Status
			}
			t.Unsettled = append(t.Unsettled, fmt.Sprintf("%s (%s, %d charges)", e.Key, status, n))
		case Disagrees:
			t.Disagree = append(t.Disagree, fmt.Sprintf("%s (completed with HTTP %d, charge %q; the provider has %d charges)",
				e.Key, r.ResponseStatus, r.ChargeID, n))
		}
	}
	return t
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
func Verify(w Mix, ev Evidence) Verdict {
	var v Verdict
	bad := func(format string, args ...any) {
		v.Inconsistent = append(v.Inconsistent, fmt.Sprintf(format, args...))
	}

	v.Double = DoubleCharged(ev.ChargesByKey)
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
		n := ev.ChargesByKey[key]
		outcome := Settle(p.Declines, r, ok, n)
		if outcome == Unsettled {
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
		switch {
		case p.Declines:
			if outcome != Declined {
				bad("%s %s should be declined: ledger %q, %d provider charges", p.ID, key, r.PaymentStatus, n)
			}
		case r.PaymentStatus != "succeeded" || r.ChargeID == "":
			bad("%s %s completed without a succeeded ledger row (%q)", p.ID, key, r.PaymentStatus)
		case outcome != Charged:
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
