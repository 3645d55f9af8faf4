//go:build unix && !linux

package localpg

import "syscall"

// sysProcAttr runs a cluster's process in its own process group, as cred.
// Outside Linux there is no Pdeathsig: a killed demo leaves its cluster
// running until the machine's temporary files are cleaned.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: cred}
}
