package procstat

import (
	"bufio"
	"fmt"
	"os"
	"time"
)

// PIDCPU is another process's CPU time so far, all its threads' (those
// gone included): utime+stime from /proc/<pid>/stat, in clock ticks of
// 10 ms. (/proc/<pid>/schedstat counts the main thread only.) false when
// /proc does not tell (not Linux, the process is gone or not ours).
func PIDCPU(pid int) (time.Duration, bool) {
	st, err := readStat(pid)
	if err != nil {
		return 0, false
	}
	return time.Duration(st.utime+st.stime) * time.Second / 100, true // USER_HZ
}

// PIDPeakRSSMB is another process's peak resident set size (VmHWM) in MiB,
// 0 where /proc does not tell.
func PIDPeakRSSMB(pid int) float64 { return peakRSSMB(fmt.Sprintf("/proc/%d/status", pid)) }

// peakRSSMB reads VmHWM from a /proc status file, in MiB; 0 where it
// cannot.
func peakRSSMB(status string) float64 {
	f, err := os.Open(status)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kb float64
		if n, _ := fmt.Sscanf(sc.Text(), "VmHWM: %f kB", &kb); n == 1 {
			return kb / 1024
		}
	}
	return 0
}
