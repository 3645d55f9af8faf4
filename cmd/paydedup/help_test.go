package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/paydedup/paydedup/stream"
)

// helpVar finds the environment variables a help text names.
var helpVar = regexp.MustCompile(`\b(PAYDEDUP_[A-Z0-9_]*[A-Z0-9]|STRIPE_[A-Z0-9_]*[A-Z0-9]|NATS_[A-Z0-9_]*[A-Z0-9]|DATABASE_URL)\b`)

// readVariables is every environment variable name the module's non-test
// Go code spells as a string literal: what some code can read.
func readVariables(t *testing.T) map[string]bool {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]bool{}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil {
					for _, m := range helpVar.FindAllString(s, -1) {
						if m == s || strings.HasSuffix(s, "="+m) || strings.HasPrefix(s, m+"=") {
							vars[m] = true
						}
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return vars
}

// helpOf renders what `paydedup <path> --help` shows.
func helpOf(c *cobra.Command) string {
	var b strings.Builder
	b.WriteString(c.Short + "\n" + c.Long + "\n" + c.Example + "\n")
	c.Flags().VisitAll(func(f *pflag.Flag) { b.WriteString(f.Usage + "\n") })
	return b.String()
}

// TestHelpNamesWhatExists renders every command's help (as a new user
// reads it) and checks it against the code: each environment variable it
// names is one some code reads; no example carries a live Stripe key; the
// commands that need a secret with no flag say so; dlq names every reason
// a letter can carry that is not bad input.
func TestHelpNamesWhatExists(t *testing.T) {
	vars := readVariables(t)
	if len(vars) < 30 || !vars["PAYDEDUP_DLQ_KEY"] || !vars["STRIPE_SECRET_KEY"] {
		t.Fatalf("found only %d variables in the code (%v): the test reads the tree wrong", len(vars), vars)
	}
	root, _ := newRoot(io.Discard, io.Discard, func(string) string { return "" })
	helps := map[string]string{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		helps[c.CommandPath()] = helpOf(c)
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	for path, h := range helps {
		for _, v := range helpVar.FindAllString(h, -1) {
			if !vars[v] {
				t.Errorf("%s --help names %s, which no code reads", path, v)
			}
		}
		if strings.Contains(h, "sk_live_") {
			t.Errorf("%s --help shows a live Stripe key (sk_live_): examples use test mode (sk_test_)", path)
		}
	}
	for path, need := range map[string][]string{
		"paydedup worker":     {"PAYDEDUP_DLQ_KEY", "STRIPE_SECRET_KEY", "DATABASE_URL"},
		"paydedup dlq replay": {"PAYDEDUP_DLQ_KEY"},
		"paydedup audit":      {"STRIPE_SECRET_KEY", "STRIPE_API_BASE", "DATABASE_URL"},
		"paydedup reconcile":  {"STRIPE_SECRET_KEY", "DATABASE_URL"},
	} {
		for _, v := range need {
			if !strings.Contains(helps[path], v) {
				t.Errorf("%s --help does not name %s, which it needs and has no flag", path, v)
			}
		}
	}
	for _, r := range []string{stream.ReasonKeyReused, stream.ReasonMaxDeliveries, stream.ReasonProviderRejected,
		stream.ReasonProviderMismatch, stream.ReasonLedgerConflict} {
		if !strings.Contains(helps["paydedup dlq"], r) {
			t.Errorf("paydedup dlq --help does not name the reason %s", r)
		}
	}
	if h := helps["paydedup status"]; !strings.Contains(h, "pending for more than") {
		t.Errorf("status --help defines stuck otherwise than its output (\"pending for more than\"): %q", h)
	}
}

// The worker's start log says which provider, API base and mode (live or
// test, from the key's prefix) it charges through, never the key.
func TestProviderDescribedAtStart(t *testing.T) {
	for _, tc := range []struct {
		p    providerFlags
		want string
	}{
		{providerFlags{kind: "stripe", secretKey: "sk_live_abc"}, "provider stripe api_base https://api.stripe.com mode live"},
		{providerFlags{kind: "stripe", secretKey: "rk_test_abc", apiBase: "http://127.0.0.1:12111"}, "provider stripe api_base http://127.0.0.1:12111 mode test"},
		{providerFlags{kind: "stripe", secretKey: "whatever"}, "provider stripe api_base https://api.stripe.com mode unknown key prefix"},
		{providerFlags{kind: "sim"}, "provider sim api_base in-process simulator mode sim"},
	} {
		var parts []string
		for _, v := range tc.p.describe() {
			parts = append(parts, v.(string))
		}
		got := strings.Join(parts, " ")
		if got != tc.want {
			t.Errorf("describe(%+v) = %q, want %q", tc.p, got, tc.want)
		}
		if tc.p.secretKey != "" && strings.Contains(got, tc.p.secretKey) {
			t.Errorf("describe logs the key: %q", got)
		}
	}
}
