package pgstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/paydedup/paydedup/gateway/apikey"
	"github.com/paydedup/paydedup/ledger"
)

// TestIntakeBoundToItsFingerprint: an intake row binds its key to the
// first payload that may have been published under it, whatever became
// of that publish: once its lease passed with no mark of a publish (the
// publisher died, its PubAck was lost, or the mark was), only the same
// payload takes it over, by every acquire statement; another payload is
// IntakeMismatch until the row expires or a refusal abandons it.
func TestIntakeBoundToItsFingerprint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const publishLease, retention = 10 * time.Second, 48 * time.Hour
	m1, _, err := b.store.CreateAPIKey(b.ctx, "m_1", "")
	if err != nil {
		t.Fatal(err)
	}
	apiKey := apikey.Hash(m1)
	keys := []string{"batch", "new"}
	for _, k := range keys {
		if res, err := acquireOne(b.ctx, b.store, req("m_1", k, 100), publishLease, retention); err != nil || res.Outcome != ledger.IntakeAcquired {
			t.Fatalf("%s: %+v %v", k, res, err)
		}
	}
	b.clock.Advance(publishLease + time.Second) // no mark: the outcome of the publish is unknown
	acquire := map[string]func(ledger.ClaimRequest) (ledger.IntakeResult, error){
		"batch": func(r ledger.ClaimRequest) (ledger.IntakeResult, error) {
			return acquireOne(b.ctx, b.store, r, publishLease, retention)
		},
		"new": func(r ledger.ClaimRequest) (ledger.IntakeResult, error) {
			res, err := b.store.AcquireNewIntakes(b.ctx, []ledger.ClaimRequest{r}, [][]byte{apiKey}, publishLease, retention)
			if err != nil {
				return ledger.IntakeResult{}, err
			}
			return res[0], nil
		},
	}
	for _, k := range keys {
		res, err := acquire[k](req("m_1", k, 999))
		if err != nil || res.Outcome != ledger.IntakeMismatch || res.Intake.Amount != 100 {
			t.Fatalf("%s: another payload after the lease: %+v %v, want a mismatch with the first payload's row", k, res, err)
		}
		res, err = acquire[k](req("m_1", k, 100))
		if err != nil || res.Outcome != ledger.IntakeAcquired || res.Intake.Attempt != 2 || res.Intake.Amount != 100 {
			t.Fatalf("%s: the same payload after the lease: %+v %v", k, res, err)
		}
	}
	// An unknown outcome releases the lease and keeps the binding: the
	// same payload takes the row over at once, another is a mismatch.
	in, err := b.store.GetIntake(b.ctx, "m_1", "batch")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.ReleaseIntake(b.ctx, in); err != nil {
		t.Fatal(err)
	}
	if res, _ := acquireOne(b.ctx, b.store, req("m_1", "batch", 999), publishLease, retention); res.Outcome != ledger.IntakeMismatch {
		t.Fatalf("another payload after a release: %v", res.Outcome)
	}
	if res, err := acquireOne(b.ctx, b.store, req("m_1", "batch", 100), publishLease, retention); err != nil ||
		res.Outcome != ledger.IntakeAcquired || res.Intake.Attempt != 3 {
		t.Fatalf("the same payload after a release: %+v %v", res, err)
	}
	if err := b.store.ReleaseIntake(b.ctx, in); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Fatalf("a stale release: %v", err)
	}
	// A refusal frees the key: a corrected payload is new.
	if in, err = b.store.GetIntake(b.ctx, "m_1", "batch"); err != nil {
		t.Fatal(err)
	}
	if err := b.store.AbandonIntake(b.ctx, in); err != nil {
		t.Fatal(err)
	}
	if res, err := acquireOne(b.ctx, b.store, req("m_1", "batch", 999), publishLease, retention); err != nil ||
		res.Outcome != ledger.IntakeAcquired || res.Intake.Amount != 999 {
		t.Fatalf("a corrected payload after a refusal: %+v %v", res, err)
	}
	// Expired: any payload.
	b.clock.Advance(retention + time.Hour)
	if res, err := acquireOne(b.ctx, b.store, req("m_1", "new", 555), publishLease, retention); err != nil ||
		res.Outcome != ledger.IntakeAcquired || res.Intake.Amount != 555 {
		t.Fatalf("an expired row: %+v %v", res, err)
	}
	if _, err := b.store.GetIntake(b.ctx, "m_1", "nothing"); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatal(err)
	}
}
