package main

import (
	"context"
	"strings"
	"testing"
)

// A replica count JetStream cannot have stops the worker before it
// connects, naming the variable; so does a negative publish --retry.
func TestBadReplicasAndRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, r := range []string{"0", "6"} {
		_, _, err := runCLI(ctx, map[string]string{"PAYDEDUP_STREAM_REPLICAS": r, "PAYDEDUP_DLQ_KEY": strings.Repeat("k", 40)}, "worker")
		if err == nil || !strings.Contains(err.Error(), "PAYDEDUP_STREAM_REPLICAS") || !strings.Contains(err.Error(), "1 to 5") {
			t.Fatalf("PAYDEDUP_STREAM_REPLICAS=%s worker: %v", r, err)
		}
	}
	_, _, err := runCLI(ctx, nil, "publish", "--retry", "-1s")
	if err == nil || !strings.Contains(err.Error(), "--retry must not be negative") {
		t.Fatalf("publish --retry -1s: %v", err)
	}
}
