package pgstore_test

import (
	"testing"
	"time"

	"github.com/paydedup/paydedup/gateway/pgstore"
)

// TestWorkerPausesCountOnlyFreshNotes: the workers' pause notes give the
// cause most of them report, since the earliest, and how many; a note not
// written for pgstore.PauseFresh (its worker was killed paused) no longer
// counts, and a cleared note is gone.
func TestWorkerPausesCountOnlyFreshNotes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, ok, err := b.store.WorkerPauses(b.ctx); err != nil || ok {
		t.Fatalf("no notes: %v %v, want none", ok, err)
	}
	t0 := b.clock.Now()
	for holder, cause := range map[string]string{"w1": "provider_unavailable", "w2": "provider_unavailable", "w3": "provider_auth"} {
		if err := b.store.NotePause(b.ctx, holder, cause, t0.Add(-time.Duration(len(holder))*time.Second), t0.Add(time.Duration(len(cause))*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.store.NotePause(b.ctx, "w2", "provider_unavailable", t0.Add(-time.Minute), t0.Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	p, ok, err := b.store.WorkerPauses(b.ctx)
	if err != nil || !ok || p.Cause != "provider_unavailable" || p.Workers != 2 || !p.Since.Equal(t0.Add(-time.Minute)) ||
		!p.RetryAt.Equal(t0.Add(5*time.Second)) {
		t.Fatalf("pauses %+v %v %v, want provider_unavailable by 2 workers since a minute ago, the soonest retry in 5s", p, ok, err)
	}
	if err := b.store.NotePause(b.ctx, "w1", "", time.Time{}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := b.store.NotePause(b.ctx, "w2", "", time.Time{}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if p, ok, err := b.store.WorkerPauses(b.ctx); err != nil || !ok || p.Cause != "provider_auth" || p.Workers != 1 {
		t.Fatalf("after two cleared: %+v %v %v, want provider_auth by 1", p, ok, err)
	}
	b.clock.Advance(pgstore.PauseFresh + time.Second)
	if p, ok, err := b.store.WorkerPauses(b.ctx); err != nil || ok {
		t.Fatalf("a note older than %v still counts: %+v %v", pgstore.PauseFresh, p, err)
	}
	if n := b.count(t, `SELECT count(*) FROM worker_pauses`); n != 1 {
		t.Fatalf("%d notes, want the stale one kept until its worker writes again", n)
	}
}
