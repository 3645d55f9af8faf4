//go:build !nolab

package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// Without River's CLI the comparison stops before running anything and
// says how to get it; bad figures are refused.
func TestBenchCompareNeedsRiver(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "river")
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"bench", "compare", "--river", missing}, []string{"no River CLI", missing, "make bench-compare"}},
		{[]string{"bench", "compare", "--river", "no-such-river-on-path"}, []string{"no-such-river-on-path", "make bench-compare"}},
		{[]string{"bench", "compare", "--payments", "0"}, []string{"--payments and --rounds must be at least 1"}},
		{[]string{"bench", "compare", "--rounds", "0"}, []string{"--payments and --rounds must be at least 1"}},
	} {
		_, _, err := runCLI(context.Background(), map[string]string{}, c.args...)
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v: %v, want it to name %q", c.args, err, w)
			}
		}
	}
}
