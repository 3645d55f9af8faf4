package procstat

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// stat is what TreeCPU reads of one /proc/<pid>/stat line.
type stat struct {
	comm                         string // the command name, as the kernel keeps it (15 bytes at most)
	ppid                         int
	utime, stime, cutime, cstime int64 // clock ticks (USER_HZ, 100 a second)
}

// readStat parses /proc/<pid>/stat. The command name, in parentheses, may
// hold spaces and parentheses, so the fields are counted from the last ')'.
func readStat(pid int) (stat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return stat{}, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return stat{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 15 {
		return stat{}, fmt.Errorf("/proc/%d/stat: %d fields after the command name, want at least 15", pid, len(f))
	}
	var st stat
	if j := strings.IndexByte(s, '('); j >= 0 && j < i {
		st.comm = s[j+1 : i]
	}
	var errs [5]error
	st.ppid, errs[0] = strconv.Atoi(f[1])
	st.utime, errs[1] = strconv.ParseInt(f[11], 10, 64)
	st.stime, errs[2] = strconv.ParseInt(f[12], 10, 64)
	st.cutime, errs[3] = strconv.ParseInt(f[13], 10, 64)
	st.cstime, errs[4] = strconv.ParseInt(f[14], 10, 64)
	if err := errors.Join(errs[:]...); err != nil {
		return stat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return st, nil
}

// PPID is a process's parent and the process's command name, from /proc.
func PPID(pid int) (ppid int, comm string, err error) {
	st, err := readStat(pid)
	return st.ppid, st.comm, err
}

// Comm is a process's command name, from /proc.
func Comm(pid int) (string, error) {
	st, err := readStat(pid)
	return st.comm, err
}

// TreeCPU is the CPU time, user and system, that a process and its
// children have spent so far: its own, that of its children that have
// exited and been waited for (cutime and cstime), and that of every child
// still running. For a PostgreSQL server's postmaster this is the whole
// server: every backend, the ones a client's pool opened and closed within
// the run included, and the background workers (autovacuum, the WAL writer,
// the checkpointer). A child that exits between the read of the parent and
// the scan of the children is missed (its time moves into cutime after the
// parent was read); over a run that opens and closes a handful of
// connections that is a few ticks at most. An error when /proc does not
// show the process (not Linux, or gone).
func TreeCPU(pid int) (time.Duration, error) {
	root, err := readStat(pid)
	if err != nil {
		return 0, err
	}
	ticks := root.utime + root.stime + root.cutime + root.cstime
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil || child == pid {
			continue
		}
		st, err := readStat(child)
		if err != nil || st.ppid != pid {
			continue // not a child, or gone since the directory was read
		}
		ticks += st.utime + st.stime
	}
	return time.Duration(ticks) * time.Second / 100, nil
}
