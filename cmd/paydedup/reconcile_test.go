package main

import (
	"context"
	"strings"
	"testing"
)

// TestReconcileRefusesShortSearchLag: with Stripe itself, a search lag that
// does not cover a charge landing after our call gave up plus the search's
// index lag is refused at start, naming the setting; in the worker too
// (which runs the reconciler), but not with the reconciler off.
func TestReconcileRefusesShortSearchLag(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/db", "PAYDEDUP_PROVIDER": "stripe",
		"STRIPE_SECRET_KEY": "sk_test_x", "PAYDEDUP_SEARCH_LAG": "1m", "PAYDEDUP_LOG_LEVEL": "error"}
	_, _, err := runCLI(context.Background(), env, "reconcile", "--once")
	if err == nil || !strings.Contains(err.Error(), "PAYDEDUP_SEARCH_LAG") || !strings.Contains(err.Error(), "2m20s") {
		t.Fatalf("reconcile with a 1m search lag at Stripe: %v", err)
	}
	_, _, err = runCLI(context.Background(), env, "worker")
	if err == nil || !strings.Contains(err.Error(), "PAYDEDUP_SEARCH_LAG") {
		t.Fatalf("worker with a 1m search lag at Stripe: %v", err)
	}
	env["PAYDEDUP_RECONCILE"] = "false"
	_, _, err = runCLI(context.Background(), env, "worker")
	if err != nil && strings.Contains(err.Error(), "PAYDEDUP_SEARCH_LAG") {
		t.Fatalf("worker without the reconciler refused its search lag: %v", err)
	}
}

// TestReconcileRefusesBadLookupBackoff: a lookup backoff that is not
// positive, or a cap below it, is refused at start, naming the variable.
func TestReconcileRefusesBadLookupBackoff(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ backoff, max, want string }{
		{"0s", "1m", "PAYDEDUP_LOOKUP_BACKOFF"},
		{"1m", "10s", "PAYDEDUP_LOOKUP_BACKOFF_MAX"},
	} {
		env := map[string]string{"DATABASE_URL": "postgres://x@127.0.0.1:1/db", "PAYDEDUP_PROVIDER": "stripe",
			"STRIPE_SECRET_KEY": "sk_test_x", "PAYDEDUP_LOG_LEVEL": "error",
			"PAYDEDUP_LOOKUP_BACKOFF": c.backoff, "PAYDEDUP_LOOKUP_BACKOFF_MAX": c.max}
		_, _, err := runCLI(context.Background(), env, "reconcile", "--once")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("reconcile with backoff %s, max %s: %v, want an error naming %s", c.backoff, c.max, err, c.want)
		}
	}
}
