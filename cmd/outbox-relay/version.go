package main

import (
	"fmt"
	"io"
	"runtime/debug"
)

// libraryPath is the library module whose version the worker reports
// beside its own.
const libraryPath = "github.com/gorm-outbox/outbox"

// buildVersion is what the binary knows of its build: its module version
// (a tag, or a pseudo-version naming the VCS revision; "(devel)" when built
// without version control), the library's version, the VCS revision and
// the Go version. One source for `outbox-relay version`, the startup log
// line and the go_build_info metric's labels.
type buildVersion struct {
	version, library, revision, goVersion string
}

func readBuildVersion() buildVersion {
	v := buildVersion{version: "unknown", library: "unknown", revision: "unknown", goVersion: "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	v.version, v.goVersion = bi.Main.Version, bi.GoVersion
	for _, d := range bi.Deps {
		if d.Path == libraryPath {
			v.library = d.Version
			if d.Replace != nil {
				v.library = d.Replace.Path // a workspace or replace: a directory
			}
		}
	}
	modified := ""
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.revision = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "+dirty"
			}
		}
	}
	if v.revision != "unknown" {
		v.revision += modified
	}
	return v
}

func (v buildVersion) String() string {
	return fmt.Sprintf("outbox-relay %s (library %s, revision %s, %s)", v.version, v.library, v.revision, v.goVersion)
}

// logAttrs are the startup log line's attributes.
func (v buildVersion) logAttrs() []any {
	return []any{"version", v.version, "library_version", v.library, "revision", v.revision, "go_version", v.goVersion}
}

// printVersion is `outbox-relay version` (and -version).
func printVersion(w io.Writer) int {
	fmt.Fprintln(w, readBuildVersion())
	return exitOK
}
