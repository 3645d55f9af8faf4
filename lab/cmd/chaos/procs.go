package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// proc is one child process the harness can start, kill and start again
// with the same command line. Each runs in its own process group (so a
// SIGINT at the terminal reaches only the harness, which then cleans up in
// order) and dies with the harness (Pdeathsig) if the harness is killed.
type proc struct {
	name string
	path string
	args []string
	env  []string
	log  string              // stdout and stderr are appended here
	cred *syscall.Credential // run as this user (Postgres refuses root); nil: as the harness

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// start starts the process; it must not be running.
func (p *proc) start() error {
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "---- %s: start %s\n", time.Now().Format(time.RFC3339Nano), p.name)
	cmd := exec.Command(p.path, p.args...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: p.cred}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done, p.err = cmd, done, nil
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// running reports whether the process is alive, and its exit channel.
func (p *proc) exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return p.done
}

func (p *proc) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// kill sends SIGKILL to the whole process group and waits for the exit.
func (p *proc) kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
}

// registry remembers every process so cleanup can reach them all.
type registry struct {
	mu    sync.Mutex
	procs []*proc
}

func (r *registry) add(p *proc) *proc {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.procs = append(r.procs, p)
	return p
}

// killAll kills every process group, newest first.
func (r *registry) killAll() {
	r.mu.Lock()
	ps := append([]*proc(nil), r.procs...)
	r.mu.Unlock()
	for i := len(ps) - 1; i >= 0; i-- {
		ps[i].kill()
	}
}

// runOnce runs a command to completion (go build, paydedup migrate), with its
// output in the log.
func runOnce(ctx context.Context, name, log string, env []string, path string, args ...string) error {
	logf, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w (see %s)", name, err, log)
	}
	return nil
}
