package dlq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/paydedup/paydedup/dlq"
)

func TestDeleteDeadLetter(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	seq := fileDeadLetter(t, js, cfg, "malformed_json", "m_1", "k-del", time.Now())
	keep := fileDeadLetter(t, js, cfg, "malformed_json", "m_1", "k-keep", time.Now())
	d, err := dlq.Delete(ctx, js, cfg, seq)
	if err != nil || d.Seq != seq || d.IdempotencyKey != "k-del" {
		t.Fatalf("delete %d: %+v, %v", seq, d, err)
	}
	if _, err := dlq.Get(ctx, js, cfg, seq); !errors.Is(err, dlq.ErrNotFound) {
		t.Fatalf("dead letter %d is still there: %v", seq, err)
	}
	if _, err := dlq.Get(ctx, js, cfg, keep); err != nil {
		t.Fatalf("the other dead letter went too: %v", err)
	}
	if _, err := dlq.Delete(ctx, js, cfg, seq); !errors.Is(err, dlq.ErrNotFound) {
		t.Fatalf("deleting it again: %v, want ErrNotFound", err)
	}
}

// A purge selects by reason and by the stream's stored time, never by the
// letter's own Dlq-Failed-At.
func TestPurgeCandidates(t *testing.T) {
	t.Parallel()
	js, cfg := adminSetup(t)
	ctx := context.Background()
	// Failed "long ago" by its header, but stored just now.
	old := fileDeadLetter(t, js, cfg, "malformed_json", "m_1", "k-1", time.Now().Add(-30*24*time.Hour))
	fileDeadLetter(t, js, cfg, "max_deliveries", "m_1", "k-2", time.Now().Add(-30*24*time.Hour))

	got, err := dlq.PurgeCandidates(ctx, js, cfg, dlq.PurgeFilter{Reason: "malformed_json", OlderThan: time.Hour})
	if err != nil || len(got) != 0 {
		t.Fatalf("letters stored a moment ago, older than 1h: %d, %v (the Dlq-Failed-At header must not count)", len(got), err)
	}
	later := time.Now().Add(2 * time.Hour)
	got, err = dlq.PurgeCandidates(ctx, js, cfg, dlq.PurgeFilter{Reason: "malformed_json", OlderThan: time.Hour, Now: later})
	if err != nil || len(got) != 1 || got[0].Seq != old {
		t.Fatalf("two hours later, malformed_json older than 1h: %+v, %v; want only %d", got, err, old)
	}
	for _, f := range []dlq.PurgeFilter{{OlderThan: time.Hour}, {Reason: "malformed_json"}} {
		if _, err := dlq.PurgeCandidates(ctx, js, cfg, f); err == nil {
			t.Errorf("%+v: no error", f)
		}
	}
}
