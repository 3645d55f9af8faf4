//go:build !nolab

package main

import (
	"strings"
	"testing"
)

// publish --generate draws a progress bar at a terminal, and nothing
// elsewhere.
func TestPublishGenerateProgress(t *testing.T) {
	t.Parallel()
	w := newCLIWorld(t, "", true)
	_, errOut, err := w.runAt(true, "", "publish", "--generate", "50", "--seed", "3")
	if err != nil || !strings.Contains(errOut, "publish") || !strings.Contains(errOut, "/50") {
		t.Fatalf("at a terminal: %v, want a bar counting to 50:\n%q", err, errOut)
	}
	_, errOut, err = w.runAt(false, "", "publish", "--generate", "50", "--seed", "4")
	if err != nil || errOut != "" {
		t.Fatalf("not at a terminal: %v, want nothing on stderr:\n%q", err, errOut)
	}
}
