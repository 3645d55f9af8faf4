package main

import (
	"context"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFormatVersion(t *testing.T) {
	vcs := []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "2268add0c0ffee"},
		{Key: "vcs.time", Value: "2025-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "true"}}
	for _, c := range []struct {
		name    string
		stamped string
		info    *debug.BuildInfo
		want    string
	}{
		{"checkout", "dev", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs},
			"(devel), revision 2268add0c0ffee (2025-01-02T03:04:05Z, modified), " + runtime.Version()},
		{"module download", "dev", &debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}},
			"v1.4.0 (no VCS revision stamped), " + runtime.Version()},
		{"image", "v1.4.0-3-g2268add", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}},
			"v1.4.0-3-g2268add (no VCS revision stamped), " + runtime.Version()},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer func(v string) { version = v }(version)
			version = c.stamped
			if got := formatVersion(c.info, true); got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

func TestVersionCommandAndFlag(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, _, err := runCLI(context.Background(), map[string]string{}, args...)
		if err != nil || out != "paydedup "+buildVersion()+"\n" {
			t.Errorf("%v: %q, %v", args, out, err)
		}
	}
	if !strings.Contains(buildVersion(), runtime.Version()) {
		t.Errorf("version %q does not name the Go release", buildVersion())
	}
}
