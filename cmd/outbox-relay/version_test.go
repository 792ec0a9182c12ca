package main

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"testing"
)

// TestVersionNamesTheBuild: `outbox-relay version`, -version and
// --version print one line naming the binary's version, the library's, the
// VCS revision and the Go version, exit 0 and connect to nothing.
func TestVersionNamesTheBuild(t *testing.T) {
	for _, arg := range []string{"version", "-version", "--version"} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), []string{arg}, noEnv, &out, &errOut)
		line := out.String()
		if code != exitOK || errOut.Len() != 0 || strings.Count(line, "\n") != 1 {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q; want 0 and one line", arg, code, line, errOut.String())
		}
		for _, want := range []string{"outbox-relay ", "(library ", "revision ", runtime.Version()} {
			if !strings.Contains(line, want) {
				t.Errorf("%s: %q lacks %q", arg, line, want)
			}
		}
	}
}
