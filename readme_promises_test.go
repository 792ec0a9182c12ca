package outbox_test

// Tests that the README's and the documentation's snippets are the code the
// build compiles. The tests of the write-path behaviour the README promises
// are in internal/tests/outbox/readme_promises_test.go.

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// TestSetupSnippetIsTheSameInTheREADMEThePackageDocAndExampleSetup keeps
// the one setup snippet one: docs/writing.md's (Setup), the package
// documentation's (go doc outbox) and Example_setup's, which compiles and
// runs it, hold the same lines (indentation and alignment aside).
func TestSetupSnippetIsTheSameInTheREADMEThePackageDocAndExampleSetup(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	// between returns the lines of s after the first line containing from
	// (itself after after) up to the first containing to, each with its
	// indentation, a strip prefix and repeated spaces removed.
	between := func(s, after, from, to, strip string) []string {
		_, s, _ = strings.Cut(s, after)
		_, s, ok := strings.Cut(s, from)
		if !ok {
			t.Fatalf("no %q after %q", from, after)
		}
		_, s, _ = strings.Cut(s, "\n")
		s, _, ok = strings.Cut(s, to)
		if !ok {
			t.Fatalf("no %q after %q", to, from)
		}
		var out []string
		for line := range strings.Lines(s) {
			line = strings.TrimPrefix(strings.TrimSpace(line), strip)
			if line = strings.Join(strings.Fields(line), " "); line != "" {
				out = append(out, line)
			}
		}
		return out
	}
	readme := between(read("docs/writing.md"), "\n## Setup\n", "```go", "```", "")
	doc := between(read("outbox.go"), "Package outbox is", "same notifier", "// Then create", "//")
	example := between(read("example_test.go"), "func Example_setup", "setup := func", "return nil\n", "")
	if len(readme) < 5 || !slices.Equal(readme, doc) || !slices.Equal(readme, example) {
		t.Fatalf("the setup snippets differ:\ndocs/writing.md:\n%s\npackage doc:\n%s\nExample_setup:\n%s",
			strings.Join(readme, "\n"), strings.Join(doc, "\n"), strings.Join(example, "\n"))
	}
}

// TestREADMEExampleIsExamplesReadme: the README's example is
// examples/readme/main.go, which the build compiles, character for
// character.
func TestREADMEExampleIsExamplesReadme(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("examples/readme/main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "\n## Example\n\n```go\n")
	block, _, closed := strings.Cut(block, "```")
	if !ok || !closed {
		t.Fatal("README.md has no go block under \"## Example\"")
	}
	if block != string(src) {
		t.Errorf("README.md's example differs from examples/readme/main.go:\nREADME:\n%s\nexamples/readme/main.go:\n%s", block, src)
	}
}
