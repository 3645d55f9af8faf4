package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/paydedup/paydedup/audit"
)

// audit runs `paydedup audit` over the run, as an operator would, for the
// final verdict beside the harness's own ledger check: the provider's own
// records (listed through the simulator's faults) against the ledger. It
// returns the findings, and an error when the audit could not run.
func (h *harness) audit(ctx context.Context) ([]audit.Finding, error) {
	log := filepath.Join(h.logs, "audit.log")
	logf, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	var stdout bytes.Buffer
	cmd := exec.CommandContext(ctx, h.bin, "audit", "--json", "--since", h.start.Add(-time.Minute).UTC().Format(time.RFC3339),
		"--until", "0", "--margin", "1m")
	cmd.Env = h.workerEnv()
	cmd.Stdout, cmd.Stderr = &stdout, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	runErr := cmd.Run()
	_, _ = logf.Write(stdout.Bytes())
	var rep audit.Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		return nil, fmt.Errorf("paydedup audit: %v, no report (see %s)", runErr, log)
	}
	if runErr != nil && !rep.Drift() {
		return nil, fmt.Errorf("paydedup audit: %w with a clean report (see %s)", runErr, log)
	}
	h.logf("audit (paydedup audit): %d intents, %d ledger rows, %d retrieved by id: %s", rep.Intents, rep.LedgerRows, rep.Retrieved, rep.Summary())
	return rep.Findings, nil
}
