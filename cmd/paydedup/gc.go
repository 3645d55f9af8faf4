package main

import (
	"math"
	"runtime/debug"
	"strconv"
)

// DefaultGOGC is the garbage collector's target for the long-running
// commands (worker, gateway) when GOGC is not set. Go's default, 100,
// collects each time the heap doubles its live part; a worker's live heap
// is small (tens of MiB) and its garbage is made per message, so at 100 the
// collector runs often for little; 400 trades a larger peak RSS for less
// CPU per payment (docs/performance.md, "Memory"). GOGC, and GOMEMLIMIT for a pod
// with a memory limit, still win: the runtime reads them itself.
const DefaultGOGC = 400

// tuneGC sets the collector's target to DefaultGOGC unless the environment
// sets GOGC, and returns what is in effect, for the start log: GOGC, and
// the memory limit in bytes ("off" when there is none).
func (a *app) tuneGC() (gogc, memLimit string) {
	memLimit = "off"
	if l := debug.SetMemoryLimit(-1); l != math.MaxInt64 { // a negative limit reads it
		memLimit = strconv.FormatInt(l, 10)
	}
	if v := a.getenv("GOGC"); v != "" {
		return v, memLimit
	}
	debug.SetGCPercent(DefaultGOGC)
	return strconv.Itoa(DefaultGOGC), memLimit
}
