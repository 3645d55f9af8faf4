// Package procstat holds what the lab's benches read about their own
// process (CPU time, peak memory) and the random suffix that keeps one
// run's streams and keys apart from another's.
package procstat

import (
	"crypto/rand"
	"encoding/hex"
	"syscall"
	"time"
)

// CPU is the process's user and system CPU time so far.
func CPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// PeakRSSMB is the process's peak resident set size (VmHWM) in MiB, 0 where
// /proc does not tell.
func PeakRSSMB() float64 { return peakRSSMB("/proc/self/status") }

// RunSuffix names one run: "r" and 7 random hex digits. It starts with a
// letter so that it reads as an identifier: the benches build keys and
// subjects from it and a number ("gwb-<suffix>-00000123"), and an
// all-digit suffix joined to that number could make a card number, which
// the door refuses (internal/redact).
func RunSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "r" + hex.EncodeToString(b[:])[:7]
}
