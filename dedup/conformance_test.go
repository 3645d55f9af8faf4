package dedup_test

import (
	"testing"

	"github.com/paydedup/paydedup/dedup"
	"github.com/paydedup/paydedup/internal/clock"
	"github.com/paydedup/paydedup/lab/storetest"
	"github.com/paydedup/paydedup/lab/testenv"
)

// TestStoreConformance runs the worker store's conformance suite
// (lab/storetest) against the PostgreSQL store, each check in its own
// migrated schema.
func TestStoreConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T, clk *clock.Fake) storetest.Store {
		s, err := dedup.New(testenv.Pool(t), dedup.Config{Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
