package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// buildVersion says which build this is: the version stamped with
// -X main.version (the image's git describe), else the module version (a
// tag when built from a module download, "(devel)" from a checkout); and
// the VCS revision, its time and whether the tree was modified, as the Go
// toolchain stamped them (go build's -buildvcs, on by default in a
// checkout; the image's build context has no .git, so VERSION says it).
func buildVersion() string {
	info, ok := debug.ReadBuildInfo()
	return formatVersion(info, ok)
}

func formatVersion(info *debug.BuildInfo, ok bool) string {
	if !ok {
		return version + " (no build information)"
	}
	v := info.Main.Version
	if version != "dev" || v == "" {
		v = version
	}
	var rev, at, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = ", modified"
			}
		}
	}
	if rev == "" {
		return fmt.Sprintf("%s (no VCS revision stamped), %s", v, runtime.Version())
	}
	return fmt.Sprintf("%s, revision %s (%s%s), %s", v, rev, at, modified, runtime.Version())
}

func newVersionCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version and VCS revision of this build",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintln(a.out, "paydedup", buildVersion())
			return err
		},
	}
}
