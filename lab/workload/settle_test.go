package workload

import (
	"math/rand/v2"
	"reflect"
	"testing"
)

func TestSettle(t *testing.T) {
	t.Parallel()
	charged := Row{Status: "completed", ResponseStatus: 200, ChargeID: "pi_1"}
	declined := Row{Status: "completed", ResponseStatus: 402}
	ledgerDeclined := Row{Status: "completed", PaymentStatus: "declined"}
	for _, c := range []struct {
		name     string
		declines bool
		row      Row
		ok       bool
		charges  int
		want     Outcome
	}{
		{"charged once", false, charged, true, 1, Charged},
		{"charged twice is still charged (DoubleCharged counts it)", false, charged, true, 2, Charged},
		{"declined, never charged", true, declined, true, 0, Declined},
		{"declined by the ledger row", true, ledgerDeclined, true, 0, Declined},
		{"no row", false, Row{}, false, 0, Unsettled},
		{"pending", false, Row{Status: "pending"}, true, 1, Unsettled},
		{"completed without a charge", false, charged, true, 0, Disagrees},
		{"declined but charged", true, declined, true, 1, Disagrees},
		{"a declining card recorded as charged", true, charged, true, 1, Disagrees},
		{"recorded as declined, card that charges", false, declined, true, 0, Disagrees},
	} {
		if got := Settle(c.declines, c.row, c.ok, c.charges); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	w := Numbered{N: 3}
	rows := map[string]Row{
		"m_bench:p-0": {Status: "completed", ResponseStatus: 200},
		"m_bench:p-1": {Status: "completed", ResponseStatus: 200},
	}
	got := Check(w.Expected(), rows, map[string]int{"m_bench:p-0": 1, "m_bench:p-1": 2})
	want := Tally{KeysCharged: 2, Double: []string{"m_bench:p-1 (charged 2 times)"}, ChargedOnce: 1,
		Unsettled: []string{"m_bench:p-2 (no row, 0 charges)"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Check = %+v, want %+v", got, want)
	}
}

func TestNumberedOrder(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ n, dups int }{{10, 0}, {10, 3}, {10, 10}, {4, 9}} {
		order := Numbered{N: c.n, Dups: c.dups}.Order()
		firsts, copies := 0, 0
		for _, o := range order {
			if o.I < 0 || o.I >= c.n {
				t.Fatalf("n=%d dups=%d: index %d", c.n, c.dups, o.I)
			}
			if o.N == 0 {
				firsts++
			} else {
				copies++
			}
		}
		if firsts != c.n || copies != c.dups {
			t.Errorf("n=%d dups=%d: %d firsts, %d copies", c.n, c.dups, firsts, copies)
		}
	}
}

func TestPlanPhasedIsDeterministic(t *testing.T) {
	t.Parallel()
	plan := func() Phased {
		return PlanPhased(rand.New(rand.NewPCG(7, 0x5eed)), PhasedConfig{Payments: 300, Duplicates: 0.4, Declines: 0.05, Prefix: "demo-x"})
	}
	a, b := plan(), plan()
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed planned two workloads")
	}
	declined := 0
	for _, p := range a.Payments {
		if p.Cmd.PaymentMethod == "pm_card_chargeDeclined" {
			declined++
		}
	}
	if len(a.Payments) != 300 || declined != 15 {
		t.Errorf("%d payments, %d declined; want 300 and 15", len(a.Payments), declined)
	}
}
