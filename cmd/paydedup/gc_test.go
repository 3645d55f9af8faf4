package main

import (
	"runtime/debug"
	"testing"
)

// TestGCTarget checks the long-running commands' collector target:
// DefaultGOGC unless GOGC is set, which the runtime then applies itself.
// Not parallel: the target is the whole test binary's, and Go runs no
// parallel test beside a sequential one.
func TestGCTarget(t *testing.T) {
	old := debug.SetGCPercent(100)
	defer debug.SetGCPercent(old)

	a := &app{getenv: func(string) string { return "" }}
	if gogc, _ := a.tuneGC(); gogc != "400" {
		t.Errorf("tuneGC reports GOGC %s without GOGC set, want 400", gogc)
	}
	if got := debug.SetGCPercent(100); got != DefaultGOGC {
		t.Errorf("GC percent %d without GOGC set, want %d", got, DefaultGOGC)
	}

	a = &app{getenv: func(k string) string {
		if k == "GOGC" {
			return "150"
		}
		return ""
	}}
	if gogc, _ := a.tuneGC(); gogc != "150" {
		t.Errorf("tuneGC reports GOGC %s with GOGC=150, want 150", gogc)
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GC percent %d with GOGC set, want it left as the runtime set it (100 here)", got)
	}
}
