package main

import "runtime/debug"

// buildVersion is what the binary knows of its build, for `outbox-relay
// version` and the startup log line: its module version (a tag, a
// pseudo-version, or "(devel)"), the library's, the VCS revision and the Go
// version.
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
		if d.Path == "github.com/gorm-outbox/outbox" {
			v.library = d.Version
			if d.Replace != nil {
				v.library = d.Replace.Path // a workspace or replace: a directory
			}
		}
	}
	modified := ""
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision":
			v.revision = s.Value
		case s.Key == "vcs.modified" && s.Value == "true":
			modified = "+dirty"
		}
	}
	if v.revision != "unknown" {
		v.revision += modified
	}
	return v
}

func (v buildVersion) String() string {
	return "outbox-relay " + v.version + " (library " + v.library + ", revision " + v.revision + ", " + v.goVersion + ")"
}

// logAttrs are the startup log line's attributes.
func (v buildVersion) logAttrs() []any {
	return []any{"version", v.version, "library_version", v.library, "revision", v.revision, "go_version", v.goVersion}
}
