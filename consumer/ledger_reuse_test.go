package consumer_test

import (
	"strings"
	"testing"
	"time"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/storehook"
	"github.com/paydedup/paydedup/ledger"
	"github.com/paydedup/paydedup/stream"
)

// TestPurgedKeyReusedDeadLettered: once a completed key's row is purged
// after its retention, the ledger is the only memory of the key. Another
// payment sent under the old key is dead-lettered key_reused, never acked as
// the old payment's duplicate (and never charged); the old payment sent
// again is a duplicate, acked and not charged.
func TestPurgedKeyReusedDeadLettered(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Now())
	e := setupWith(t, dedup.Config{Clock: clk})
	store := e.store
	watch := &claimWatch{seen: map[string][]ledger.Outcome{}}
	e.startWorkerOn("w1", storehook.Wrap(store).After(storehook.ClaimBatch, watch.record))

	e.publish("m_1", body("m_1", "old", 100), "", nil)
	e.eventually("payment completed", func() bool {
		rec, err := store.Get(e.ctx, "m_1", "old")
		return err == nil && rec.Status == ledger.StatusCompleted
	})
	// The key's day partition goes once the whole day is past the
	// retention (migration 00013; today's partition holds it, 00016).
	clk.Advance(ledger.DefaultRetention + 25*time.Hour)
	if n, err := store.Purge(e.ctx, 10); err != nil || n != 1 {
		t.Fatalf("purge: %d %v", n, err)
	}

	e.publish("m_1", body("m_1", "old", 999), "", nil)
	e.eventually("key_reused dead letter", func() bool { return len(e.deadLetters()) == 1 })
	dl := e.deadLetters()[0]
	p, err := stream.ParseDeadLetter(dl.Header)
	if err != nil || p.Reason != stream.ReasonKeyReused || !strings.Contains(dl.Header.Get("Dlq-Error"), "purged") {
		t.Fatalf("dead letter %+v (%q) %v, want key_reused naming the purged record", p, dl.Header.Get("Dlq-Error"), err)
	}

	e.publish("m_1", body("m_1", "old", 100), "", nil)
	e.eventually("the old payment again is a duplicate", func() bool { return watch.count("old", ledger.Duplicate) == 1 })
	e.quiescent()
	if n := len(e.deadLetters()); n != 1 {
		t.Fatalf("%d dead letters, want only the reused key's", n)
	}
	if n := e.charges("m_1", "old"); n != 1 {
		t.Fatalf("charges under the key = %d, want 1", n)
	}
	if _, err := store.Get(e.ctx, "m_1", "old"); err == nil {
		t.Fatal("neither copy may recreate the purged key row")
	}
}
