package main

import (
	"context"
	"strings"
	"testing"
)

// PAYDEDUP_STREAM_MAX_AGE, left over from a version whose stream expired
// commands, stops the worker before it connects, naming the replacement.
func TestWorkerRefusesStreamMaxAge(t *testing.T) {
	t.Parallel()
	env := map[string]string{"PAYDEDUP_DLQ_KEY": strings.Repeat("k", 40), "DATABASE_URL": "postgres://x@127.0.0.1:1/db",
		"PAYDEDUP_STREAM_MAX_AGE": "24h"}
	_, _, err := runCLI(context.Background(), env, "worker")
	if err == nil || !strings.Contains(err.Error(), "PAYDEDUP_STREAM_MAX_AGE") || !strings.Contains(err.Error(), "PAYDEDUP_STREAM_MAX_BYTES") {
		t.Fatalf("worker with PAYDEDUP_STREAM_MAX_AGE: %v, want a refusal naming it and PAYDEDUP_STREAM_MAX_BYTES", err)
	}
}
