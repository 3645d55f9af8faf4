package localpg

import "syscall"

// sysProcAttr runs a cluster's process in its own process group (a SIGINT
// at the terminal reaches only us, and we stop it in order), as cred, and
// kills it if we die.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred}
}
