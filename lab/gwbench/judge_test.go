package gwbench

import (
	"testing"
	"time"

	"github.com/paydedup/paydedup/ledger"
)

// An accepted key charged twice is a double charge and not settled; one
// never completed, or completed without a charge, is lost.
func TestJudgeCountsDoubleAndLost(t *testing.T) {
	ref := func(k string) ledger.KeyRef { return ledger.KeyRef{MerchantID: "m", IdempotencyKey: k} }
	now := time.Now()
	accepted := []ledger.KeyRef{ref("ok"), ref("twice"), ref("never"), ref("uncharged")}
	completed := map[string]time.Time{"ok": now, "twice": now, "uncharged": now}
	charges := map[string]int{"m:ok": 1, "m:twice": 2, "m:never": 1, "m:other": 1}
	if double, lost := judge(accepted, completed, charges); double != 1 || lost != 3 {
		t.Fatalf("double %d, lost %d; want 1 and 3", double, lost)
	}
	if double, lost := judge(accepted[:1], completed, charges); double != 0 || lost != 0 {
		t.Fatalf("the good key alone: double %d, lost %d", double, lost)
	}
}
