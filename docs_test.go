package outbox_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsLinksResolve: every relative link of README.md, CHANGELOG.md, docs/,
// BENCHMARKS.md and CHAOS.md names a file of the repository, and every
// #anchor a heading of its page (GitHub's anchors: lower case, spaces to
// hyphens, punctuation dropped). A guide moved or a heading renamed breaks
// the build, not a reader's click.
func TestDocsLinksResolve(t *testing.T) {
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "README.md", "BENCHMARKS.md", "CHAOS.md", "CHANGELOG.md")
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	anchors := map[string]map[string]bool{}
	headingsOf := func(page string) map[string]bool {
		if a, ok := anchors[page]; ok {
			return a
		}
		b, err := os.ReadFile(page)
		if err != nil {
			return nil
		}
		a := map[string]bool{}
		inCode := false
		for line := range strings.Lines(string(b)) {
			if strings.HasPrefix(line, "```") {
				inCode = !inCode
			}
			if inCode || !strings.HasPrefix(line, "#") {
				continue
			}
			h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
			h = regexp.MustCompile(`[^\p{L}\p{N}_\- ]`).ReplaceAllString(h, "")
			a[strings.ReplaceAll(h, " ", "-")] = true
		}
		anchors[page] = a
		return a
	}
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			if file == "" {
				file = page
			} else {
				file = filepath.Join(filepath.Dir(page), file)
			}
			if _, err := os.Stat(file); err != nil {
				t.Errorf("%s: link %q: no file %s", page, target, file)
				continue
			}
			if anchor != "" && strings.HasSuffix(file, ".md") && !headingsOf(file)[anchor] {
				t.Errorf("%s: link %q: %s has no heading #%s", page, target, file, anchor)
			}
		}
	}
}

// TestDocsGoBlocksAreCompiledCode: every go code block of README.md and
// docs/ is a piece of compiled code: its lines appear, in order and at one
// indentation, in a .go file of the repository (the README's example is
// examples/readme/main.go; the guides' blocks are the bodies of functions
// in files named docs_snippets_test.go next to the packages they show, and
// examples/customstore's TestConformance). CI builds and vets every such
// file, so a snippet that stops compiling, or a block edited without its
// code, fails.
func TestDocsGoBlocksAreCompiledCode(t *testing.T) {
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "README.md")
	var sources []string
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			sources = append(sources, string(b))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// at indents the block's lines by n tabs (empty lines stay empty).
	at := func(block string, n int) string {
		var out strings.Builder
		for line := range strings.Lines(block) {
			if strings.TrimSpace(line) != "" {
				out.WriteString(strings.Repeat("\t", n))
			}
			out.WriteString(line)
		}
		return out.String()
	}
	compiled := func(block string) bool {
		for n := range 4 {
			want := at(block, n)
			for _, src := range sources {
				if strings.Contains(src, want) {
					return true
				}
			}
		}
		return false
	}
	block := regexp.MustCompile("(?s)```go\n(.*?)```")
	blocks := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range block.FindAllStringSubmatch(string(b), -1) {
			blocks++
			if !compiled(m[1]) {
				t.Errorf("%s: a go block is not in any .go file of the repository (put it in the docs_snippets_test.go of its package, verbatim):\n%s", page, m[1])
			}
		}
	}
	if blocks < 10 {
		t.Errorf("found %d go blocks; the pattern lost them", blocks)
	}
}

// TestEveryTaggedModuleCarriesTheLicence: every module that is tagged (each
// go.mod but internal/tests') holds LICENSE at its root, byte for byte: a
// module's zip holds its own directory only, so without a copy its users
// and the package index would see no licence.
func TestEveryTaggedModuleCarriesTheLicence(t *testing.T) {
	want, err := os.ReadFile("LICENSE")
	if err != nil {
		t.Fatal(err)
	}
	modules := 0
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		dir := filepath.Dir(path)
		if d.Name() != "go.mod" || dir == "." || dir == filepath.Join("internal", "tests") {
			return nil
		}
		modules++
		if got, err := os.ReadFile(filepath.Join(dir, "LICENSE")); err != nil || string(got) != string(want) {
			t.Errorf("%s/LICENSE differs from LICENSE (or is missing: %v): copy it", dir, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if modules < 5 {
		t.Errorf("found %d nested tagged modules; want 5 or more", modules)
	}
}
