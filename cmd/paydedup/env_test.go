package main

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/paydedup/paydedup/lab/testenv"
)

// A bad variable breaks only the commands that use it, and names itself
// once with the fix.
func TestBadVariableBreaksOnlyItsCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "PAYDEDUP_LOG_LEVEL": "warn", "PAYDEDUP_LEASE": "45"}
	if out, errOut, err := runCLI(ctx, env, "migrate", "status"); err != nil {
		t.Fatalf("PAYDEDUP_LEASE=45 migrate status: %v\n%s%s", err, out, errOut)
	}
	_, _, err := runCLI(ctx, env, "worker")
	if err == nil {
		t.Fatal("PAYDEDUP_LEASE=45 worker: no error")
	}
	msg := err.Error()
	if strings.Count(msg, "PAYDEDUP_LEASE") != 1 || !strings.Contains(msg, `"45"`) || !strings.Contains(msg, "45s") {
		t.Fatalf("PAYDEDUP_LEASE=45 worker: %q, want the variable named once, its value and the fix (45s)", msg)
	}
}

// Every variable the tree parses is named by a flag of some command, so
// that a bad value is reported by the commands that use it rather than
// silently replaced by the default.
func TestEveryParsedVariableHasACommand(t *testing.T) {
	root, a := newRoot(io.Discard, io.Discard, func(k string) string { return "x!" })
	named := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			for _, m := range envKeyInUsage.FindAllStringSubmatch(f.Usage, -1) {
				named[m[1]] = true
			}
		})
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	if len(a.envErrs) < 20 {
		t.Fatalf("only %d variables failed to parse as x!: the test reads the environment wrong", len(a.envErrs))
	}
	for k := range a.envErrs {
		if !named[k] {
			t.Errorf("%s is parsed but no flag's usage names it: a bad value would be ignored", k)
		}
	}
}

// A negative PAYDEDUP_NET_REQUEUES stops the worker before it starts,
// naming the setting.
func TestNegativeNetRequeuesRefused(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "PAYDEDUP_LOG_LEVEL": "warn", "PAYDEDUP_NET_REQUEUES": "-1"}
	_, _, err := runCLI(context.Background(), env, "worker")
	if err == nil || !strings.Contains(err.Error(), "net requeues must not be negative, got -1") {
		t.Fatalf("PAYDEDUP_NET_REQUEUES=-1 worker: %v, want the setting named", err)
	}
}
